"""A training script's iterations as the measurement sequence takes them (analysis/sequence.py)."""

from __future__ import annotations

import torch

from skyline_engine.analysis.sequence import IterationSource
from skyline_engine.measure.memory import LiveTensors
from skyline_engine.measure.script_run import ScriptRun
from skyline_engine.measure.timing import Clock, TimingBudget, TimingStats, measure_iteration_time
from skyline_engine.measure.work_per_call import CallWork, WorkPerCall, cycle_fits, find_cycle


class ScriptSource(IterationSource):
    """The iterations of a running script at its own batch size: each from one optimizer step to
    the next. Where they differ in a cycle (an evaluation every few steps: more passes through the
    model), they are measured in whole cycles, as an entry point's calls are
    (measure/work_per_call.py); the passes are counted by a forward hook on the model, removed by
    `close`. A busy machine adds no recorded iteration: the script's iterations are its own to
    count, and one that ends before the analysis does fails it."""

    records_while_busy = False

    def __init__(
        self,
        run: ScriptRun,
        model: torch.nn.Module,
        batch_size: int,
        clock: Clock,
        budget: TimingBudget,
    ) -> None:
        self.run = run
        self.batch_size = batch_size
        self.clock = clock
        self.budget = budget
        self.live_tensors = LiveTensors()
        self.work = WorkPerCall()
        self.cycle = 1
        self._iterations = 0  # of the script, from the first measured on
        self._cycle_end = 0
        self._forwards = 0
        self._hook = model.register_forward_hook(self._ran_model)

    @property
    def iterations(self) -> int:
        """The script's iterations run through this source."""
        return self._iterations

    def close(self) -> None:
        self._hook.remove()

    def warm_up(self) -> float:
        for _ in range(self.budget.warmup_iterations - 1):
            self.run_recorded()
        return self.clock.time_ms(self.run_recorded)

    def run_recorded(self) -> None:
        forwards = self._forwards
        self.run.iteration()
        self._iterations += 1
        self.work.add(CallWork(1, self._forwards - forwards), self._iterations)

    def time(self) -> TimingStats:
        return measure_iteration_time(self.run_recorded, self.clock, self.budget, cycle=self.cycle)

    def measure_in_cycles(self, run_time_ms: float) -> int | None:
        cycle = find_cycle(self.work, self.run_recorded, run_time_ms)
        if not cycle_fits(cycle, run_time_ms):
            return None
        self.cycle = cycle
        self._cycle_end = self.work.last_cycle_end() or self._iterations
        return cycle

    def align_to_cycle(self) -> None:
        while (self._iterations - self._cycle_end) % self.cycle:
            self.run_recorded()

    def _ran_model(self, module: torch.nn.Module, args: object, output: object) -> None:
        self._forwards += 1
