"""The `skyline` command line: the same analysis as the editor's, without an editor."""

from __future__ import annotations

import argparse
import gc
import os
import sqlite3
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from skyline_engine import __version__
from skyline_engine.analysis.document import DocumentDict  # its shape alone: no torch
from skyline_engine.analysis.rank_exit import exit_without_finalizing
from skyline_engine.cli.arguments import DEVICE_HELP, SETTLE_RUNTIME_HELP, parse_size, positive_float, positive_int
from skyline_engine.cli.progress import Progress
from skyline_engine.entry.project_root import default_project_root
from skyline_engine.errors import SkylineError
from skyline_engine.measure.frozen_imports import imported_and_frozen
from skyline_engine.measure.runtime import settle_runtime
from skyline_engine.processes import become_subreaper, kill_descendants

if TYPE_CHECKING:  # torch is imported only once an analysis starts (a second or two)
    from skyline_engine.analysis.document import AnalysisDocument
    from skyline_engine.analysis.session import AnalysisRequest

BATCH_SIZE = positive_int("the batch size")

EXIT_ANALYSIS_ERROR = 1

# A file the analysis may write: (its path, None when not asked for; the option naming it; the writer).
Output = tuple[Optional[str], str, Callable[[str, DocumentDict], None]]


def main(argv: list[str] | None = None, *, process_ends: bool = False) -> int:
    """`process_ends`: the process ends with this command (the program, `run`), so what it imports
    may stay in the collector's permanent generation for good (measure/memory.py, `freeze_imports`);
    a process that goes on (a test calling this) must get its objects back."""
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # What follows the first `--` is the training script's own (argparse would match options there).
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.process_ends = process_ends
    if split < len(argv):
        if args.command == "serve":
            parser.error("`serve` takes no script arguments after `--`")
        args.script_args = argv[split + 1 :]
    if getattr(args, "settle_runtime", False):
        settle_runtime(os.environ)  # before torch is imported (measure/runtime.py)
    try:
        code: int = args.run(args)  # the command's `_run_…` function, set by `set_defaults`
        return code
    except SkylineError as exc:
        print(f"skyline: error: {exc.format()}", file=sys.stderr)
        return EXIT_ANALYSIS_ERROR
    except KeyboardInterrupt as exc:
        where = _interrupted_at(exc, args)
        print(f"skyline: interrupted{f' at {where}' if where else ''}", file=sys.stderr)
        return 130


def _interrupted_at(exc: KeyboardInterrupt, args: argparse.Namespace) -> str | None:
    """The user's line that was running when the interrupt came (Ctrl-C) or that raised it; None
    outside their code, or for a command without a project (`serve`)."""
    from skyline_engine.entry.user_frames import ProjectFiles, innermost_user_frame

    if not getattr(args, "entry_point", None):
        return None
    try:
        files = ProjectFiles(_project_root(args, Path.cwd()))
    except (OSError, SkylineError):
        return None
    frame = innermost_user_frame(exc.__traceback__, files)
    return f"{files.relative(frame.filename)}:{frame.lineno}" if frame else None


def run() -> None:
    """The program: `skyline` and `python -m skyline_engine`."""
    become_subreaper()  # what the user's code starts stays below this process, even when it leaves
    code = main(process_ends=True)
    if launched_by_torchrun(os.environ):
        exit_without_finalizing(code)
    # The analysis is over: what the user's code started ends with it (a `sleep 3001` it started
    # held the command's output pipes after it exited), and a thread it left running (not a
    # daemon) would keep the interpreter's exit waiting for ever.
    kill_descendants(os.getpid())
    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()):
        exit_without_finalizing(code)
    # Everything alive now goes to the collector's permanent generation, which the interpreter's
    # last collection at exit skips: with torch and its compiler loaded, exiting took 0.9 s, a
    # third of a cold `skyline profile` of the default example. Outputs are written and closed by
    # now; streams are flushed by the interpreter as usual.
    gc.freeze()
    raise SystemExit(code)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skyline", description="Profile PyTorch training iterations.")
    parser.add_argument("--version", action="version", version=f"skyline {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    profile = commands.add_parser(
        "profile",
        help="analyze a training script or an entry point: throughput, peak memory and batch-size predictions",
        description="Analyze a training script (run as `python SCRIPT arguments` would, stopped once measured) "
        "or a Skyline entry point, and print a report.",
        usage="skyline profile [options] SCRIPT|ENTRY [-- SCRIPT ARGUMENTS]",
    )
    profile.add_argument(
        "entry_point",
        metavar="SCRIPT|ENTRY",
        help="the training script, or the entry point file (relative to the working directory)",
    )
    profile.set_defaults(script_args=[])  # what follows `--` (see `main`): the script's own arguments
    profile.add_argument(
        "--batch-size",
        type=BATCH_SIZE,
        help="profile at this batch size instead of the default (a training script: its literal set in memory)",
    )
    profile.add_argument(
        "--set-batch-size",
        type=BATCH_SIZE,
        metavar="N",
        help="rewrite the batch size's literal to N and profile at N (an entry point's batch_size default, "
        "first; a training script's literal once its model got batches of N)",
    )
    profile.add_argument(
        "--memory-capacity",
        type=parse_size,
        metavar="SIZE",
        help="plan for a device with this much memory, e.g. 24GiB, 80GB or 512MiB (default: what the "
        "analysis device has available)",
    )
    profile.add_argument(
        "--nproc",
        type=positive_int("the number of processes", at_most=64),
        metavar="N",
        help="analyze DistributedDataParallel training in N processes on this machine (gloo on the CPU, "
        "NCCL with one GPU each); under torchrun, each process joins torchrun's group instead",
    )
    profile.add_argument(
        "--interconnect-gbps",
        type=positive_float("the interconnect's bandwidth", at_least=0.001, at_most=100_000),
        metavar="X",
        help="plan the data-parallel scaling for a link of X Gbit/s instead of the one measured",
    )
    profile.add_argument(
        "--port",
        type=positive_int("the port", at_most=65535),
        help="the rendezvous port of --nproc (default: a free one)",
    )
    profile.add_argument(
        "--collective-timeout",
        type=positive_float("the collective timeout", at_least=1, at_most=86_400),
        metavar="S",
        help="data-parallel: how long a rank waits for the others in a collective before the analysis "
        "fails, naming the rank that did not come (default 120)",
    )
    _add_common_options(profile)
    profile.add_argument("--json", metavar="PATH", help="also write the analysis document as JSON")
    profile.add_argument("--trace", metavar="PATH", help="also write a Chrome trace of one iteration (Perfetto)")
    profile.set_defaults(run=_run_profile)

    for name, what in (("time", "run time"), ("memory", "memory")):
        report = commands.add_parser(
            name,
            help=f"write Skyline's {what} report (SQLite) of one iteration's breakdown",
            description=f"Break one training iteration down and write Skyline's {what} report, a SQLite file "
            "in Skyline's documented schema (docs/reports.md).",
        )
        report.add_argument(
            "entry_point", metavar="SCRIPT|ENTRY", help="the training script (its arguments after `--`) or entry point"
        )
        report.add_argument("-o", "--output", required=True, metavar="FILE.sqlite", help="the report to write")
        report.add_argument("--batch-size", type=BATCH_SIZE, help="break down at this batch size")
        _add_common_options(report)
        report.set_defaults(run=_run_report, script_args=[])

    from skyline_engine.cli.serve import add_serve_command  # the editor's way in (docs/protocol.md)

    add_serve_command(commands)
    return parser


def _add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument(
        "--project-root",
        default=None,
        help=(
            "the project's root folder (default: the working directory, or for an entry point outside it the "
            "nearest folder above it with .git, pyproject.toml, setup.py or setup.cfg, else its own folder); "
            "results name files relative to it"
        ),
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--step-timeout",
        type=positive_float("the step timeout", at_least=1, at_most=86_400),
        metavar="S",
        help="a training script: how long it may run without an optimizer step before it is stopped, naming "
        "the line it was running (default 300)",
    )
    parser.add_argument("--settle-runtime", action="store_true", help=SETTLE_RUNTIME_HELP)


def _run_profile(args: argparse.Namespace) -> int:
    from skyline_engine.cli.screen import report_width
    from skyline_engine.render.files import write_json_atomic
    from skyline_engine.render.trace import write_chrome_trace

    cwd = Path.cwd()
    batch_size, write_script = args.batch_size, False
    if args.set_batch_size is not None:
        if batch_size is not None and batch_size != args.set_batch_size:
            raise SkylineError("--batch-size and --set-batch-size disagree; give one of them.")
        batch_size = args.set_batch_size
        # An entry point's literal is rewritten now; a script's once its model showed that the literal
        # is its batch size (found by its kind alone, it may be another loader's).
        write_script = not _set_entry_point_batch_size(args.entry_point, _project_root(args, cwd), cwd, batch_size)
    outputs = [(args.json, "--json", write_json_atomic), (args.trace, "--trace", write_chrome_trace)]
    if launched_by_torchrun(os.environ):
        return _run_profile_as_rank(args, cwd, batch_size, outputs)
    document = _analyze(
        args, cwd, batch_size, outputs, predict=True, timeline=bool(args.trace), write_batch_size=write_script
    )
    from skyline_engine.render.terminal import render_report  # imports torch: after the progress says so

    sys.stdout.write(render_report(document, report_width(sys.stdout)))
    return 0


def launched_by_torchrun(environ: Mapping[str, str]) -> bool:
    """torchrun tells each process its rank in these variables."""
    return "RANK" in environ and "WORLD_SIZE" in environ


def _run_profile_as_rank(args: argparse.Namespace, cwd: Path, batch_size: int | None, outputs: Sequence[Output]) -> int:
    """Under torchrun: this process is one rank of torchrun's group; rank 0 reports."""
    from skyline_engine.analysis.launch import rank_main
    from skyline_engine.cli.screen import report_width
    from skyline_engine.render.terminal import render_report

    if args.nproc is not None:
        raise SkylineError("--nproc starts processes itself; under torchrun, leave it out (torchrun started them).")
    rank = int(os.environ["RANK"])
    wanted = [(path, option, write) for path, option, write in outputs if path] if rank == 0 else []
    for path, option, _ in wanted:
        _check_output_path(cwd / path, path, option)
    result = rank_main(_request(args, cwd, batch_size, predict=False, timeline=bool(args.trace)), None, None)
    if result is None:
        return 0
    document = result.to_dict()
    _write_outputs(wanted, document, cwd)
    sys.stdout.write(render_report(document, report_width(sys.stdout)))
    return 0


def _run_report(args: argparse.Namespace) -> int:
    from skyline_engine.cli.screen import report_width
    from skyline_engine.render.sqlite_report import write_memory_report, write_run_time_report

    write = write_run_time_report if args.command == "time" else write_memory_report
    document = _analyze(args, Path.cwd(), args.batch_size, [(args.output, "--output", write)], predict=False)
    from skyline_engine.render.terminal import render_warnings  # imports torch: after the progress says so

    if not args.quiet:
        print(f"skyline: wrote {args.output}", file=sys.stderr)
    # The file's schema has no place for them, and a leak or a distorted breakdown changes what it means.
    warnings = render_warnings(document, report_width(sys.stderr))
    if warnings:
        print(warnings, file=sys.stderr)
    return 0


def _project_root(args: argparse.Namespace, cwd: Path) -> Path:
    return Path(args.project_root) if args.project_root else default_project_root(args.entry_point, cwd)


def _analyze(
    args: argparse.Namespace,
    cwd: Path,
    batch_size: int | None,
    outputs: Sequence[Output],
    predict: bool,
    timeline: bool = False,
    write_batch_size: bool = False,
) -> DocumentDict:
    """Run the analysis, then write each (path, option, writer) output whose path was given.
    Paths are checked first: an error after a long analysis would waste it. `write_batch_size`:
    a training script's literal is written once the analysis has checked it (--set-batch-size)."""
    # Resolved now: user code that changes directory (`os.chdir` in a provider) moves nothing.
    wanted = [(path, option, write) for path, option, write in outputs if path]
    for path, option, _ in wanted:
        _check_output_path(cwd / path, path, option)
    progress = Progress(sys.stderr, enabled=not args.quiet)
    try:
        progress("loading PyTorch", 0.0)  # a second or two on a cold start: say so at once
        analyze = _import_the_analysis(args.process_ends)
        document = analyze(_request(args, cwd, batch_size, predict, timeline, write_batch_size), progress).to_dict()
    finally:
        progress.finish()
    _write_outputs(wanted, document, cwd)
    return document


def _import_the_analysis(process_ends: bool) -> Callable[..., AnalysisDocument]:
    """The analysis, torch with it. Where the process ends with this analysis, torch, its compiler
    (creating any optimizer imports it; the service's workers import it ahead too) and the engine
    are imported with the collector off, then frozen before the user's code runs
    (measure/frozen_imports.py), without the collection the worker makes while it waits: the
    analysis would wait for it."""
    if not process_ends:
        from skyline_engine.analysis.session import analyze

        return analyze
    with imported_and_frozen(collect=False):
        import torch._dynamo  # noqa: F401

        from skyline_engine.analysis.session import analyze
    return analyze


def _write_outputs(wanted: Sequence[Output], document: DocumentDict, cwd: Path) -> None:
    for path, option, write in wanted:
        assert path is not None
        try:
            write(str(cwd / path), document)
        except OSError as exc:
            raise SkylineError(f"cannot write {option} {path!r}: {exc.strerror or exc}.") from None
        except sqlite3.Error as exc:  # an SQLite report on a full disk: "database or disk is full"
            raise SkylineError(f"cannot write {option} {path!r}: {exc}.") from None


def _request(
    args: argparse.Namespace,
    cwd: Path,
    batch_size: int | None,
    predict: bool,
    timeline: bool,
    write_batch_size: bool = False,
) -> AnalysisRequest:
    from skyline_engine.analysis.session import AnalysisRequest

    return AnalysisRequest(
        args.entry_point,
        _project_root(args, cwd),
        batch_size=batch_size,
        device=args.device,
        base_dir=cwd,
        predict=predict,
        timeline=timeline,
        memory_capacity_bytes=getattr(args, "memory_capacity", None),
        world_size=getattr(args, "nproc", None) or 1,
        interconnect_gbps=getattr(args, "interconnect_gbps", None),
        port=getattr(args, "port", None),
        collective_timeout_s=getattr(args, "collective_timeout", None),
        script_args=tuple(getattr(args, "script_args", None) or ()),
        step_timeout_s=getattr(args, "step_timeout", None),
        write_batch_size=write_batch_size,
    )


def _check_output_path(target: Path, path: str, option: str) -> None:
    """That `target` (`path` as given, resolved) can be written, before the analysis starts."""
    if option == "--output" and target.exists() and not target.is_file():
        # An SQLite report is a database file: no device or FIFO can hold one (the JSON and the
        # trace are written through to them, render/files.py).
        raise SkylineError(f"cannot write {option} {path!r}: it is not a regular file.", hint="Give a file name.")
    if target.is_dir():
        raise SkylineError(f"cannot write {option} {path!r}: it is a folder.", hint="Give a file name.")
    if not target.parent.is_dir():
        raise SkylineError(
            f"cannot write {option} {path!r}: the folder {str(target.parent)!r} does not exist.",
            hint="Create it first, or write the file elsewhere.",
        )


def _set_entry_point_batch_size(entry: str, root: Path, cwd: Path, batch_size: int) -> bool:
    """Rewrite the batch size's literal in `entry` where it is an entry point; whether it is (a
    training script's is left to the analysis: AnalysisRequest.write_batch_size)."""
    from skyline_engine.entry.loader import read_source, resolve_entry_path
    from skyline_engine.entry.rewrite import set_batch_size_default
    from skyline_engine.entry.script import is_script

    path = resolve_entry_path(entry, root, cwd)
    if is_script(read_source(path, str(path.relative_to(root.resolve())))):
        return False
    set_batch_size_default(path, root.resolve(), batch_size)
    return True
