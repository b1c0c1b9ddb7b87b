"""A data-parallel training script on ranks (`skyline profile train.py --nproc N`): the script sets
up its own process group from the launcher's environment, as under torchrun, and wraps its model
in DistributedDataParallel.

Rank 0 runs the analysis of a script (analysis/script.py) at the user's batch size. Every other
rank runs the script too, paused at its optimizer steps as rank 0's is (measure/script_run.py),
and runs an iteration each time rank 0 does: before each, rank 0 writes a byte to each other
rank's pipe (`follow-<rank>` in the ranks' folder). So every rank runs the same iterations, and
each collective of DDP's (the all-reduce of the gradients in every backward pass) has its peers;
rank 0's pauses to measure hold the others at a step, not in a collective. When rank 0 is done it
closes the pipes, and each rank stops its script at the step where it waits (a rank stopped in a
collective would wait for ever: gloo closes its connections only when the process ends). Other
batch sizes are not measured: each would be a run of the script on every rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

from skyline_engine.analysis.document import AnalysisDocument
from skyline_engine.analysis.script import analyze_script
from skyline_engine.analysis.session import AnalysisRequest, Progress
from skyline_engine.entry.loader import read_source, resolve_entry_path
from skyline_engine.entry.script import is_script, load_training_script
from skyline_engine.errors import EntryPointError
from skyline_engine.measure.script_run import STEP_TIMEOUT_S, ScriptRun

# What rank 0 writes to each other rank's pipe before each of its iterations.
_ITERATION = b"i"


def data_parallel_note(world_size: int) -> str:
    """What a data-parallel script's document says of how it was measured."""
    return (
        f"Data-parallel training over {world_size} processes: rank 0's iterations are measured, DDP's all-reduce of "
        "the gradients included (its wait is untracked time); other batch sizes and the scaling to more processes "
        "are not measured for a training script: profile the script on one process for the batch-size models."
    )


def script_on_ranks(request: AnalysisRequest) -> Path | None:
    """The training script `request` names, where it is one (an entry point's ranks run its
    iteration under DDP: analysis/distributed.py); None for an entry point or an unreadable file
    (whose error the entry-point loader gives)."""
    root = Path(request.project_root).resolve()
    try:
        path = resolve_entry_path(request.entry_point, root, request.base_dir)
        script = is_script(read_source(path, str(path.relative_to(root))))
    except (EntryPointError, ValueError):
        return None
    return path if script else None


def script_rank(
    request: AnalysisRequest, path: Path, rank: int, world_size: int, folder: str | None, progress: Progress
) -> AnalysisDocument | None:
    """This rank's part: rank 0's document, None on the others."""
    if folder is None:
        raise EntryPointError(
            f"{request.entry_point} is a training script: under torchrun, Skyline cannot keep the other ranks' "
            "iterations in step with rank 0's.",
            hint="Start the ranks with `skyline profile SCRIPT --nproc N` instead of torchrun.",
        )
    root = Path(request.project_root).resolve()
    pipes = [Path(folder) / f"follow-{other}" for other in range(1, world_size)]
    if rank != 0:
        _follow(request, path, root, pipes[rank - 1])
        return None
    with _Followers(pipes) as followers:
        document = analyze_script(
            request.budget,
            path,
            root,
            script_args=tuple(request.script_args),
            batch_size=request.batch_size,
            write_batch_size=request.write_batch_size,
            step_timeout_s=request.step_timeout_s,
            timeline=request.timeline,
            memory_capacity_bytes=request.memory_capacity_bytes,
            predict=False,
            progress=progress,
            on_iteration=followers.iteration,
        )
    note = data_parallel_note(world_size)
    return dataclasses.replace(document, warnings=[*document.warnings, note], models_withheld=note)


class _Followers:
    """Rank 0's ends of the other ranks' pipes (each rank makes its own as it starts)."""

    def __init__(self, pipes: list[Path]) -> None:
        self.paths = pipes
        self.ends: list[int] = []

    def __enter__(self) -> _Followers:
        for path in self.paths:
            while not path.exists():  # a rank that fails to start is stopped, and this one with it, by the launcher
                time.sleep(0.01)
            self.ends.append(os.open(path, os.O_WRONLY))  # once that rank opened it to read
        return self

    def __exit__(self, *exc: object) -> None:
        for end in self.ends:  # the other ranks read the end: they stop their scripts
            os.close(end)

    def iteration(self) -> None:
        for end in self.ends:
            # A rank that died cannot read: this rank waits in its next collective, and the launcher
            # stops it and reports the one that died.
            with contextlib.suppress(OSError):
                os.write(end, _ITERATION)


def _follow(request: AnalysisRequest, path: Path, root: Path, pipe: Path) -> None:
    """The script run an iteration at a time, each when rank 0 runs one, until rank 0 is done."""
    script = load_training_script(path, root, tuple(request.script_args), request.batch_size)
    os.mkfifo(pipe)
    end = os.open(pipe, os.O_RDONLY)  # once rank 0 opened it to write
    try:
        with ScriptRun(script, request.step_timeout_s or STEP_TIMEOUT_S) as run:
            while os.read(end, 1) == _ITERATION:
                run.iteration()
    finally:
        os.close(end)
