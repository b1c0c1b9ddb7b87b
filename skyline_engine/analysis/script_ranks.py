"""A data-parallel training script on ranks (`skyline profile train.py --nproc N`): the script sets
up its own process group from the launcher's environment, as under torchrun, and wraps its model
in DistributedDataParallel.

Rank 0 runs the analysis of a script (analysis/script.py): the user's batch size, then each other
batch size in a run of its own. Every other rank runs the same runs of the script, paused at its
optimizer steps as rank 0's is (measure/script_run.py), and an iteration each time rank 0 runs
one: rank 0 writes each run's start (with its batch size), each iteration and each run's end to
every other rank's pipe (`follow-<rank>` in the ranks' folder). So every rank runs the same
iterations, each collective of DDP's (the all-reduce of the gradients in every backward pass) has
its peers, and rank 0's pauses to measure hold the others at a step, never inside a collective (a
rank stopped in one would wait for ever: gloo closes its connections only when its process ends).
Each run's process group is destroyed when the run ends, so that the next run joins its own; from
the second run on, through a store of its own, which the script's rank 0 serves on a free port
that rank 0 sends with the run's start (`MASTER_PORT`, with `TORCHELASTIC_USE_AGENT_STORE=False`,
set for those runs alone: the launcher's store keeps the first run's keys, and a second group
read them and tried to connect to the first one's ranks). When rank 0 is done it closes the
pipes, and every rank ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from skyline_engine.analysis.document import AnalysisDocument
from skyline_engine.analysis.session import AnalysisRequest, Progress, analyze_script_request
from skyline_engine.entry.loader import read_source, resolve_entry_path
from skyline_engine.entry.script import is_script, load_training_script
from skyline_engine.errors import EntryPointError, SkylineError
from skyline_engine.measure.script_run import STEP_TIMEOUT_S, ScriptRun

# What rank 0 writes to the other ranks' pipes: a run starts (then its batch size, -1 for the
# script's own, and its store's port, 0 for the launcher's), an iteration, the run ends.
_RUN, _ITERATION, _END = b"r", b"i", b"e"
_RUN_HEADER = struct.Struct("<qi")
# What a run's own store changes in the environment the script reads (restored at the end).
_STORE_VARIABLES = ("MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")
# How long a rank whose iteration failed waits for rank 0 to end that run too (its iteration failed
# the same way: a batch size that does not fit); past it, or where rank 0 runs another iteration,
# the failure is the rank's own (rank 0 then waits in a collective for it).
_SAME_FAILURE_S = 5.0


def data_parallel_note(world_size: int) -> str:
    """What a data-parallel script's document says of how it was measured."""
    return (
        f"Data-parallel training over {world_size} processes: each batch size is rank 0's, measured while every rank "
        "runs the same iterations, DDP's all-reduce of the gradients included (its wait is untracked time); each "
        "rank's own times and the scaling to more processes are not measured for a training script."
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
    ours = folder is None
    if folder is None:  # under torchrun: the ranks share a folder of their job's
        folder = _torchrun_folder(request.entry_point, world_size)
    root = Path(request.project_root).resolve()
    pipes = [Path(folder) / f"follow-{other}" for other in range(1, world_size)]
    if rank != 0:
        with _environment_kept():
            _Follower(request, path, root, pipes[rank - 1]).run()
        return None
    with _environment_kept(), _Followers(pipes) as followers:
        if ours:  # every pipe is open at both ends, and unlinked
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        document = analyze_script_request(request, path, root, progress, pacer=followers)
    return dataclasses.replace(document, warnings=[*document.warnings, data_parallel_note(world_size)])


class _Followers:
    """Rank 0's ends of the other ranks' pipes (each rank makes its own as it starts): the pacer
    of rank 0's runs of the script (measure/script_run.py)."""

    def __init__(self, pipes: list[Path]) -> None:
        self.paths = pipes
        self.ends: list[int] = []
        self.runs = 0

    def __enter__(self) -> _Followers:
        for path in self.paths:
            while not path.exists():  # a rank that fails to start is stopped, and this one with it, by the launcher
                time.sleep(0.01)
            self.ends.append(os.open(path, os.O_WRONLY))  # once that rank opened it to read
            path.unlink()  # open at both ends: the name is no longer needed
        return self

    def __exit__(self, *exc: object) -> None:
        for end in self.ends:  # the other ranks read the end: they end too
            os.close(end)

    def started(self, batch_size: int | None) -> None:
        port = _free_port() if self.runs else 0
        self.runs += 1
        _use_store_on(port)
        self._tell(_RUN + _RUN_HEADER.pack(-1 if batch_size is None else batch_size, port))

    def iteration(self) -> None:
        self._tell(_ITERATION)

    def ended(self) -> None:
        self._tell(_END)

    def _tell(self, message: bytes) -> None:
        for end in self.ends:
            # A rank that died cannot read: this rank waits in its next collective, and the launcher
            # stops it and reports the one that died.
            with contextlib.suppress(OSError):
                os.write(end, message)


class _Follower:
    """Another rank: the runs rank 0 starts, an iteration each time rank 0 runs one."""

    def __init__(self, request: AnalysisRequest, path: Path, root: Path, pipe: Path) -> None:
        self.request = request
        self.path = path
        self.root = root
        self.pipe = pipe
        self.end = -1

    def run(self) -> None:
        os.mkfifo(self.pipe)
        self.end = os.open(self.pipe, os.O_RDONLY)  # once rank 0 opened it to write
        try:
            while self._read(1) == _RUN:
                batch_size, port = _RUN_HEADER.unpack(self._read(_RUN_HEADER.size))
                _use_store_on(port)
                self._follow_run(None if batch_size < 0 else batch_size)
        finally:
            os.close(self.end)

    def _follow_run(self, batch_size: int | None) -> None:
        script = load_training_script(self.path, self.root, tuple(self.request.script_args), batch_size)
        with ScriptRun(script, self.request.step_timeout_s or STEP_TIMEOUT_S) as run:
            while (message := self._read(1)) == _ITERATION:
                try:
                    run.iteration()
                except SkylineError:  # the user's code failed, or the script ended
                    if self._rank_zero_ends_the_run_too():
                        return
                    raise
            if message != _END:  # rank 0 closed its end: it is done
                return

    def _rank_zero_ends_the_run_too(self) -> bool:
        """After this rank's iteration failed: whether rank 0 ends the run soon (its own failed the
        same way), its end read; the failure is this rank's where rank 0 runs on."""
        ready, _, _ = select.select([self.end], [], [], _SAME_FAILURE_S)
        return bool(ready) and self._read(1) == _END

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = os.read(self.end, size - len(data))
            if not chunk:
                return data  # rank 0 closed its end
            data += chunk
        return data


def _use_store_on(port: int) -> None:
    """The next run's process group meets through a store on `port` that the script's rank 0
    serves; 0: the launcher's (the first run)."""
    if port:
        os.environ["MASTER_PORT"] = str(port)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """The variables the runs' stores change, as they were once the runs are over."""
    kept = {name: os.environ.get(name) for name in _STORE_VARIABLES}
    try:
        yield
    finally:
        for name, value in kept.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _torchrun_folder(entry_point: str, world_size: int) -> str:
    """Under torchrun, the folder the job's ranks share: in the temporary folder, named after the
    job (its run id and store port). Every rank must be on this machine."""
    if int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) != world_size:
        raise EntryPointError(
            f"{entry_point} is a training script, and its ranks run on several machines: Skyline keeps every rank's "
            "iterations in step with rank 0's through files on one machine.",
            hint="Run it on one machine (`torchrun --nproc_per_node N`, or `skyline profile SCRIPT --nproc N`).",
        )
    job = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}-{os.environ.get('MASTER_PORT', '0')}"
    folder = Path(tempfile.gettempdir()) / f"skyline-ranks-{''.join(c for c in job if c.isalnum() or c == '-')}"
    folder.mkdir(exist_ok=True)
    return str(folder)
