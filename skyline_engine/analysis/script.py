"""One analysis of a training script, end to end:

run the script up to its first optimizer step (its setup: the model, the data, where parameters
are created) → one whole iteration, seeing which module it trains and with how many samples → the
measurement sequence on the script's own iterations (analysis/sequence.py) → stop the script → the
document

The iterations are the script's, from one optimizer step to the next, its data loading included
(measure/script_run.py). Other batch sizes are not measured yet (that needs the script run again
with its batch size changed in memory), so the document has no models and says why.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable

import torch

from skyline_engine.analysis.assembly import build_document, with_output_note
from skyline_engine.analysis.document import AnalysisDocument
from skyline_engine.analysis.sequence import IterationSource, measure_batch_size
from skyline_engine.attribute.breakdown import Breakdown
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.memory_growth import MemoryGrowth
from skyline_engine.attribute.recording import IterationRecording
from skyline_engine.entry.batch_size import BatchSizeLocation
from skyline_engine.entry.rewrite import set_script_batch_size
from skyline_engine.entry.script import TrainingScript, load_training_script
from skyline_engine.entry.script_batch_size import ScriptBatchSize, find_script_batch_size
from skyline_engine.entry.user_output import first_lines_of_user_output
from skyline_engine.errors import EntryPointError
from skyline_engine.measure.device import describe_device, torch_version
from skyline_engine.measure.iteration import Sample
from skyline_engine.measure.memory import LiveTensors
from skyline_engine.measure.runtime import runtime_changes
from skyline_engine.measure.script_model import OutermostCalls, watching_outermost_calls
from skyline_engine.measure.script_run import STEP_TIMEOUT_S, ScriptRun
from skyline_engine.measure.timing import Clock, TimingBudget, TimingStats, clock_for, measure_iteration_time
from skyline_engine.measure.work_per_call import CallWork, WorkPerCall, cycle_fits, find_cycle

Progress = Callable[[str, float], None]
Partial = Callable[[AnalysisDocument], None]

SCRIPT_MODELS_WITHHELD = (
    "A training script is measured at its own batch size only: other batch sizes (the script run again with "
    "the value changed) are not measured yet, so nothing is predicted. For predictions, profile an entry point "
    "(docs/entry-points.md)."
)


class ScriptSource(IterationSource):
    """The iterations of a running script at its own batch size: each from one optimizer step to
    the next. Where they differ in a cycle (an evaluation every few steps: more passes through the
    model), they are measured in whole cycles, as an entry point's calls are
    (measure/work_per_call.py); the passes are counted by a forward hook on the model, removed by
    `close`."""

    def __init__(
        self, run: ScriptRun, model: torch.nn.Module, batch_size: int, clock: Clock, budget: TimingBudget
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


def analyze_script(
    request_budget: TimingBudget,
    path: Path,
    project_root: Path,
    *,
    script_args: tuple[str, ...] = (),
    batch_size: int | None = None,
    write_batch_size: bool = False,
    step_timeout_s: float | None = None,
    timeline: bool = False,
    memory_capacity_bytes: int | None = None,
    progress: Progress,
    partial: Partial | None = None,
) -> AnalysisDocument:
    """The document of the training script at `path`, run with `script_args` and, where given, its
    batch-size literal set to `batch_size` in memory (and written to the file with
    `write_batch_size`, once the model showed it is its batch size); stopped where it runs when it
    does not step within `step_timeout_s` (None: measure/script_run.py's default)."""
    script = load_training_script(path, project_root, script_args, batch_size)
    creation = CreationSites(CallSites(script.files))
    with first_lines_of_user_output() as output, ScriptRun(script, step_timeout_s or STEP_TIMEOUT_S) as run:
        progress(f"running {script.relative_path} up to its first optimizer step", 0.0)
        with creation.finding_optimizers(script.relative_path):
            with creation.recording_modules():  # where each parameter is created: its line's memory
                run.iteration()  # the script's setup and first iteration
            with watching_outermost_calls() as calls:
                run.iteration()  # a whole iteration, from one step to the next
            model, batch_size = _trained_model(script, calls, run)
            _check_literal_set(script, batch_size)
            written = write_batch_size and script.literal_set is not None
            if written:
                set_script_batch_size(path, project_root, batch_size, script.argv)
            device = next(model.parameters()).device
            info = describe_device(device, memory_capacity_bytes)
            found = find_script_batch_size(script.source, script.relative_path, script.argv, batch_size)
            source = ScriptSource(run, model, batch_size, clock_for(device), request_budget)

            def document(
                sample: Sample, breakdown: Breakdown, warnings: list[str], growth: MemoryGrowth | None = None
            ) -> AnalysisDocument:
                return build_document(
                    project_root=str(script.files.root),
                    entry_point=script.relative_path,
                    torch_version=torch_version(),
                    device=info,
                    batch_size=batch_size,
                    samples=[sample],
                    breakdown=breakdown,
                    models=None,
                    batch_size_location=found.location,
                    warnings=warnings,
                    models_withheld=SCRIPT_MODELS_WITHHELD,
                    memory_growth=growth,
                    runtime_changes=runtime_changes(os.environ, False),
                    script=True,
                )

            progress(f"measuring batch size {batch_size}", 0.1)
            notes = _batch_size_notes(found, batch_size, None if written else script.literal_set)
            with source.live_tensors.frozen(), contextlib.closing(source):
                measured = measure_batch_size(
                    source,
                    IterationRecording(creation, model, device, calls.others(model)),
                    timeline=timeline,
                    on_first=None if partial is None else lambda s, b: partial(document(s, b, notes)),
                )
    growth = measured.growth
    differing = source.work.script_warning(measured.breakdown.attribution.recorded_iterations)
    warnings = ([differing] if differing else []) + notes + ([growth.warning()] if growth else [])
    result = document(measured.sample, measured.breakdown, warnings, growth)
    progress("done", 1.0)
    return with_output_note(result, output)


def _trained_model(script: TrainingScript, calls: OutermostCalls, run: ScriptRun) -> tuple[torch.nn.Module, int]:
    found = calls.model(run.optimizer)
    if found is None:
        raise EntryPointError(
            f"{script.relative_path} stepped an optimizer, but called no module whose parameters it updates "
            "between two steps: Skyline breaks down the forward pass of the model it trains.",
            path=script.relative_path,
        )
    model, batch_size = found
    if batch_size is None:
        raise EntryPointError(
            f"{script.relative_path} called its model `{type(model).__name__}` with no tensor of one dimension or "
            "more, so its batch size (the leading dimension of the first tensor) cannot be read.",
            path=script.relative_path,
            hint="Call the model with its inputs as positional tensors, batch first: `model(x)`.",
        )
    return model, batch_size


def _check_literal_set(script: TrainingScript, batch_size: int) -> None:
    """That the literal set in memory is the one the model's batch size comes from: a literal found
    by its kind alone may be another loader's (an evaluation's `batch_size=256`)."""
    literal, set_to = script.literal_set, script.batch_size_set
    if literal is not None and set_to != batch_size:
        raise EntryPointError(
            f"Batch size {set_to} was set at {literal.path}:{literal.line}, but the model got batches of "
            f"{batch_size}: that literal is not the batch size this script trains with.",
            path=literal.path,
            line=literal.line,
            hint="Change the batch size where the script sets it for training, or give its option after `--`.",
        )


def _batch_size_notes(found: ScriptBatchSize, batch_size: int, literal_set: BatchSizeLocation | None) -> list[str]:
    """Why no literal in the script is the batch size's (the document's `batch_size_location`
    names it where one is); where one is, that the analysis set it in memory, when the file says
    another value (`literal_set`, as the file has it)."""
    if found.location is not None and found.location.editable:
        if literal_set is None or literal_set.value == batch_size:
            return []
        return [
            f"Batch size {batch_size} was set at {literal_set.path}:{literal_set.line} for this analysis, in memory: "
            f"the file still says {literal_set.value} (--set-batch-size writes it)."
        ]
    why = found.reason or (found.location.reason if found.location else None) or "no literal was found"
    return [
        f"Batch size {batch_size}, the leading dimension of the model's inputs: {why}, so it cannot be changed "
        "from here; change it where the script sets it."
    ]
