"""The analysis worker's own program: a process that runs one analysis of the user's code, then
exits. The service's side of it, which starts and follows these processes, is worker_pool.py.

Run by the service as `python -m skyline_engine.service.worker_main` (never by people). Its life:

1. start   apply the memory limit, import torch, find the device; send `ready`. The service keeps
           one worker here, warm, so an analysis does not wait for torch to import.
2. wait    read one job (a msgpack map) from stdin.
3. run     send `started`, then `progress` and `partial` messages, then `result` or `error`.
4. exit    `os._exit` straight after the last message, so threads the user's code started cannot
           keep the process alive; before it, every process the code started is killed.

The worker is a child subreaper (processes.py): processes the user's code starts stay below it,
even in a session of their own or once their parent has ended, so they can all be found and
ended with the analysis (here, or by the service when it kills the worker).

Everything the user's code does happens here and nowhere else: when it crashes, loops or eats the
memory, the service sees this process end (or kills it) and reports why.

Messages go to the service on the *original* stdout; fd 1 itself is pointed at stderr before
anything else runs, so prints of the user's code (and of C libraries) land in the log instead of
corrupting the message stream. When stdin closes (the service is gone), the worker exits.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import faulthandler
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from skyline_engine.processes import become_subreaper, kill_descendants
from skyline_engine.service.failures import Failure

if TYPE_CHECKING:
    from skyline_engine.analysis.document import AnalysisDocument, DocumentDict
    from skyline_engine.analysis.known_memory import KnownMemory
    from skyline_engine.errors import SkylineError


class Channel:
    """Messages to the service on a private duplicate of the original stdout."""

    def __init__(self) -> None:
        self.fd = os.dup(1)
        os.dup2(2, 1)
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = msgpack.packb(message, use_bin_type=True)
        with self._lock:
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    become_subreaper()  # before any code of the user's runs
    channel = Channel()
    faulthandler.enable(file=sys.stderr)  # a segfault prints the Python stacks to the log
    # The service sends SIGUSR1 before stopping a worker past its time limit: the stacks say
    # which line of the user's code it was stuck in.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    _volunteer_for_the_oom_killer()
    startup_error = None
    engines_modules: set[str] = set()
    try:
        _limit_memory(args.memory_limit)
        device, engines_modules = _warm_up(args.device, [name for name in args.import_ahead.split(",") if name])
        channel.send({"type": "ready", "pid": os.getpid(), "device": device, "error": None})
    except BaseException as exc:  # noqa: BLE001 - whatever stops the start is reported, not raised
        startup_error = _startup_failure(exc)
        channel.send({"type": "ready", "pid": os.getpid(), "device": None, "error": startup_error.to_dict()})
    job = _read_job()
    if job is None:
        os._exit(0)  # the service is gone, or it stopped its spare worker
    _exit_when_stdin_closes()
    channel.send({"type": "started", "pid": os.getpid()})
    if startup_error is not None:
        _finish(channel, {"type": "error", **startup_error.to_dict()})
    try:
        environ = dict(os.environ)
        document, known_memory = _analyze(job, channel, limited=args.memory_limit is not None)
        imports = _imports_to_pass_on(engines_modules, environ)
        message = {"type": "result", "document": document, "imports": imports, "known_memory": known_memory}
    except BaseException as exc:  # noqa: BLE001 - whatever ends the analysis is reported, not raised
        failure = describe_failure(exc, "running the analysis", project_root=job.get("project_root"))
        message = {"type": "error", **failure.to_dict()}
    _finish(channel, message)


def _startup_failure(exc: BaseException) -> Failure:
    failure = describe_failure(exc, "starting the analysis worker")
    if failure.kind != "internal":
        return failure
    # A broken installation or a tight limit, rather than a bug.
    message = f"the analysis worker could not start: {type(exc).__name__}: {exc}."
    limit = _memory_limit()
    if limit is not None:
        message += (
            f" Its memory limit ({limit / 2**30:.1f} GiB, from --worker-memory-limit or inherited) "
            "may be too small for torch."
        )
    return Failure("worker_start", message)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m skyline_engine.service.worker_main")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--memory-limit", type=int, default=None, help="RLIMIT_AS in bytes")
    parser.add_argument(
        "--import-ahead", default="", help="modules to import while waiting, comma-separated (the last analysis's)"
    )
    return parser


def _finish(channel: Channel, message: dict[str, Any]) -> None:
    try:
        channel.send(message)
    except MemoryError:
        channel.send(
            {"type": "error", **Failure("out_of_memory", "out of memory while sending the results.").to_dict()}
        )
    sys.stderr.flush()
    _exit()


def _exit() -> None:
    """End the worker and every process the user's code started."""
    kill_descendants(os.getpid())
    os._exit(0)


def _volunteer_for_the_oom_killer() -> None:
    # When the machine runs out of memory, the kernel should kill this worker, not the service
    # or the user's editor. Raising one's own score needs no privilege.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _limit_memory(limit: int | None) -> None:
    if limit is None:
        return
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _warm_up(device_spec: str, ahead: list[str]) -> tuple[dict[str, Any], set[str]]:
    """Import what every analysis needs, and the installed libraries the last analysis of this
    project imported (`ahead`); the device analyses will run on, described, and the modules the
    engine imported (those imported ahead are passed on again, as the user's code imports them)."""
    from skyline_engine.measure.frozen_imports import imported_and_frozen

    with imported_and_frozen(collect=True):  # this worker runs one analysis, then ends
        import torch  # the point of a warm worker
        import torch._dynamo  # noqa: F401 - creating any torch optimizer imports it: 1.1 s on 2 cores

        import skyline_engine.analysis.session  # noqa: F401 - the engine, ready for the job
        from skyline_engine.measure.device import describe_device, resolve_device
        from skyline_engine.measure.import_ahead import import_ahead

        device = describe_device(resolve_device(device_spec)).to_dict()
        engines = set(sys.modules)
        if ahead:
            import_ahead(ahead, Path.cwd())  # the worker runs in the project root
    return device, engines


def _imports_to_pass_on(engines: set[str], environ: dict[str, str]) -> list[str]:
    """The installed modules this worker has beyond the engine's (`engines`), for the next worker
    to import ahead; none where the user's code changed the environment (it may configure a
    library before importing it: measure/import_ahead.py)."""
    from skyline_engine.measure.import_ahead import third_party_imports

    return third_party_imports(engines, Path.cwd()) if dict(os.environ) == environ else []


def _read_job() -> dict[str, Any] | None:
    """The one job, read straight from fd 0 (no buffered reader, which could read past it)."""
    unpacker = msgpack.Unpacker(raw=False)
    while True:
        data = os.read(0, 65536)
        if not data:
            return None
        unpacker.feed(data)
        try:
            for job in unpacker:
                return job if isinstance(job, dict) else None
        except ValueError:
            return None


def _exit_when_stdin_closes() -> None:
    def watch() -> None:
        while True:
            try:
                if not os.read(0, 4096):
                    break
            except OSError:
                break
        _exit()

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


def _analyze(job: dict[str, Any], channel: Channel, limited: bool) -> tuple[DocumentDict, dict[str, Any] | None]:
    """The analysis's document, and what it measured of the memory for the next analysis (the
    job's `known_memory` is the last one's: analysis/known_memory.py)."""
    from skyline_engine.analysis.known_memory import KnownMemory
    from skyline_engine.analysis.session import AnalysisRequest, analyze
    from skyline_engine.measure.timing import TimingBudget

    request = AnalysisRequest(
        entry_point=job["entry_point"],
        project_root=Path(job["project_root"]),
        batch_size=job.get("batch_size"),
        memory_capacity_bytes=job.get("memory_capacity_bytes"),
        world_size=job.get("world_size") or 1,
        script_args=tuple(job.get("script_args") or ()),
        device=job.get("device", "auto"),
        budget=dataclasses.replace(TimingBudget(), **job.get("budget", {})),
        memory_limit_source="--worker-memory-limit" if limited else "inherited by the worker",
        known_memory=KnownMemory.from_dict(job.get("known_memory")),
    )
    remembered: list[KnownMemory] = []

    def progress(phase: str, fraction: float) -> None:
        channel.send({"type": "progress", "phase": phase, "fraction": float(fraction)})

    def partial(document: AnalysisDocument) -> None:
        channel.send({"type": "partial", "document": document.to_dict()})

    document = analyze(request, progress=progress, partial=partial, remember=remembered.append).to_dict()
    return document, handed_on(remembered[-1]) if remembered else None


# What a result's `known_memory` may take of the message (msgpack bytes): a quarter of what the
# service reads of one (worker_pool.MAX_WORKER_MESSAGE_BYTES, 16 MiB), so that the document always
# fits beside it. The small GPT's, three batch sizes of 1,004 operations, took 59 KiB.
MAX_KNOWN_MEMORY_BYTES = 4 << 20


def handed_on(known: KnownMemory) -> dict[str, Any] | None:
    """`known` as the result hands it on; None where it is too large to (the next analysis then
    measures everything)."""
    data = known.to_dict()
    return data if len(msgpack.packb(data, use_bin_type=True)) <= MAX_KNOWN_MEMORY_BYTES else None


def describe_failure(exc: BaseException, doing: str, project_root: str | None = None) -> Failure:
    """What an exception that ended the work means for the user; `project_root` tells the user's
    frames from the engine's."""
    from skyline_engine.errors import EntryPointError, OutOfMemory, SkylineError, UserCodeError

    if isinstance(exc, SkylineError):
        message = exc.format()
        if isinstance(exc, OutOfMemory):
            kind = "out_of_memory"
        elif _caused_by_out_of_memory(exc):
            kind = "out_of_memory"
            message = _with_prefix(exc, "out of memory: ")
        elif isinstance(exc, EntryPointError):
            kind = "entry_point"
        elif isinstance(exc, UserCodeError):
            kind = "user_code"
        else:
            kind = "error"
        if kind == "out_of_memory" and "--worker-memory-limit" not in message:
            message += _memory_limit_note()
        return Failure(kind, message, exc.path, exc.line)
    if isinstance(exc, KeyboardInterrupt):
        return _interrupted_by_user_code(exc, project_root)
    if isinstance(exc, MemoryError):
        return Failure("out_of_memory", f"out of memory (MemoryError) while {doing}." + _memory_limit_note())
    if isinstance(exc, SystemExit):
        return Failure("user_code", f"the code called sys.exit({exc.code!r}) while {doing}.")
    return Failure(
        "internal",
        f"internal error while {doing}: {type(exc).__name__}: {exc}",
        details="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )


def _interrupted_by_user_code(exc: KeyboardInterrupt, project_root: str | None) -> Failure:
    """A KeyboardInterrupt here is raised by the user's code (or a library it calls), not by a
    terminal: the worker runs in a session of its own, which no Ctrl-C reaches."""
    from skyline_engine.entry.loader import user_code_error
    from skyline_engine.entry.user_frames import ProjectFiles

    if project_root is None:
        return Failure("user_code", f"the code raised {type(exc).__name__}.")
    error = user_code_error(ProjectFiles(project_root), "the analysis", exc)
    return Failure("user_code", error.format(), error.path, error.line)


def _with_prefix(exc: SkylineError, prefix: str) -> str:
    """`exc.format()` with `prefix` after its `path:line: `."""
    changed = copy.copy(exc)
    changed.message = prefix + exc.message
    return changed.format()


def _memory_limit() -> int | None:
    """The address-space limit set by --memory-limit (read back from the process), or None."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def _memory_limit_note() -> str:
    limit = _memory_limit()
    if limit is None:
        return ""
    return f"\n(This worker's memory limit is {limit / 2**30:.1f} GiB, from --worker-memory-limit or inherited.)"


def _caused_by_out_of_memory(exc: BaseException) -> bool:
    from skyline_engine.measure.memory import is_out_of_memory

    seen = set()
    cause: Any = exc.__cause__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if is_out_of_memory(cause):
            return True
        cause = cause.__cause__
    return False


if __name__ == "__main__":
    main()
