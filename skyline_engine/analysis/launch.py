"""Data-parallel analyses started by torch.distributed's own launcher (the elastic launch API behind
`torchrun`, standalone rendezvous on this machine), or joined from under `torchrun`.

Each rank runs analysis/distributed.py; rank 0's document comes back. A rank that fails writes
its error where the launcher's process finds it, then exits: the launcher stops the other ranks
(a collective waiting for a dead rank raises after the process group's timeout), and the error
names the rank that failed first, with the file and line where there is one.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from skyline_engine.analysis.document import AnalysisDocument
from skyline_engine.analysis.rank_exit import exit_failed_rank
from skyline_engine.analysis.session import AnalysisRequest, Progress, no_progress
from skyline_engine.entry.user_frames import user_frame_in_faulthandler_dump
from skyline_engine.errors import SkylineError
from skyline_engine.measure.device import cpu_capacity, resolve_device
from skyline_engine.processes import become_subreaper, kill_descendants
from skyline_engine.units import format_bytes

# How long a collective waits for the other ranks before the analysis fails.
COLLECTIVE_TIMEOUT_S = 120.0
MAX_WORLD_SIZE = 64


# What a rank takes before its model does: a Python process with torch imported and the default
# example's model (about 320 MB measured on this project's 2-core CPU machine).
RANK_MEMORY_BYTES = 320 << 20


def analyze_on_ranks(request: AnalysisRequest, progress: Progress = no_progress) -> AnalysisDocument:
    """The analysis in `request.world_size` processes on this machine; rank 0's document."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if not 2 <= request.world_size <= MAX_WORLD_SIZE:
        raise SkylineError(f"the number of processes must be from 2 to {MAX_WORLD_SIZE}, not {request.world_size}.")
    if request.port:
        _check_port_free(request.port)
    try:
        on_cpu = resolve_device(request.device).type == "cpu"
    except SkylineError:  # a device that is not there: the ranks say so, with the backend they lack
        on_cpu = False
    too_many = ranks_beyond_the_machine(request.world_size, on_cpu, os.cpu_count() or 1, cpu_capacity()[0])
    if too_many is not None:
        raise too_many
    threads = max(1, (os.cpu_count() or 1) // request.world_size)
    with tempfile.TemporaryDirectory(prefix="skyline-ranks-") as folder:
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=request.world_size,
            rdzv_backend="c10d",
            rdzv_endpoint=f"localhost:{request.port or 0}",
            run_id=f"skyline-{uuid.uuid4().hex[:8]}",
            max_restarts=0,
            monitor_interval=0.1,
            logs_specs=DefaultLogsSpecs(log_dir=os.path.join(folder, "logs")),
        )
        progress(f"starting {request.world_size} processes", 0.0)
        watcher = _ProgressWatcher(Path(folder) / "progress", progress)
        try:
            with watcher, _launcher_logs_quiet(), _temporary_files_in(folder):
                results = elastic_launch(config, rank_main)(request, threads, folder)
        except ChildFailedError as exc:
            raise _rank_failure(exc, Path(folder), str(request.project_root)) from None
        except Exception as exc:  # noqa: BLE001 (the rendezvous, before any rank ran: say what it was)
            raise _launch_failure(exc) from None
    document = results.get(0)
    if not isinstance(document, AnalysisDocument):
        raise SkylineError("rank 0 returned no analysis.")
    return document


@contextlib.contextmanager
def _temporary_files_in(folder: str) -> Iterator[None]:
    """The launcher leaves a `pytorch-errorfile-*.pickle` in the temporary folder for each rank
    that fails: made in `folder` instead, they go with it."""
    before = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = before


@contextlib.contextmanager
def _launcher_logs_quiet() -> Iterator[None]:
    """The launcher logs a failed rank's traceback; the analysis reports it as one error instead."""
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def rank_main(request: AnalysisRequest, threads: int | None, folder: str | None) -> AnalysisDocument | None:
    """One rank: `threads` set when Skyline started the ranks (torchrun's ranks keep theirs);
    `folder` receives rank 0's progress and any rank's error."""
    import torch
    import torch.distributed as dist

    from skyline_engine.analysis.distributed import analyze_rank
    from skyline_engine.analysis.script_ranks import script_on_ranks, script_rank
    from skyline_engine.measure.distributed import join_process_group

    if threads is not None:
        torch.set_num_threads(threads)
    if folder:
        # The processes the user's code starts stay below this rank, orphans too (a `sleep 45 &`
        # from os.system), so that they end with it: one holding the rank's inherited output
        # made the launcher wait for it, 54 s for a `sleep 45`.
        become_subreaper()
    rank_number = int(os.environ.get("RANK", "0"))
    if folder:
        # A crash (SIGSEGV in an extension) writes the Python stacks where the failure report
        # reads the user's line from (`_rank_failure`); kept open for the process's life.
        faulthandler.enable(file=open(Path(folder) / f"rank{rank_number}.fault", "w"))  # noqa: SIM115 (open until the process ends)
    progress = _progress_writer(Path(folder) / "progress") if folder and rank_number == 0 else no_progress
    timeout_s = request.collective_timeout_s or COLLECTIVE_TIMEOUT_S
    if folder:
        signal.signal(signal.SIGTERM, _stop_here)
    try:
        script = script_on_ranks(request)
        if script is not None:  # it joins its process group itself
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
            return script_rank(request, script, rank_number, world_size, folder, progress)
        rank = join_process_group(request.device, timeout_s)
        return analyze_rank(request, rank, progress)
    except _StoppedByLauncher as exc:
        if folder:
            _no_more_stops()
            _write_json(Path(folder) / f"rank{rank_number}.json", _hung_error(exc, request, timeout_s))
            kill_descendants(os.getpid())
            exit_failed_rank(waited=False)
        raise SystemExit(1) from None
    except BaseException as exc:
        if folder:
            _no_more_stops()
            error = _error(exc)
            _write_json(Path(folder) / f"rank{rank_number}.json", error)
            kill_descendants(os.getpid())
            exit_failed_rank(waited=_waited(error))
        raise
    finally:
        if folder:  # from here on, being stopped is no news: exit quietly, not with a traceback
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            kill_descendants(os.getpid())
        if dist.is_initialized():
            dist.destroy_process_group()


def _progress_writer(path: Path) -> Progress:
    def progress(phase: str, fraction: float) -> None:
        with path.open("a", encoding="utf-8") as out:
            out.write(json.dumps([phase, fraction]) + "\n")

    return progress


class _ProgressWatcher:
    """Relays rank 0's progress lines to `progress` while the ranks run."""

    def __init__(self, path: Path, progress: Progress) -> None:
        self.path = path
        self.progress = progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rank-progress", daemon=True)
        self._read = 0

    def __enter__(self) -> _ProgressWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            try:
                text = self.path.read_text(encoding="utf-8")
            except OSError:
                continue
            lines = text[self._read :].split("\n")
            complete = lines[:-1]
            self._read += sum(len(line) + 1 for line in complete)
            for line in complete:
                phase, fraction = json.loads(line)
                self.progress(str(phase), float(fraction))


class _StoppedByLauncher(BaseException):
    """The launcher stops the ranks left once one has failed. A BaseException, so that neither the
    user's `except Exception` nor the engine's wrapping of user errors takes it for theirs."""


def _stop_here(signum: int, frame: object) -> None:
    raise _StoppedByLauncher


def _no_more_stops() -> None:
    """A failed rank writing its error: the launcher's stop (it found this rank's failure, or
    another's) is no news now, and must not cut the writing short, nor end the rank with a
    traceback from wherever it lands (it once landed in `kill_descendants`' /proc scan). The rank
    exits by itself once its error is written (rank_exit.py)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _hung_error(exc: BaseException, request: AnalysisRequest, timeout_s: float) -> dict[str, Any]:
    """A rank still running its code when another failed: where it was is what made the others
    wait (a rank that waited in a collective itself is named by its own timeout instead)."""
    from skyline_engine.entry.user_frames import ProjectFiles, innermost_user_frame

    files = ProjectFiles(request.project_root)
    frame = innermost_user_frame(exc.__traceback__, files)
    if frame is None:  # stopped in the engine or in torch (a collective, say): no cause of its own
        return {"message": "stopped by the launcher after another rank failed", "stopped": True}
    return {
        "message": "it was still running your code here when the other ranks gave up waiting for it in a "
        f"collective ({timeout_s:g} s, --collective-timeout).",
        "path": files.relative(frame.filename),
        "line": frame.lineno,
        "hint": None,
        "hung": True,
    }


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, SkylineError):
        return {"message": exc.message, "path": exc.path, "line": exc.line, "hint": exc.hint}
    if isinstance(exc, KeyboardInterrupt):
        return {"message": "interrupted"}
    return {"message": f"{type(exc).__name__}: {_collective_text(exc)}"}


def _write_json(path: Path, error: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the launcher still reports how the process ended
        path.write_text(json.dumps(error), encoding="utf-8")


def _collective_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "timeout" in text.lower() or "timed out" in text.lower():
        return f"{text} (a collective waited for the other ranks past the timeout: another rank hangs or crashed)"
    return text


def ranks_beyond_the_machine(world_size: int, on_cpu: bool, cores: int, available_bytes: int) -> SkylineError | None:
    """Why `world_size` ranks do not fit this machine, or None: on the CPU, each needs a core (with
    more ranks than cores they take turns, and their times would be the machine's, not the
    training's), and every rank needs RANK_MEMORY_BYTES of the memory available."""
    if on_cpu and world_size > cores:
        return SkylineError(
            f"{world_size} ranks on the CPU need a core each, and this machine has {cores}: with more ranks than "
            "cores they take turns, and their times would not be the training's.",
            hint=f"Use --nproc {cores} or fewer, or a GPU per rank.",
        )
    needed = world_size * RANK_MEMORY_BYTES
    if needed > available_bytes:
        return SkylineError(
            f"{world_size} ranks need about {format_bytes(needed)} ({format_bytes(RANK_MEMORY_BYTES)} each: "
            f"torch and a small model), and {format_bytes(available_bytes)} of memory is available.",
            hint="Use fewer ranks (--nproc), or free memory.",
        )
    return None


def _rank_failure(exc: Any, folder: Path, project_root: str) -> SkylineError:
    """The error of the rank that caused the failure, as it wrote it; else how its process ended,
    at the user's line its crash stacks name (faulthandler's, in its fault file)."""
    errors = {}
    for path in folder.glob("rank*.json"):
        with contextlib.suppress(ValueError, OSError):
            errors[int(path.stem[len("rank") :])] = json.loads(path.read_text(encoding="utf-8"))
    ranks = set(errors) | set(exc.failures)
    started = {rank: exc.failures[rank].timestamp for rank in exc.failures}
    cause = min(ranks, key=lambda r: (_blame(errors.get(r)), started.get(r, float("inf")), r))
    written = errors.get(cause)
    if written is not None and _blame(written) != 3:
        return SkylineError(
            f"rank {cause} {'hung' if written.get('hung') else 'failed'}: {written['message']}",
            path=written.get("path"),
            line=written.get("line"),
            hint=written.get("hint"),
        )
    if cause not in exc.failures:  # every rank only waited, and none of them was recorded as failing
        return SkylineError(f"rank {cause} failed: {written['message'] if written else 'for no reason it gave'}")
    code = exc.failures[cause].exitcode
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    crashed_in, crashed_at = _crash_line(folder / f"rank{cause}.fault", project_root)
    where = " while running this line" if crashed_in and crashed_at else ""
    return SkylineError(
        f"rank {cause} {how}{where} without an error of its own"
        + (" (the system may have run out of memory)." if code == -signal.SIGKILL else "."),
        path=crashed_in,
        line=crashed_at,
    )


def _crash_line(fault_file: Path, project_root: str) -> tuple[str | None, int | None]:
    try:
        lines = fault_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None, None
    return user_frame_in_faulthandler_dump(lines, project_root)


def _blame(error: dict[str, Any] | None) -> int:
    """How surely a rank caused the failure, most surely first: it failed by itself; it died without
    a word; it was still running its code while the others waited for it; it waited for another,
    or was stopped outside its code."""
    if error is None:
        return 1
    if error.get("hung"):
        return 2
    return 3 if error.get("stopped") or _waited(error) else 0


def _waited(error: dict[str, Any]) -> bool:
    """A collective that failed because of another rank: past its timeout, or its peer gone."""
    message = str(error.get("message", "")).lower()
    return any(sign in message for sign in ("timeout", "timed out", "closed by peer", "connection reset"))


def _check_port_free(port: int) -> None:
    """The rendezvous would connect to whatever listens there and wait for ever: refuse first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            raise SkylineError(
                f"cannot start the processes: port {port} is already in use.", hint="Choose another --port."
            ) from None


def _launch_failure(exc: BaseException) -> SkylineError:
    return SkylineError(f"cannot start the processes: {type(exc).__name__}: {exc}")
