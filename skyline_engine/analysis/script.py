"""One analysis of a training script, end to end:

run the script up to its first optimizer step (its setup: the model, the data, where parameters
are created) → one whole iteration, seeing which module it trains and with how many samples → the
measurement sequence on the script's own iterations (analysis/sequence.py) → stop the script →
other batch sizes, each in a run of the script of its own with its batch size changed in memory,
the models and the confirming runs (analysis/script_sizes.py) → the document

The iterations are the script's, from one optimizer step to the next, its data loading included
(measure/script_run.py).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from skyline_engine.analysis.assembly import build_document, with_output_note
from skyline_engine.analysis.document import AnalysisDocument
from skyline_engine.analysis.fitting import NOT_ASKED, withheld_where_threads_waited
from skyline_engine.analysis.script_sizes import (
    ScriptBatchSizes,
    ScriptPredictions,
    ScriptTarget,
    UsersIteration,
    predict_script_sizes,
)
from skyline_engine.analysis.script_source import ScriptSource
from skyline_engine.analysis.sequence import BatchSizeMeasurement, measure_batch_size
from skyline_engine.attribute.breakdown import Breakdown
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.memory_growth import GROWING_MEMORY
from skyline_engine.attribute.recording import IterationRecording
from skyline_engine.entry.batch_size import BatchSizeLocation
from skyline_engine.entry.rewrite import set_script_batch_size
from skyline_engine.entry.script import TrainingScript, load_training_script
from skyline_engine.entry.script_batch_size import ScriptBatchSize, find_script_batch_size
from skyline_engine.entry.user_output import first_lines_of_user_output
from skyline_engine.errors import EntryPointError
from skyline_engine.measure.device import DeviceInfo, describe_device, torch_version
from skyline_engine.measure.iteration import Sample, counting_gradients
from skyline_engine.measure.runtime import runtime_changes
from skyline_engine.measure.script_model import OutermostCalls, watching_outermost_calls
from skyline_engine.measure.script_run import STEP_TIMEOUT_S, Pacer, ScriptRun
from skyline_engine.measure.timing import TimingBudget, clock_for

Progress = Callable[[str, float], None]
Partial = Callable[[AnalysisDocument], None]


@dataclass(frozen=True)
class _UsersRun:
    """The user's batch size, measured in the first run of the script, which has ended: plain data
    and none of the run's objects (its model alive would count in the memory of the next runs)."""

    script: TrainingScript
    device: torch.device
    info: DeviceInfo
    found: ScriptBatchSize
    measured: BatchSizeMeasurement
    iteration: UsersIteration
    warnings: list[str]

    def document(self, **parts: Any) -> AnalysisDocument:
        """The document of the user's batch size's breakdown, with `parts` (samples, models, warnings…)."""
        measured = self.measured
        return _script_document(
            self.script,
            self.info,
            self.found,
            measured.sample.batch_size,
            breakdown=measured.breakdown,
            memory_growth=measured.growth,
            **parts,
        )


def _script_document(
    script: TrainingScript, info: DeviceInfo, found: ScriptBatchSize, batch_size: int, **parts: Any
) -> AnalysisDocument:
    return build_document(
        project_root=str(script.files.root),
        entry_point=script.relative_path,
        torch_version=torch_version(),
        device=info,
        batch_size=batch_size,
        batch_size_location=found.location,
        runtime_changes=runtime_changes(os.environ, False),
        script=True,
        **parts,
    )


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
    predict: bool = True,
    progress: Progress,
    partial: Partial | None = None,
    pacer: Pacer | None = None,
) -> AnalysisDocument:
    """The document of the training script at `path`, run with `script_args` and, where given, its
    batch size set to `batch_size` in memory (and written to the file with `write_batch_size`,
    once the model showed the literal is its batch size); stopped where it runs when it does not
    step within `step_timeout_s` (None: measure/script_run.py's default). With `predict`, other
    batch sizes are measured in runs of their own and the models fitted. `pacer` is told of each
    run and iteration (a data-parallel script's other ranks: analysis/script_ranks.py)."""
    timeout_s = step_timeout_s or STEP_TIMEOUT_S
    script = load_training_script(path, project_root, script_args, batch_size)
    if write_batch_size and script.literal_set is None:
        _cannot_write(script, script_args)
    with first_lines_of_user_output() as output:
        users = _users_batch_size(
            script,
            request_budget,
            ScriptRun(script, timeout_s, pacer),
            timeline,
            memory_capacity_bytes,
            write_batch_size,
            progress,
            partial,
        )
        target = ScriptTarget(path, project_root, tuple(script_args), timeout_s, pacer)
        predictions = _predictions(users, target, request_budget, predict, progress, partial)
    result = users.document(
        samples=predictions.samples,
        models=predictions.models,
        warnings=users.warnings + predictions.notes,
        memory_only=predictions.memory_only,
        models_withheld=predictions.models_withheld,
        checks=predictions.checks,
        recommendation=withheld_where_threads_waited(predictions.recommendation, users.measured.waits),
        iteration=users.measured.sample,
    )
    progress("done", 1.0)
    return with_output_note(result, output)


def _predictions(
    users: _UsersRun,
    target: ScriptTarget,
    budget: TimingBudget,
    predict: bool,
    progress: Progress,
    partial: Partial | None,
) -> ScriptPredictions:
    """The models of the script's batch sizes, or why there are none."""
    sample, growth = users.measured.sample, users.measured.growth
    if not predict:
        return ScriptPredictions([sample], None, NOT_ASKED)
    if growth is not None and growth.skews_peaks(sample.peak_memory_bytes):
        return ScriptPredictions([sample], None, GROWING_MEMORY)
    unchangeable = _why_unchangeable(users.found)
    if unchangeable is not None:
        return ScriptPredictions([sample], None, unchangeable)
    if partial is not None:  # the user's batch size, timed in full, before the other runs
        partial(users.document(samples=[sample], models=None, warnings=users.warnings))
    sizes = ScriptBatchSizes(target, users.iteration, users.device, budget, progress)
    return predict_script_sizes(sizes, sample, users.info, budget, progress)


def _why_unchangeable(found: ScriptBatchSize) -> str | None:
    """Why other batch sizes cannot be measured: no literal or option that sets the batch size."""
    if found.from_arguments is not None or (found.location is not None and found.location.editable):
        return None
    why = found.reason or (found.location.reason if found.location else None) or "no literal was found"
    return (
        f"Nothing is predicted: other batch sizes are measured by running the script again with its batch size "
        f"changed where it is set, and {why}."
    )


def _cannot_write(script: TrainingScript, script_args: tuple[str, ...]) -> None:
    """--set-batch-size where the command line sets the batch size: it is changed there."""
    given = find_script_batch_size(script.source, script.relative_path, tuple(script_args), None)
    raise EntryPointError(
        f"Cannot set the batch size in {script.relative_path}: {given.reason}; change it there.",
        path=script.relative_path,
    )


def _users_batch_size(
    script: TrainingScript,
    budget: TimingBudget,
    script_run: ScriptRun,
    timeline: bool,
    memory_capacity_bytes: int | None,
    write_batch_size: bool,
    progress: Progress,
    partial: Partial | None,
) -> _UsersRun:
    """The first run of the script, at the user's batch size: measured, broken down and stopped."""
    creation = CreationSites(CallSites(script.files))
    with script_run as run:
        progress(f"running {script.relative_path} up to its first optimizer step", 0.0)
        with creation.finding_optimizers(script.relative_path):
            with creation.recording_modules():  # where each parameter is created: its line's memory
                run.iteration()  # the script's setup and first iteration
            with watching_outermost_calls() as calls:
                run.iteration()  # a whole iteration, from one step to the next
            model, batch_size = _trained_model(script, calls, run)
            _check_batch_size_set(script, batch_size)
            written = write_batch_size and script.literal_set is not None
            if written:
                set_script_batch_size(script.path, Path(script.files.root), batch_size, script.argv)
            device = next(model.parameters()).device
            info = describe_device(device, memory_capacity_bytes)
            found = find_script_batch_size(script.source, script.relative_path, script.argv, batch_size)
            source = ScriptSource(run, model, batch_size, clock_for(device), budget)
            notes = _batch_size_notes(found, batch_size, None if written else script.literal_set)

            def first(sample: Sample, breakdown: Breakdown) -> None:
                if partial is not None:
                    partial(
                        _script_document(
                            script,
                            info,
                            found,
                            batch_size,
                            samples=[sample],
                            breakdown=breakdown,
                            models=None,
                            warnings=notes,
                        )
                    )

            progress(f"measuring batch size {batch_size}", 0.1)
            with source.live_tensors.frozen(), contextlib.closing(source), counting_gradients(model) as gradients:
                measured = measure_batch_size(
                    source,
                    IterationRecording(creation, model, device, calls.others(model)),
                    timeline=timeline,
                    on_first=first,
                )
    differing = source.work.script_warning(measured.breakdown.attribution.recorded_iterations)
    warnings = ([differing] if differing else []) + notes + measured.warnings()
    sample = measured.sample
    iteration = UsersIteration(
        batch_size, sample.micro_batches, gradients.backward_passes / source.iterations, source.cycle
    )
    return _UsersRun(script, device, info, found, measured, iteration, warnings)


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


def _check_batch_size_set(script: TrainingScript, batch_size: int) -> None:
    """That the batch size set in memory is the model's: a literal found by its kind alone may be
    another loader's (an evaluation's `batch_size=256`)."""
    literal, set_to = script.literal_set, script.batch_size_set
    if set_to is not None and set_to != batch_size:
        raise EntryPointError(
            f"Batch size {set_to} was set at {script.where_set()}, but the model got batches of {batch_size}: "
            "that is not the batch size this script trains with.",
            path=literal.path if literal else script.relative_path,
            line=literal.line if literal else None,
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
