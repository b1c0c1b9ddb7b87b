"""Mutation testing of the core, by hand-listed mutations: each is one small change of the kind a
real bug is (a boundary, a lost condition, the wrong operand), applied to the source, then the
tests that cover its module run; a mutation they do not fail on *survives* and is reported.

    .venv/bin/python scripts/mutations.py [--only NAME] [--output bench/mutations.md]

scripts/mutmut_report.py runs mutmut over the core's Python modules: every mutation it can make,
against the tests that reach each function in process. This list keeps what mutmut cannot do:
the Lua formatters (mutmut mutates Python only), and named bugs that must stay caught whatever
the tests mutmut selects (issue 16's three among them), each run against the few test files that
should catch it, subprocess tests included (about 5 minutes for the list). Every mutation must
match its source exactly once, so a list that rots fails loudly. The source is restored after
each mutant, whatever happens.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MODELS_TESTS = ("tests/test_batch_models.py", "tests/test_terminal_report.py", "tests/test_impossible_numbers.py")
RECOMMENDATION_TESTS = ("tests/test_recommendation.py", "tests/test_terminal_report.py")
RECORDER_TESTS = ("tests/test_breakdown.py", "tests/test_breakdown_edge_cases.py", "tests/test_training_loops.py")
LITERAL_TESTS = (
    "tests/test_batch_size_location.py",
    "tests/test_rewrite_safety.py",
    "tests/test_lua_units.py",
    "tests/test_bad_input.py::test_entry_point_read_as_python_reads_it",
)
SERVICE_UNIT_TESTS = ("tests/test_service_units.py",)
PARAMS_TESTS = (*SERVICE_UNIT_TESTS, "tests/test_service_stdio.py::test_wrong_parameters_get_errors_naming_them")
LUA_FORMAT_TESTS = ("tests/test_parity.py", "tests/test_lua_units.py")
OTHER_TENSOR_TESTS = ("tests/test_other_tensors.py", "tests/test_peak_memory_operation.py")


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    # predict/batch_models.py: the batch-size models
    Mutation(
        "a line missing by the threshold is curved",
        "skyline_engine/predict/batch_models.py",
        "if self.time_predictable and self.run_time.max_relative_residual > CURVED_RESIDUAL:",
        "if self.time_predictable and self.run_time.max_relative_residual >= CURVED_RESIDUAL:",
        MODELS_TESTS,
    ),
    Mutation(
        "a curved line is never said to be",
        "skyline_engine/predict/batch_models.py",
        "if self.time_predictable and self.run_time.max_relative_residual > CURVED_RESIDUAL:",
        "if self.time_predictable and self.run_time.r2 is None:",
        MODELS_TESTS,
    ),
    Mutation(
        "a flat run time predicts",
        "skyline_engine/predict/batch_models.py",
        "return self.run_time.slope > 0 and not fits_poorly(self.run_time)",
        "return self.run_time.slope >= 0 and not fits_poorly(self.run_time)",
        MODELS_TESTS,
    ),
    Mutation(
        "an inference loop waits for an optimizer",
        "skyline_engine/measure/iteration.py",
        "if steps.count or not gradients.count or _parameter_versions(self.model) != before:",
        "if steps.count or _parameter_versions(self.model) != before:",
        ("tests/test_training_loops.py",),
    ),
    Mutation(
        "a loop that updates its parameters by hand waits for an optimizer",
        "skyline_engine/measure/iteration.py",
        "if steps.count or not gradients.count or _parameter_versions(self.model) != before:",
        "if steps.count or not gradients.count:",
        ("tests/test_training_loops.py",),
    ),
    # measure/retention.py, attribute/memory_growth.py: memory kept for good
    Mutation(
        "what lives through one more iteration is kept for good",
        "skyline_engine/measure/retention.py",
        "RETENTION_ITERATIONS = 3",
        "RETENTION_ITERATIONS = 2",
        ("tests/test_memory_growth.py",),
    ),
    Mutation(
        "gradients accumulated over iterations are kept for good",
        "skyline_engine/measure/retention.py",
        "if iteration == 0 and id(storage) not in gradients:",
        "if iteration == 0:",
        ("tests/test_memory_growth.py",),
    ),
    Mutation(
        "a bounded window of outputs is kept for good",
        "skyline_engine/measure/retention.py",
        "if grown < iterations * sum(kept.values()) / 2:",
        "if grown < 0:",
        ("tests/test_memory_growth.py",),
    ),
    Mutation(
        "an in-place operation's output is a new storage",
        "skyline_engine/measure/retention.py",
        "if id(storage) not in inputs and storage not in self.created:",
        "if storage not in self.created:",
        ("tests/test_memory_growth.py",),
    ),
    Mutation(
        "a growth at the threshold leaves the peaks comparable",
        "skyline_engine/attribute/memory_growth.py",
        "return self.bytes_per_iteration >= COMPARABLE_PEAKS * peak_bytes",
        "return self.bytes_per_iteration > COMPARABLE_PEAKS * peak_bytes",
        ("tests/test_memory_growth.py",),
    ),
    Mutation(
        "a peak-memory model off its peaks is not said to be",
        "skyline_engine/predict/batch_models.py",
        "if self.peak_memory.max_relative_residual > CURVED_MEMORY_RESIDUAL:",
        "if self.peak_memory.max_relative_residual > 10 * CURVED_MEMORY_RESIDUAL:",
        MODELS_TESTS,
    ),
    Mutation(
        "R² at the threshold is poor",
        "skyline_engine/predict/batch_models.py",
        "return line.r2 is not None and line.r2 < POOR_FIT_R2 and line.max_relative_residual > CLOSE_FIT_RESIDUAL",
        "return line.r2 is not None and line.r2 <= POOR_FIT_R2 and line.max_relative_residual > CLOSE_FIT_RESIDUAL",
        (*MODELS_TESTS, "tests/test_parity.py"),
    ),
    Mutation(
        "a zero run time is predicted",
        "skyline_engine/predict/batch_models.py",
        "if not self.time_predictable or run_time is None or run_time <= 0:",
        "if not self.time_predictable or run_time is None or run_time < 0:",
        (*MODELS_TESTS, "tests/test_parity.py"),
    ),
    Mutation(
        "the usable memory itself does not fit",
        "skyline_engine/predict/batch_models.py",
        "memory <= self.usable_memory_bytes,",
        "memory < self.usable_memory_bytes,",
        (*MODELS_TESTS, "tests/test_parity.py"),
    ),
    Mutation(
        "the smallest measured is extrapolated",
        "skyline_engine/predict/batch_models.py",
        "not low <= batch_size <= high,",
        "not low < batch_size <= high,",
        (*MODELS_TESTS, "tests/test_parity.py"),
    ),
    Mutation(
        "the asymptote forgets micro-batches",
        "skyline_engine/predict/batch_models.py",
        "return self.micro_batches * 1000.0 / self.run_time.slope",
        "return 1000.0 / self.run_time.slope",
        (*MODELS_TESTS, "tests/test_training_loops.py"),
    ),
    Mutation(
        "an asymptote without fixed costs",
        "skyline_engine/predict/batch_models.py",
        "if not self.time_predictable or self.run_time.bias <= 0:",
        "if not self.time_predictable or self.run_time.bias < 0:",
        MODELS_TESTS,
    ),
    Mutation(
        "the trusted range ends at the smallest measured",
        "skyline_engine/predict/batch_models.py",
        "end = largest if self.peak_memory.quadratic else TRUSTED_FACTOR * largest",
        "end = largest if self.peak_memory.quadratic else TRUSTED_FACTOR * self.measured_batch_sizes[0]",
        MODELS_TESTS + SERVICE_UNIT_TESTS,
    ),
    Mutation(
        "the trusted range reaches a failing batch size",
        "skyline_engine/predict/batch_models.py",
        "return self.measured_batch_sizes[0], high if failing is None else min(high, failing - 1)",
        "return self.measured_batch_sizes[0], high if failing is None else min(high, failing)",
        (*MODELS_TESTS, "tests/test_parity.py"),
    ),
    # predict/peak_memory.py and analysis/probing.py: curves, and when memory is settled
    Mutation(
        "a line's miss is judged against the bytes, not their growth",
        "skyline_engine/predict/peak_memory.py",
        "tolerance = np.maximum(EXACT_SHARE * (y.max(axis=0) - y.min(axis=0)), max(ROUNDING_BYTES, slack))",
        "tolerance = np.maximum(EXACT_SHARE * y.max(axis=0), max(ROUNDING_BYTES, slack))",
        MODELS_TESTS,
    ),
    Mutation(
        "an upward curve through three batch sizes settles memory",
        "skyline_engine/analysis/probing.py",
        "            and not model.may_rise_above(asked_at, SETTLED_RESIDUAL)\n",
        "",
        ("tests/test_probing.py", "tests/test_memory_planning.py"),
    ),
    Mutation(
        "a probe past a failing batch size is tried, and predicted",
        "skyline_engine/predict/batch_models.py",
        "return any(f <= batch_size if f > users else batch_size <= f for f in failing)",
        "return False",
        ("tests/test_probing.py", "tests/test_terminal_report.py"),
    ),
    Mutation(
        "a largest fit at the trusted end is extrapolated",
        "skyline_engine/predict/batch_models.py",
        "return largest is not None and largest > TRUSTED_FACTOR * self.memory_batch_sizes[-1]",
        "return largest is not None and largest >= TRUSTED_FACTOR * self.memory_batch_sizes[-1]",
        MODELS_TESTS,
    ),
    # attribute/recorder.py: backward linking and the phases
    Mutation(
        "the last operation owns a sequence number",
        "skyline_engine/attribute/recorder.py",
        "self._forward_by_sequence.setdefault(next_sequence - 1, record)",
        "self._forward_by_sequence[next_sequence - 1] = record",
        RECORDER_TESTS,
    ),
    Mutation(
        "a closure's forward inside the step is step work",
        "skyline_engine/attribute/recorder.py",
        "stepping = self._steps_running and not torch.is_grad_enabled()",
        "stepping = self._steps_running > 0",
        RECORDER_TESTS,
    ),
    Mutation(
        "a GradScaler's work is forward",
        "skyline_engine/attribute/recorder.py",
        "or self.call_sites.runs_within(_SCALER_CODES, skip=3)",
        "or False",
        RECORDER_TESTS,
    ),
    # attribute/updates.py: the update's work outside optimizer.step()
    Mutation(
        "values computed from gradients are forward work",
        "skyline_engine/attribute/updates.py",
        "                self._derived[storage] = True",
        "                pass",
        RECORDER_TESTS,
    ),
    Mutation(
        "writing a parameter in place is forward work",
        "skyline_engine/attribute/updates.py",
        "return func._schema.is_mutable and any(",
        "return False and any(",
        RECORDER_TESTS,
    ),
    Mutation(
        "new gradients are not seen after backward",
        "skyline_engine/attribute/recorder.py",
        "            self._updates.gradients_changed()\n",
        "",
        RECORDER_TESTS,
    ),
    Mutation(
        "a tensor saved twice counts twice",
        "skyline_engine/attribute/recorder.py",
        "if producer is not None and storage not in self._saved:",
        "if producer is not None:",
        RECORDER_TESTS,
    ),
    Mutation(
        "accumulation without counting the gradients accumulated",
        "skyline_engine/attribute/recorder.py",
        "accumulates = k > 1 and accumulated == k and steps_once",
        "accumulates = k > 1 and steps_once",
        (*RECORDER_TESTS, "tests/test_recorder.py"),
    ),
    Mutation(
        "a batch split between calls is micro-batches",
        "skyline_engine/attribute/recorder.py",
        "        if sum(sizes) == batch_size:\n            return True",
        "        if sum(sizes) == -batch_size:\n            return True",
        (*RECORDER_TESTS, "tests/test_recorder.py"),
    ),
    Mutation(
        "one batch evaluated twice is micro-batches",
        "skyline_engine/attribute/recorder.py",
        "return first is not None and all(ref is not None and ref() is first for ref in firsts)",
        "return False",
        (*RECORDER_TESTS, "tests/test_recorder.py"),
    ),
    Mutation(
        "a closure's calls are micro-batches",
        "skyline_engine/attribute/recorder.py",
        "len(self.recording.iteration_starts) == 1 and not self._steps_running:",
        "len(self.recording.iteration_starts) == 1:",
        (*RECORDER_TESTS, "tests/test_recorder.py"),
    ),
    Mutation(
        "an iteration at b runs the user's micro-batches",
        "skyline_engine/predict/batch_models.py",
        "run_time *= self.samples_per_step / batch_size",
        "run_time *= 1",
        MODELS_TESTS,
    ),
    # entry/batch_size.py and entry/rewrite.py: the batch-size literal
    Mutation(
        "a batch size of 0 is a literal to edit",
        "skyline_engine/entry/batch_size.py",
        'return None if value > 0 else f"the default is `{text}`, but the batch size must be greater than 0"',
        'return None if value >= 0 else f"the default is `{text}`, but the batch size must be greater than 0"',
        LITERAL_TESTS,
    ),
    Mutation(
        "the first def of the name, not the one that ran",
        "skyline_engine/entry/batch_size.py",
        "            if first_line == code.co_firstlineno:\n                return node",
        "            if True:\n                return node",
        LITERAL_TESTS,
    ),
    Mutation(
        "keyword-only defaults are not looked at",
        "skyline_engine/entry/batch_size.py",
        "            return default  # None when the keyword-only parameter has no default",
        "            return None",
        LITERAL_TESTS,
    ),
    Mutation(
        "a file changed meanwhile is written anyway",
        "skyline_engine/entry/rewrite.py",
        "        if decode_source(data, relative) != entry.source:\n            raise",
        "        if False:\n            raise",
        LITERAL_TESTS,
    ),
    Mutation(
        "offsets ignore the file's encoding (its BOM, latin-1)",
        "skyline_engine/entry/rewrite.py",
        "return len(text[:index].encode(encoding))",
        'return len(text[:index].encode("utf-8"))',
        LITERAL_TESTS,
    ),
    # service/tokens.py and service/params.py: the token check, the protocol's parameters
    Mutation(
        "a prefix of the token opens",
        "skyline_engine/service/tokens.py",
        'return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8", "surrogatepass"))',
        "return expected.startswith(given)",
        (*SERVICE_UNIT_TESTS, "tests/test_service_tcp.py"),
    ),
    Mutation(
        "batch size 0 is accepted",
        "skyline_engine/service/params.py",
        "if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:",
        "if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BATCH_SIZE:",
        PARAMS_TESTS,
    ),
    Mutation(
        "True is a batch size",
        "skyline_engine/service/params.py",
        "if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:",
        "if not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:",
        PARAMS_TESTS,
    ),
    Mutation(
        "the largest world size is refused",
        "skyline_engine/service/params.py",
        "if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORLD_SIZE:",
        "if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < MAX_WORLD_SIZE:",
        PARAMS_TESTS,
    ),
    Mutation(
        "predict warns at the smallest measured",
        "skyline_engine/service/dispatcher.py",
        "        if batch_size < low:",
        "        if batch_size <= low:",
        SERVICE_UNIT_TESTS,
    ),
    # lua/skyline/format.lua and models.lua: what the editor shows
    Mutation(
        "1024 bytes stay bytes",
        "lua/skyline/format.lua",
        "while math.abs(value) >= 1024 and unit < #UNITS do",
        "while math.abs(value) > 1024 and unit < #UNITS do",
        LUA_FORMAT_TESTS,
    ),
    Mutation(
        "two decimals above bytes",
        "lua/skyline/format.lua",
        "return fixed(value, 1) .. ' ' .. UNITS[unit]",
        "return fixed(value, 2) .. ' ' .. UNITS[unit]",
        LUA_FORMAT_TESTS,
    ),
    Mutation(
        "ties round away from zero",
        "lua/skyline/format.lua",
        "  if not tie then\n    return string.format(format, value)\n  end",
        "  if true then\n    return string.format(format, value)\n  end",
        LUA_FORMAT_TESTS,
    ),
    Mutation(
        "thousands separators lost",
        "lua/skyline/format.lua",
        "return sign .. digits:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', '')",
        "return sign .. digits",
        (*LUA_FORMAT_TESTS, "tests/test_nvim_editor.py"),
    ),
    Mutation(
        "the editor predicts without micro-batches",
        "lua/skyline/models.lua",
        "local samples_per_second = run_time_ms and (models.micro_batches or 1) * b / run_time_ms * 1000 or nil",
        "local samples_per_second = run_time_ms and b / run_time_ms * 1000 or nil",
        LUA_FORMAT_TESTS,
    ),
    Mutation(
        "the editor predicts a zero run time",
        "lua/skyline/models.lua",
        "if not M.time_predictable(time) or run_time_ms <= 0 then",
        "if not M.time_predictable(time) or run_time_ms < 0 then",
        LUA_FORMAT_TESTS,
    ),
    # The tensors alive at the peak (attribute/other_tensors.py) and the engine's own hold on them
    Mutation(
        "the engine keeps the model's whole output",
        "skyline_engine/measure/iteration.py",
        "        self._last_output = None\n        if isinstance(output, torch.Tensor) and output.numel() == 1:",
        "        self._last_output = output\n        if False:",
        OTHER_TENSOR_TESTS,
    ),
    Mutation(
        "a storage freed by the peak's operation is alive there",
        "skyline_engine/attribute/other_tensors.py",
        "if made_at <= index < freed_at and",
        "if made_at <= index <= freed_at and",
        OTHER_TENSOR_TESTS,
    ),
    Mutation(
        "a parameter's gradient is another tensor",
        "skyline_engine/attribute/recorder.py",
        "if self.lifetimes is not None and parameter.grad is not None:",
        "if False:",
        OTHER_TENSOR_TESTS,
    ),
    Mutation(
        "an activation kept for backward is another tensor",
        "skyline_engine/attribute/recorder.py",
        "            if self.lifetimes is not None:\n                self.lifetimes.accounted(storage)",
        "            if False:\n                self.lifetimes.accounted(storage)",
        OTHER_TENSOR_TESTS,
    ),
    Mutation(
        "a held copy's weights stand at no line",
        "skyline_engine/attribute/breakdown.py",
        "if not contexts and index > 0:",
        "if False:",
        (
            "tests/test_training_loops.py::test_averaged_copies_updated_after_the_step_are_step_time_their_weights_weights",
        ),
    ),
    Mutation(
        "time inside optimizer steps is never told apart",
        "skyline_engine/analysis/breakdown_notes.py",
        "if in_steps is not None and in_steps >= MOSTLY and steps:",
        "if False:",
        ("tests/test_untracked_time.py",),
    ),
    Mutation(
        "a step's operations count as time between them",
        "skyline_engine/attribute/recorder.py",
        "            self.recording.steps_operations_ns += end - start",
        "            pass",
        ("tests/test_untracked_time.py",),
    ),
    # Batch sizes that divide the samples per optimizer step
    Mutation(
        "the best batch size need not divide the samples per step",
        "skyline_engine/predict/batch_models.py",
        "return dividing_at_most(self.samples_per_step, best) if self.samples_per_step else best",
        "return best",
        MODELS_TESTS,
    ),
    Mutation(
        "the advice need not divide the samples per step",
        "skyline_engine/predict/recommendation.py",
        "    if not per_step or per_step % batch_size == 0:\n        return batch_size, why",
        "    if True:\n        return batch_size, why",
        RECOMMENDATION_TESTS,
    ),
    Mutation(
        "times that fall with the batch size advise the fastest measured",
        "skyline_engine/predict/recommendation.py",
        "if any(later < earlier * (1 - FALLING_TIMES)",
        "if False and any(later < earlier * (1 - FALLING_TIMES)",
        RECOMMENDATION_TESTS,
    ),
    # One recommendation, measured (issue "Numbers you can act on", item 4) and the line where it bends (item 5)
    Mutation(
        "a batch size measured within the noise is advised",
        "skyline_engine/predict/recommendation.py",
        "    if gain < 1 + needed:",
        "    if gain < 1:",
        RECOMMENDATION_TESTS,
    ),
    Mutation(
        "the measurements' spread is not noise",
        "skyline_engine/predict/recommendation.py",
        "return max(NOISE_FLOOR, (spread(yours) + spread(theirs)) / 2)",
        "return NOISE_FLOOR",
        RECOMMENDATION_TESTS,
    ),
    Mutation(
        "a batch size not timed is advised from the line",
        "skyline_engine/predict/recommendation.py",
        "    if pair is None:",
        "    if pair is None and False:",
        RECOMMENDATION_TESTS,
    ),
    Mutation(
        "the knee is advised as the line puts it",
        "skyline_engine/predict/recommendation.py",
        "min(_doubling(users, knee), ceiling)",
        "min(knee, ceiling)",
        RECOMMENDATION_TESTS,
    ),
    Mutation(
        "a smaller batch size than the user's is suggested",
        "skyline_engine/predict/recommendation.py",
        "    if knee <= users:",
        "    if knee < 1:",
        RECOMMENDATION_TESTS,
    ),
    Mutation(
        "a probe below the line leaves the trusted range as it was",
        "skyline_engine/analysis/session.py",
        "            if shortfall is not None:",
        "            if False:",
        RECOMMENDATION_TESTS,
    ),
    Mutation(
        "the probe's drift is not cancelled by the user's batch size beside it",
        "skyline_engine/predict/recommendation.py",
        "shortfall = 1 - (probe.samples_per_second / yours.samples_per_second) / (predicted / before)",
        "shortfall = 1 - probe.samples_per_second / predicted",
        RECOMMENDATION_TESTS,
    ),
    # The first GPU run's findings (an H200): what CUDA's allocator counts that is no tensor.
    Mutation(
        "a kernel's scratch space may make a quadratic",
        "skyline_engine/predict/peak_memory.py",
        "missed = ~_on_lines(x, y, slack) & ~_on_lines(x, held, slack)",
        "missed = ~_on_lines(x, y, slack)",
        MODELS_TESTS,
    ),
    Mutation(
        "the allocator's unsplit blocks are counted exactly",
        "skyline_engine/predict/peak_memory.py",
        "max(ROUNDING_BYTES, slack))",
        "ROUNDING_BYTES)",
        MODELS_TESTS,
    ),
    Mutation(
        "more cuBLAS workspaces than untracked memory",
        "skyline_engine/attribute/breakdown.py",
        "held = min(workspace_bytes, self.untracked.memory_bytes)",
        "held = workspace_bytes",
        ("tests/test_breakdown.py",),
    ),
    Mutation(
        "fitting the breakdown forgets the workspaces",
        "skyline_engine/attribute/breakdown.py",
        "untracked=replace(self.untracked, run_time_ms=max(0.0, run_time_ms - attributed_ms)),",
        "untracked=Untracked(max(0.0, run_time_ms - attributed_ms), self.untracked.memory_bytes),",
        ("tests/test_breakdown.py",),
    ),
    Mutation(
        "the GPU's slowdown explained as the CPU's",
        "skyline_engine/analysis/breakdown_notes.py",
        "{_GPU_SLOWDOWN if on_gpu else _CPU_SLOWDOWN}",
        "{_CPU_SLOWDOWN}",
        MODELS_TESTS,
    ),
]


def module_of(mutation: Mutation) -> str:
    return mutation.path


def run(mutation: Mutation, timeout_s: float) -> tuple[bool, float, str]:
    """(killed, seconds, the tests' last line) for one mutant; the source restored afterwards."""
    path = REPO / mutation.path
    original = path.read_text(encoding="utf-8")
    if original.count(mutation.old) != 1:
        raise SystemExit(
            f"mutation {mutation.name!r}: its text is in {mutation.path} {original.count(mutation.old)} times, not once"
        )
    started = time.perf_counter()
    try:
        path.write_text(original.replace(mutation.old, mutation.new), encoding="utf-8")
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            *mutation.tests,
        ]
        try:
            result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False)
            last = (result.stdout.strip().splitlines() or [""])[-1]
            killed = result.returncode != 0
        except subprocess.TimeoutExpired:
            last, killed = f"timed out after {timeout_s:g} s", True
    finally:
        path.write_text(original, encoding="utf-8")
    return killed, time.perf_counter() - started, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the mutations whose name contains this")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "mutations.md")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or args.only in m.name]
    outcomes = []
    for mutation in chosen:
        killed, seconds, last = run(mutation, args.timeout)
        outcomes.append((mutation, killed, seconds, last))
        print(
            f"{'killed  ' if killed else 'SURVIVED'} {seconds:6.1f} s  {mutation.path}: {mutation.name}  ({last})",
            flush=True,
        )
    report = markdown(outcomes)
    if not args.only:
        args.output.write_text(report, encoding="utf-8")
    print(report)
    return 0 if all(killed for _, killed, _, _ in outcomes) else 1


def markdown(outcomes: list[tuple[Mutation, bool, float, str]]) -> str:
    by_module: dict[str, list[bool]] = defaultdict(list)
    for mutation, killed, _, _ in outcomes:
        by_module[module_of(mutation)].append(killed)
    lines = [
        "# Mutation testing (python scripts/mutations.py)",
        "",
        "Hand-listed mutations of the core (see the script's docstring), each run against the tests of its module.",
        "",
        "| module | mutations | survived | survival |",
        "|---|---|---|---|",
    ]
    for module, results in by_module.items():
        survived = results.count(False)
        lines.append(f"| `{module}` | {len(results)} | {survived} | {survived / len(results):.0%} |")
    total = [killed for _, killed, _, _ in outcomes]
    lines.append(f"| all | {len(total)} | {total.count(False)} | {total.count(False) / len(total):.0%} |")
    lines += ["", "| mutation | module | outcome | the tests' last line |", "|---|---|---|---|"]
    for mutation, killed, seconds, last in outcomes:
        outcome = "killed" if killed else "**survived**"
        lines.append(f"| {mutation.name} | `{mutation.path}` | {outcome} ({seconds:.0f} s) | {last} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
