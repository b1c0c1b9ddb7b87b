"""Recording the iterations of one batch size for its breakdown, and the memory of the first.

The first recorded iteration also gives the batch size's memory profile, measured in the same pass:
the recorder shows every operation to a memory meter (a second dispatch mode for the count cost the
transformer example 9 ms of a 43 ms recorded iteration). Fast models then get a few more recorded
iterations, averaged, once the first result is out. On CUDA every recorded iteration runs under
torch.profiler, for each operation's kernel time (attribute/kernels.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Callable

import torch

from skyline_engine.attribute.breakdown import RECORDED, Breakdown, OperationSite, build_breakdown
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.kernels import SPANS, THREAD_CPU, KernelCapture
from skyline_engine.attribute.memory_growth import MemoryGrowth, memory_growth
from skyline_engine.attribute.other_tensors import ACTIVATION, GRADIENT, Lifetimes, OtherTensor
from skyline_engine.attribute.recorder import OperationRecord, OperationRecorder
from skyline_engine.measure.compilation import eager_replay
from skyline_engine.measure.memory import LiveTensors, MemoryProfile, meter_for, tracking_phases
from skyline_engine.measure.retention import measure_retention
from skyline_engine.measure.timing import Clock

Run = Callable[[], None]

# The breakdown combines at least MIN_RECORDED_ITERATIONS recorded iterations (each operation's
# fastest time in them, attribute/breakdown.py), slow ones too, within RECORDING_LIMIT_MS of
# iteration time; fast ones up to MAX_RECORDED_ITERATIONS within RECORDING_BUDGET_MS, and on a
# busy machine up to BUSY_RECORDED_ITERATIONS, within BUSY_RECORDING_LIMIT_MS. From one recorded
# iteration, the shares of a 140 ms iteration's lines swung by up to 19 points between
# back-to-back analyses on a busy machine (a small GPT's loss line: 28, 11, 8, 9 %). Under two
# busy processes on two cores, OpenMP's threads wait for a core in episodes (measure/
# thread_waits.py): the small GPT's operations, 15 recorded iterations in each of two fresh
# processes, took their own time plus about 7.7 or 15 ms in runs of consecutive operations and
# iterations (an MLP product 1.1 ms clean read 14.9, 5.6, 15.6, 15.6, 16.5 ms in five iterations
# in a row). The fastest of the first 5 put its top lines' shares 11.6, 0.1, 4.6 and 4.0 points
# apart between the two processes; the fastest of 15, 4.2, 0.5, 0.7 and 4.1. Slow iterations
# need them too: where a busy machine slowed the GPT's iterations to 1.3 s, 10 s held 7, and its
# head line read 35.3, 32.6 and 41.3 % over three analyses (bench/fidelity-busy.md). In five fresh
# processes of 15 recorded iterations each, the fastest of the first 7 put the top three lines
# 4.7, 3.7 and 7.2 points apart, of 10, 1.8, 2.9 and 2.5, of 15, 2.1, 1.4 and 1.1 (their mean
# or median, 6 to 22); no rule that stopped once the shares held still did as well.
MIN_RECORDED_ITERATIONS = 3
MAX_RECORDED_ITERATIONS = 5
BUSY_RECORDED_ITERATIONS = 15
RECORDING_BUDGET_MS = 200.0
RECORDING_LIMIT_MS = 10_000.0
BUSY_RECORDING_LIMIT_MS = 20_000.0


class IterationRecording:
    """The recorded iterations of `model` at one batch size, broken down by the user's lines."""

    def __init__(
        self,
        creation: CreationSites,
        model: torch.nn.Module,
        device: torch.device,
        held: Mapping[str, torch.nn.Module] | None = None,
        kernel_capture: Callable[[], KernelCapture] | None = None,
    ) -> None:
        """`held`: the modules the iteration holds beside `model`, by name (measure/held_modules.py).
        `kernel_capture`: what captures each operation's kernels, KernelCapture on CUDA and none
        elsewhere (tests stand in for a GPU through it)."""
        self.creation = creation
        self.model = model
        self.device = device
        self._kernel_capture = kernel_capture or (KernelCapture if device.type == "cuda" else None)
        self._held = dict(held or {})
        # The model's names win over a held module's that shares its parts (torch.compile's wrapper).
        named = [("model", model), *self._held.items()]
        self._module_names: dict[int, str] = {}
        for prefix, module in named:
            for name, part in module.named_modules(prefix=prefix):
                self._module_names.setdefault(id(part), name)
        self.recorder = self._new_recorder()
        self._peak_memory_operation: OperationSite | None = None
        self._other_tensors: list[OtherTensor] = []
        # The bytes of activations and gradients alive there (Lifetimes.alive_at); None where the
        # peak's operation is not known.
        self._alive_at_peak: dict[str, int] | None = None
        self._first_names: tuple[str, ...] = ()  # the first recorded iteration's operations, as its meter saw them

    def record_first(self, run: Run, clock: Clock, live_tensors: LiveTensors) -> tuple[MemoryProfile, float]:
        """One iteration recorded operation by operation: its memory profile and its wall time."""
        wall_ms: list[float] = []

        def one() -> None:
            self.recorder.start_iteration()
            wall_ms.append(clock.time_ms(run))

        profile = self._recorded_with_memory(one, live_tensors)
        self._first_names = profile.operation_names
        return profile, wall_ms[0]

    def memory_growth(self, run: Run, live_tensors: LiveTensors) -> MemoryGrowth | None:
        """The tensor memory each iteration keeps for good (measure/retention.py), at the lines of
        the first recorded iteration's operations that made it; None when it keeps none. Run in
        steady state, after the first recorded iteration."""
        retention = measure_retention(run, self.model, self.device, live_tensors)
        return memory_growth(retention, self._first_names, self.recorder.recording.operations)

    def record_more(self, run: Run, run_time_ms: float, busy: bool = False) -> None:
        """More recorded iterations after the first, for the breakdown to combine: as many as
        `recorded_iterations` says for iterations of `run_time_ms` (`busy`: on a busy machine,
        where on the CPU each operation's time becomes its thread's CPU time, THREAD_CPU)."""
        if busy and self.device.type == "cpu":
            self.recorder.recording.device_time = THREAD_CPU
        more = recorded_iterations(run_time_ms, busy) - 1
        if more <= 0:
            return
        with eager_replay(), self._kernel_times(), self.recorder:
            self._calls(run, more)

    def record_cycle(self, run: Run, calls: int, live_tensors: LiveTensors) -> MemoryProfile:
        """Calls that differ (measure/work_per_call.py): the breakdown becomes that of `calls`
        consecutive calls, one whole cycle, recorded from where a cycle starts, in place of the
        first recorded call, and so do the memory profile (the whole cycle's) and the operation at
        its peak; the growth stays as it was found."""
        self.recorder = self._new_recorder()
        return self._recorded_with_memory(lambda: self._calls(run, calls), live_tensors)

    def _recorded_with_memory(self, calls: Run, live_tensors: LiveTensors) -> MemoryProfile:
        """`calls` recorded (each starting its recorded iteration), with the memory profile of what
        they ran, whose peak names the recorded operation at it."""
        meter = self.recorder.memory = meter_for(self.device, live_tensors)
        lifetimes = self.recorder.lifetimes = Lifetimes(lambda: meter.operations_seen)
        with eager_replay(), tracking_phases(meter), self._kernel_times(), self.recorder:
            calls()
        self.recorder.memory = self.recorder.lifetimes = None  # further recorded iterations only add to the breakdown
        profile = meter.profile()
        operations = self.recorder.recording.operations
        index = _index_at_peak(profile, operations)
        self._peak_memory_operation = OperationSite.of(operations[index]) if index is not None else None
        self._other_tensors = lifetimes.other_tensors_at(index) if index is not None else []
        before_first = profile.start_bytes >= profile.peak_bytes  # the peak is what was alive at the start
        self._alive_at_peak = lifetimes.alive_at(index) if index is not None or before_first else None
        return profile

    @contextlib.contextmanager
    def _kernel_times(self) -> Iterator[None]:
        """On CUDA, the kernel time of the operations recorded inside, given to the recording once
        the recorder has left (its spans read); once a capture has failed, spans from then on."""
        recording = self.recorder.recording
        if self._kernel_capture is None or recording.device_time == SPANS:
            yield
            return
        ranges = self.recorder.kernel_ranges = {}
        capture = self._kernel_capture()
        try:
            with capture:
                yield
        finally:
            self.recorder.kernel_ranges = None
        recording.take_kernel_times(ranges, capture.kernel_ms, capture.fallback)

    def _calls(self, run: Run, count: int) -> None:
        """`count` recorded iterations of `run`, inside the recorder."""
        for _ in range(count):
            self.recorder.start_iteration()
            run()

    def _new_recorder(self) -> OperationRecorder:
        return OperationRecorder(
            self.creation.call_sites, self._module_names, self.device, model=self.model, held=list(self._held.values())
        )

    def micro_batches(self, batch_size: int) -> int:
        """Micro-batches per optimizer step at `batch_size`, from the first recorded iteration
        (Recording.micro_batches)."""
        return self.recorder.recording.micro_batches(batch_size)

    def breakdown(
        self,
        run_time_ms: float,
        peak_memory_bytes: int,
        timeline: bool = False,
        mode: str = RECORDED,
        program_peak: bool = False,
    ) -> Breakdown:
        """`program_peak`: `peak_memory_bytes` is the program's own (a compiled model on CUDA,
        measure/memory.py), not the recorded eager replay's: the replay's peak, its operation and
        what was alive there describe another moment; the peak's parts are then the weights, the
        optimizer's state and the rest."""
        replayed = not program_peak
        return build_breakdown(
            self.recorder.recording,
            self.model,
            self.creation,
            run_time_ms,
            peak_memory_bytes,
            timeline,
            mode,
            peak_memory_operation=self._peak_memory_operation if replayed else None,
            held=self._held,
            other_tensors=self._other_tensors if replayed else [],
            alive_at_peak=self._alive_at_peak if replayed else {GRADIENT: 0, ACTIVATION: 0},
        )


def recorded_iterations(run_time_ms: float, busy: bool = False) -> int:
    """How many recorded iterations the breakdown combines, for iterations of `run_time_ms`: at
    least MIN_RECORDED_ITERATIONS where they fit RECORDING_LIMIT_MS (one where not even two do),
    more for fast ones, up to MAX_RECORDED_ITERATIONS within RECORDING_BUDGET_MS; on a `busy`
    machine, BUSY_RECORDED_ITERATIONS, or as many as fit BUSY_RECORDING_LIMIT_MS."""
    run_time_ms = max(run_time_ms, 1e-3)
    if busy:
        return max(1, min(BUSY_RECORDED_ITERATIONS, int(BUSY_RECORDING_LIMIT_MS // run_time_ms)))
    fit = int(RECORDING_LIMIT_MS // run_time_ms)
    fast = min(MAX_RECORDED_ITERATIONS, int(RECORDING_BUDGET_MS // run_time_ms))
    return max(1, min(max(MIN_RECORDED_ITERATIONS, fast), fit))


def _index_at_peak(profile: MemoryProfile, operations: list[OperationRecord]) -> int | None:
    """The index of the recorded operation after which memory peaked: the meter saw the first
    recorded iteration's operations one for one, in the order they were recorded. None when
    memory was highest before the first operation."""
    peak = profile.peak_bytes
    if not profile.operation_bytes or profile.start_bytes >= peak or len(operations) < len(profile.operation_bytes):
        return None
    return profile.operation_bytes.index(peak)
