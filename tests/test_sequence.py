"""The measurement sequence (analysis/sequence.py), driven by a stand-in iteration source: a real
tiny model trained on the CPU and recorded by the real recorder, whose source logs each step the
sequence asks of it and answers the timing with fixed figures (no clock decides anything here).
A step skipped, repeated or moved shows in the log; the outcomes show what each step fed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from skyline_engine.analysis.sequence import IterationSource, measure_batch_size
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.recording import IterationRecording, recorded_iterations
from skyline_engine.entry.user_frames import ProjectFiles
from skyline_engine.measure.contention import BUSY_MACHINE, CpuContention
from skyline_engine.measure.memory import LiveTensors, MemoryProfile, measure_memory
from skyline_engine.measure.timing import CpuClock, TimingStats

CPU = torch.device("cpu")
BATCH_SIZE = 8
TIMED = TimingStats(run_time_ms=1.0, iqr_ms=0.1, iterations=40, block_size=4)
RETIMED = TimingStats(run_time_ms=1.5, iqr_ms=0.1, iterations=40, block_size=4)
SLOW = TimingStats(run_time_ms=700.0, iqr_ms=10.0, iterations=10, block_size=1)


class LoggedSource(IterationSource):
    """A linear model trained with SGD; every step the sequence takes is logged. `cycle`: what
    measure_in_cycles answers; `apart`: whether memory is measured apart from the recording;
    `leak`: tensors each iteration keeps for good."""

    def __init__(
        self, cycle: int | None = None, apart: bool = False, leak: bool = False, timed: TimingStats = TIMED
    ) -> None:
        self.batch_size = BATCH_SIZE
        self.clock = CpuClock()
        self.live_tensors = LiveTensors()
        self.model = torch.nn.Linear(16, 4)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.kept: list[torch.Tensor] = []
        self.cycle, self.apart, self.leak = cycle, apart, leak
        self.log: list[str] = []
        self.timings = iter([timed, RETIMED])

    def iteration(self) -> None:
        self.optimizer.zero_grad()
        loss = self.model(torch.randn(self.batch_size, 16)).sum()
        loss.backward()
        self.optimizer.step()
        if self.leak:
            self.kept.append(torch.zeros(1024))

    def _step(self, name: str) -> None:
        if not self.log or self.log[-1] != name:  # iterations in a row log once
            self.log.append(name)

    def warm_up(self) -> float:
        self._step("warm_up")
        for _ in range(2):
            self.iteration()
        return 5.0

    def run_recorded(self) -> None:
        self._step("recorded")
        self.iteration()

    def memory(self) -> MemoryProfile | None:
        self._step("memory")
        return measure_memory(CPU, self.iteration, self.live_tensors) if self.apart else None

    @contextlib.contextmanager
    def watching_first(self) -> Iterator[None]:
        self._step("watching")
        yield
        self._step("watched")

    def time(self) -> TimingStats:
        self._step("time")
        return next(self.timings)

    def measure_in_cycles(self, run_time_ms: float) -> int | None:
        self._step(f"cycle? ({run_time_ms} ms)")
        return self.cycle

    def align_to_cycle(self) -> None:
        self._step("align")


class Contention(CpuContention):
    """How busy other processes kept the CPUs while the batch size was timed, as given (how much
    this machine's are is not the test's to decide)."""

    def __init__(self, others_share: float) -> None:
        super().__init__()
        self.given = others_share

    def __exit__(self, *exc: object) -> None:
        self.others_share = self.given


def measured(source: LoggedSource, **options):
    """Measured as on a quiet machine unless `contention` says otherwise: how busy the machine
    running the tests is must not change how many iterations are recorded."""
    options.setdefault("contention", lambda: Contention(0.0))
    recording = IterationRecording(CreationSites(CallSites(ProjectFiles(Path(__file__).parent))), source.model, CPU)
    firsts = []
    result = measure_batch_size(
        source, recording, timeline=False, on_first=lambda *first: firsts.append(first), **options
    )
    return result, firsts


def test_every_step_in_order_where_calls_do_not_differ():
    source = LoggedSource()
    result, firsts = measured(source)
    assert source.log == [
        "warm_up",
        "memory",
        "watching",
        "recorded",  # the first recorded iteration
        "watched",
        "recorded",  # the memory kept for good, in steady state
        "time",
        "cycle? (1.0 ms)",
        "recorded",  # more recorded iterations for the breakdown
    ]
    # The first result came from the first recorded iteration, before the timing: the warm-up's
    # 5 ms or the recorded one's, whichever was less.
    [(first, first_breakdown)] = firsts
    assert first.timing.iterations == 1 and first.timing.run_time_ms <= 5.0
    assert first_breakdown.attribution.recorded_iterations == 1
    assert result.sample.timing == TIMED
    assert result.sample.memory == first.memory  # the recorded iteration's memory
    assert result.breakdown.attribution.recorded_iterations == recorded_iterations(TIMED.run_time_ms)
    assert result.growth is None


class ScriptLike(LoggedSource):
    records_while_busy = False


@pytest.mark.parametrize(
    "source_class, others_share, iterations",
    [
        (LoggedSource, 0.0, 3),  # a slow iteration: the minimum
        (LoggedSource, 0.1, 3),
        (LoggedSource, 0.6, 15),  # busy: 15 (as many as fit the busy recording limit, where fewer)
        (ScriptLike, 0.6, 3),  # a source whose iterations may run out: no more
    ],
)
def test_a_busy_machine_records_more_of_a_slow_iteration(source_class, others_share, iterations):
    source = source_class(timed=SLOW)
    result, _ = measured(source, contention=lambda: Contention(others_share))
    assert result.breakdown.attribution.recorded_iterations == iterations
    assert result.sample.timing == SLOW
    # Busy, and recording as busy: each operation's time is its thread's CPU time.
    busy = others_share >= BUSY_MACHINE and source.records_while_busy
    assert result.breakdown.attribution.device_time == ("thread_cpu" if busy else None)


def test_in_cycles_the_iteration_is_timed_memory_measured_and_recorded_again():
    source = LoggedSource(cycle=2, apart=True)
    result, _ = measured(source)
    assert source.log == [
        "warm_up",
        "memory",
        "watching",
        "recorded",
        "watched",
        "recorded",
        "time",
        "cycle? (1.0 ms)",
        "time",  # again, in whole cycles
        "memory",  # apart, over the cycle
        "align",
        "recorded",  # one whole cycle
    ]
    assert result.sample.timing == RETIMED
    assert result.breakdown.attribution.recorded_iterations == 2  # the cycle's calls, no more
    assert result.sample.memory.peak_bytes > 0


@pytest.mark.parametrize("leak", [False, True])
def test_memory_kept_for_good_is_measured(leak):
    result, _ = measured(LoggedSource(leak=leak))
    assert (result.growth is not None) == leak
    if leak:
        assert result.growth.bytes_per_iteration == 1024 * 4
