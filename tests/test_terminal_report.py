"""The terminal report's first lines answer how fast, how much memory and what batch size to use.

The measurements are written here (no timing: the numbers must be exact), the document and its
models are the engine's, and the report is the one `skyline profile` prints. The batch size to use
is the document's `models.recommendation` (predict/recommendation.py): a batch size the models
suggest is recommended only once timed beside the user's, which these documents say with `checks`
(the times the confirming step would have measured).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from skyline_engine.analysis.assembly import build_document
from skyline_engine.attribute.breakdown import Attribution, Breakdown, OperationNode, Untracked
from skyline_engine.measure.device import DeviceInfo
from skyline_engine.measure.iteration import Sample
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.measure.timing import TimingStats
from skyline_engine.predict.batch_models import BatchSizeModels
from skyline_engine.render.terminal import render_report
from skyline_engine.units import format_bytes
from skyline_engine.vocabulary import FORWARD_BACKWARD

MEASURED = (64, 128, 256)
GiB = 1 << 30


def run_time(slope_ms: float, bias_ms: float) -> tuple[float, ...]:
    return tuple(slope_ms * b + bias_ms for b in MEASURED)


def document(
    times,
    capacity=GiB,
    batch_size=128,
    with_models=True,
    reserved=None,
    backward=True,
    recorded_ms=2.0,
    failing=(),
    samples_per_step=None,
    device=None,
    checks=None,
    between_ms=None,
    device_time=None,
):
    """At each measured batch size b: `times`, and a peak of 1000 b + 8,000,000 bytes in the
    forward and backward pass (`reserved` more bytes held by a CUDA allocator, when given); its
    recorded iteration's operations take `recorded_ms`, all at the user's lines, half of it
    forward and half backward work (or all forward without `backward`); the user's code failed at
    the batch sizes `failing`; with `samples_per_step`, it accumulates to that many samples a step,
    and `times` are one micro-batch's; `device` a torch device other than the CPU; `checks`, the
    time at each batch size the confirming step timed beside the user's ({batch size: ms});
    `between_ms`, the Python between its operations at their fastest (None: not measured);
    `device_time`, what an operation's time is (`attribution.device_time`)."""

    def measurement(b: int, ms: float) -> Sample:
        reserved_bytes = None if reserved is None else 1000 * b + 8_000_000 + reserved
        memory = MemoryProfile(0, (1000 * b + 8_000_000,), ("addmm",), ((0, FORWARD_BACKWARD),), reserved_bytes)
        return Sample(b, TimingStats(ms, 0.1, 20, 1), memory)

    samples = [measurement(b, t) for b, t in zip(MEASURED, times)]
    models = BatchSizeModels.fit(
        [s.batch_size for s in samples],
        [s.run_time_ms for s in samples],
        {s.batch_size: s.memory for s in samples},
        capacity,
        failing=failing,
        samples_per_step=samples_per_step,
    )
    backward_ms = recorded_ms / 2 if backward else 0.0
    recorded = OperationNode("iteration", "", "module", forward_ms=recorded_ms - backward_ms, backward_ms=backward_ms)
    breakdown = Breakdown(
        [],
        recorded,
        [],
        [],
        Untracked(0.0, 0),
        Attribution(1, recorded_ms, recorded_ms, None, 1.0, between_operations_ms=between_ms, device_time=device_time),
    )
    return build_document(
        project_root="/nowhere",
        entry_point="entry_point.py",
        torch_version=torch.__version__,
        device=DeviceInfo(device or torch.device("cpu"), "a CPU" if device is None else "a GPU", capacity, "user"),
        batch_size=batch_size,
        samples=samples if with_models else [s for s in samples if s.batch_size == batch_size],
        breakdown=breakdown,
        models=models if with_models else None,
        batch_size_location=None,
        warnings=models.warnings(),
        checks=[measurement(b, ms) for b, ms in (checks or {}).items()],
    ).to_dict()


CUDA = torch.device("cuda", 0)  # a device object only: nothing runs on it


def summary(doc) -> list[str]:
    report = render_report(doc)
    header, rest = report.split("\n\n", 1)
    assert header.startswith(f"Skyline · entry_point.py · batch size {doc['batch_size']} · CPU (a CPU), torch ")
    return rest.split("\n\n", 1)[0].splitlines()


def on_the_line(slope_ms: float, bias_ms: float, *sizes: int) -> dict[int, float]:
    """The times the line says at `sizes` and at the user's 128: checks that found it true."""
    return {b: slope_ms * b + bias_ms for b in (128, *sizes)}


def measured_rate(b: int, ms: float) -> str:
    return f"{b / ms * 1000:,.0f} samples/s (measured)"


def faster(b: int, ms: float, yours_ms: float) -> str:
    """How the report compares b's measured throughput with the user's (128) timed beside it."""
    ratio = (b / ms) / (128 / yours_ms)
    return (
        f"{ratio:.1f}× yours (128) timed beside it"
        if ratio >= 2
        else f"{ratio - 1:.0%} faster than yours (128) timed beside it"
    )


def test_the_first_lines_say_how_fast_how_much_memory_and_the_batch_size_to_use():
    # 1/64 ms a sample + 0.75 ms: 46,545 samples/s at 128, approaching 64,000 samples/s. The knee
    # (432) rounded up to 128 doubled: 512, timed beside 128.
    doc = document(run_time(1 / 64, 0.75), checks=on_the_line(1 / 64, 0.75, 512))
    knee = doc["models"]["throughput_knee_batch_size"]
    assert knee in (432, 433)  # 9 × 0.75 × 64, give or take the fit's last bit
    assert summary(doc) == [
        "Speed        46,545 samples/s at batch size 128: 2.75 ms per iteration (mean of 20 timed, IQR 0.10 ms)",
        "Memory       7.8 MiB peak of 1.0 GiB planned for █░░░░░░░░░░░░░░░░░░░ 0.8%, reached in the forward and "
        "backward pass",
        "Batch size   use 512 for 58,514 samples/s (measured), 26% faster than yours (128) timed beside it",
        "             it reaches 90% of the 64,000 samples/s this model approaches: larger batch sizes buy little "
        "speed for their memory",
        f"Largest fit  more than 1,024: the memory model says {doc['models']['max_batch_size']:,}, set by the "
        "forward and backward pass, far beyond the measurements (10% of memory kept free)",
    ]
    # The chart's row says which batch size is recommended.
    rows = render_report(doc).split("Batch sizes, measured and predicted\n")[1].splitlines()
    assert [row.split()[0] for row in rows if "recommended" in row] == ["512"]
    # Not timed, it is not recommended.
    assert summary(document(run_time(1 / 64, 0.75)))[2] == (
        "Batch size   none to recommend: 512, which the models suggest, was not timed: profile with --batch-size 512 "
        "to measure it"
    )


def test_what_a_cuda_allocator_reserved_stands_beside_the_peak():
    doc = document(run_time(1 / 64, 0.75), reserved=4 << 20)
    assert doc["iteration"]["peak_memory_reserved_bytes"] == 128_000 + 8_000_000 + (4 << 20)
    assert summary(doc)[1] == (
        "Memory       7.8 MiB peak (11.8 MiB reserved by the allocator) of 1.0 GiB planned for "
        "█░░░░░░░░░░░░░░░░░░░ 0.8%, reached in the forward and backward pass"
    )
    assert document(run_time(1 / 64, 0.75))["iteration"]["peak_memory_reserved_bytes"] is None


def test_the_line_where_memory_peaked_follows_the_phase():
    doc = document(run_time(1 / 64, 0.75))
    doc["peak_memory_operation"] = {"operation": "addmm", "phase": "backward", "path": "model.py", "line": 12}
    lines = summary(doc)
    assert lines[1].endswith("reached in the forward and backward pass,")
    assert lines[2] == "             at model.py:12 (addmm, backward)"
    doc["peak_memory_operation"] = {"operation": "empty", "phase": "forward", "path": None, "line": None}
    assert summary(doc)[1].endswith("reached in the forward and backward pass")  # no line of the project: none named


def test_the_other_tensors_alive_at_the_peak_are_named_by_line_the_notable_ones():
    doc = document(run_time(1 / 64, 0.75))
    peak = doc["iteration"]["peak_memory_bytes"]
    other_tensors = [
        {"path": "model.py", "line": 12, "phase": "backward", "bytes": peak // 4},  # 25%: gradients
        {"path": "train.py", "line": 30, "phase": "forward", "bytes": peak // 8},  # logits the code holds
        {"path": "model.py", "line": 12, "phase": "forward", "bytes": peak // 16},
        {"path": "train.py", "line": 31, "phase": "optimizer", "bytes": peak // 100},  # 1%: left out
    ]
    doc["peak_memory_operation"] = {
        "operation": "_log_softmax_backward_data",
        "phase": "backward",
        "path": "model.py",
        "line": 12,
        "other_tensors": other_tensors,
    }
    sizes = [format_bytes(t["bytes"]) for t in other_tensors]
    lines = summary(doc)
    assert lines[2] == "             at model.py:12 (_log_softmax_backward_data, backward);"
    assert lines[3] == (
        f"             other tensors alive there from model.py:12: {sizes[0]} made in backward, {sizes[2]} of "
        f"forward outputs; from train.py:30: {sizes[1]} of forward outputs"
    )
    doc["peak_memory_operation"]["other_tensors"] = other_tensors[3:]  # none notable: nothing more is said
    assert summary(doc)[2] == "             at model.py:12 (_log_softmax_backward_data, backward)"


def test_the_memory_line_says_what_is_alive_at_the_peak_in_parts_that_add_up_to_it():
    # A peak of 10 MiB inside the optimizer step: weights, gradients, Adam's two moments, no
    # activations (backward freed them) and the step's temporaries.
    doc = document(run_time(1 / 64, 0.75))
    doc["iteration"].update(peak_memory_phase="optimizer", peak_memory_bytes=10 << 20)
    doc["peak_memory_parts"] = {
        "weights_bytes": 2 << 20,
        "gradients_bytes": 2 << 20,
        "optimizer_state_bytes": 4 << 20,
        "activations_bytes": 0,
        "other_bytes": 2 << 20,
    }
    said = " " * 13 + "weights 2.0 MiB, gradients 2.0 MiB, optimizer state 4.0 MiB, activations 0 B, "
    said += "other tensors 2.0 MiB"
    doc["peak_memory_operation"] = {"operation": "div", "phase": "optimizer", "path": "train.py", "line": 9}
    lines = summary(doc)
    assert lines[1].endswith("reached in the optimizer step,")
    assert lines[2:4] == ["             at train.py:9 (div):", said]
    # The other tensors worth naming follow the parts.
    step = {"path": "train.py", "line": 9, "phase": "optimizer", "bytes": 2 << 20}
    doc["peak_memory_operation"]["other_tensors"] = [step]
    assert summary(doc)[3:5] == [
        said + ";",
        "             other tensors alive there from train.py:9: 2.0 MiB made in the step",
    ]
    # A peak before the first operation has no line: the parts follow the phase.
    doc["peak_memory_operation"] = None
    lines = summary(doc)
    assert lines[1].endswith("reached in the optimizer step:") and lines[2] == said


def test_an_iteration_without_backward_work_has_a_forward_pass_alone():
    # Inference or evaluation: the phase that starts with the first module call has no backward pass.
    lines = summary(document(run_time(1 / 64, 0.75), backward=False, checks=on_the_line(1 / 64, 0.75, 512)))
    assert lines[1].endswith("0.8%, reached in the forward pass")
    assert lines[4].startswith("Largest fit  more than 1,024: the memory model says ")
    assert lines[4].endswith(", set by the forward pass, far beyond the measurements (10% of memory kept free)")
    assert "backward" not in "\n".join(lines)


def test_when_memory_runs_out_before_the_knee_the_largest_that_fits_is_advised():
    # Room for 240 samples (usable memory 1000 b + 8,000,000 bytes at 240): the knee (288) lies beyond.
    capacity = math.ceil((1000 * 240 + 8_000_000) / 0.9)
    doc = document(run_time(1 / 64, 0.5), capacity=capacity, checks={128: 2.5, 240: 4.0})
    assert doc["models"]["max_batch_size"] == 240 < doc["models"]["throughput_knee_batch_size"]
    assert summary(doc)[2:4] == [
        f"Batch size   use 240 for {measured_rate(240, 4.0)}, {faster(240, 4.0, 2.5)}",
        "             the largest predicted to fit: memory runs out before throughput levels off",
    ]
    # Room for 208 samples: predicted 8% faster than the user's, too little to be worth timing.
    doc = document(run_time(1 / 64, 0.5), capacity=9_120_000)
    assert doc["models"]["max_batch_size"] == 208
    assert summary(doc)[2] == (
        "Batch size   none to recommend: 208 (the largest predicted to fit) is predicted to run only 8% faster than "
        "yours: a change must be at least 10% faster to clear the noise"
    )


def test_a_knee_beyond_the_measurements_is_advised_as_measured_at_the_trusted_ranges_end():
    # 1/64 ms a sample + 8 ms: the knee lies at 4,608, beyond 4 × 256; 1,024 timed beside 128.
    doc = document(run_time(1 / 64, 8.0), checks={128: 10.0, 1024: 24.0})
    lines = summary(doc)
    assert lines[2] == f"Batch size   use 1,024 for {measured_rate(1024, 24.0)}, {faster(1024, 24.0, 10.0)}"
    knee = doc["models"]["throughput_knee_batch_size"]
    assert lines[3] == "             the largest of the trusted range (up to 4× 256, the largest measured);"
    indent = " " * 13
    assert (
        lines[4]
        == f"{indent}throughput still rises beyond it (90% of the 64,000 samples/s this model approaches at {knee:,});"
    )
    assert lines[5] == "             profile with --batch-size 1024 to measure further"


def test_past_a_batch_size_the_code_fails_at_nothing_is_predicted_or_advised():
    # As above, but the user's code failed at 300: the chart had predicted 512 and beyond, to the
    # largest that fits (a fails-at-16 model's chart: 67,095 samples/s at 16); 299, timed, is the advice.
    doc = document(run_time(1 / 64, 8.0), failing=(300,), checks={128: 10.0, 299: 12.7})
    assert [p["batch_size"] for p in doc["predictions"]] == [64, 128, 256, 299]
    assert [p["batch_size"] for p in document(run_time(1 / 64, 8.0))["predictions"]][3:6] == [512, 1024, 2048]
    lines = summary(doc)
    assert lines[2] == f"Batch size   use 299 for {measured_rate(299, 12.7)}, {faster(299, 12.7, 10.0)}"
    assert lines[3] == "             the largest below 300, where your code fails (see the warnings);"
    assert lines[4].startswith("             throughput would still rise beyond it (90% of the 64,000 samples/s")
    assert lines[5].startswith("Largest fit  more than 299: the memory model says ")
    assert lines[6] == "             your code fails at batch size 300 (see the warnings)"


def _module(path: str, forward_ms: float, backward_ms: float, *children: dict) -> dict:
    name = path.rsplit(".", 1)[-1]
    return {"name": name, "kind": "module", "module": path, "forward_ms": forward_ms, "backward_ms": backward_ms,
            "children": list(children)}  # fmt: skip


def _line(number: int, forward_ms: float, backward_ms: float) -> dict:
    no_step = {"forward_ms": forward_ms, "backward_ms": backward_ms, "step_ms": 0.0}
    return {"path": "entry_point.py", "line": number, **no_step, "memory_bytes": 0, "inclusive": no_step}


def test_a_line_that_runs_most_of_the_iteration_in_library_code_is_broken_down_by_module():
    # A model from a library, called at one line of the entry point: 2.75 ms an iteration, 2.2 ms of
    # it at that line. Modules under 5 % (0.1375 ms) are left out with what they hold; operations too.
    doc = document(run_time(1 / 64, 0.75))
    addmm = {"name": "addmm", "kind": "operation", "module": "model.encoder.0", "forward_ms": 0.5, "backward_ms": 0.5}
    doc["lines"] = [_line(22, 1.0, 1.2), _line(23, 0.1, 0.2)]
    embed = _module("model.embed", 0.05, 0.05, _module("model.embed.inner", 0.05, 0.05))
    layers = _module("model.encoder.0", 0.5, 0.5, addmm), _module("model.encoder.1", 0.3, 0.5)
    encoder = _module("model.encoder", 0.8, 1.0, *layers)
    doc["operations"]["children"] = [_module("model", 1.0, 1.2, embed, encoder, _module("model.head", 0.15, 0.15))]
    report = render_report(doc)
    section = next(part for part in report.split("\n\n") if part.startswith("Modules"))
    assert section.splitlines()[0] == (
        "Modules (entry_point.py:22 runs 80.0% of the iteration itself, in library code; the modules that took at "
        "least 5% of it, in the order they ran)"
    )
    assert section.splitlines()[1:] == [
        "  forward   backward   share   module",
        "  1.00 ms    1.20 ms   80.0%   model",
        "  0.80 ms    1.00 ms   65.5%   model.encoder",
        "  0.50 ms    0.50 ms   36.4%   model.encoder.0",
        "  0.30 ms    0.50 ms   29.1%   model.encoder.1",
        "  0.15 ms    0.15 ms   10.9%   model.head",
    ]
    # Spread over the project's lines, the lines say where the time goes: no modules.
    doc["lines"] = [_line(22, 0.6, 0.6), _line(23, 0.5, 0.5)]
    assert "\nModules (" not in render_report(doc)


def test_lines_holding_much_memory_follow_the_hottest_though_they_cost_no_time():
    # Eleven timed lines fill the hottest ten; an optimizer's state (a quarter of the peak) and a
    # module's weights (a tenth) cost no time and come next, most memory first; a line holding
    # 1 % of the peak, and the eleventh timed line, are left out.
    doc = document(run_time(1 / 64, 0.75))
    peak = doc["iteration"]["peak_memory_bytes"]
    timed = [_line(30 + i, 0.1 * (11 - i), 0.0) for i in range(11)]
    holders = {12: peak // 10, 40: peak // 4, 13: peak // 100}
    memory_only = [{**_line(number, 0.0, 0.0), "memory_bytes": size} for number, size in holders.items()]
    doc["lines"] = timed + memory_only
    section = next(part for part in render_report(doc, 200).split("\n\n") if part.startswith("Hottest lines"))
    places = [row.split()[0] for row in section.splitlines()[2:]]
    hottest = [f"entry_point.py:{30 + i}" for i in range(10)]
    assert places == [*hottest, "entry_point.py:40", "entry_point.py:12", "untracked"]


def test_the_memory_line_says_how_much_of_the_peak_cublas_workspaces_hold():
    # On an H200, 65 MiB of the default example's 72.7 MiB peak were cuBLAS's workspaces, which no
    # tensor holds: the memory line says so where the document measured them (CUDA).
    doc = document(run_time(1 / 64, 0.75), reserved=2 << 20)
    doc["untracked"] = {"run_time_ms": 0.1, "memory_bytes": 69_311_078, "workspace_bytes": 68_157_440}
    memory = summary(doc)[1]
    peak, reserved = (format_bytes(doc["iteration"][k]) for k in ("peak_memory_bytes", "peak_memory_reserved_bytes"))
    assert memory.startswith(f"Memory       {peak} peak (65.0 MiB of it cuBLAS workspaces; {reserved} reserved by")
    for measured in (0, None):  # the CPU's documents, and those from before the field
        doc["untracked"]["workspace_bytes"] = measured
        if measured is None:
            del doc["untracked"]["workspace_bytes"]
        assert summary(doc)[1].startswith(f"Memory       {peak} peak ({reserved} reserved by the allocator) of ")


def test_the_advised_batch_size_divides_the_samples_per_step():
    # 1/64 ms a sample + 0.75 ms a micro-batch: throughput reaches 90% of its limit at 432. With
    # 1,000 samples a step, 432 micro-batches of `1000 // 432` would step after 864: the advice
    # is the next batch size up that divides 1,000, or, where memory ends first, the next down.
    line = run_time(1 / 64, 0.75)
    checks = on_the_line(1 / 64, 0.75, 500, 250, 300, 256)

    def use(b: int) -> str:
        return f"Batch size   use {b} for {measured_rate(b, checks[b])}, {faster(b, checks[b], checks[128])}"

    advised = summary(document(line, samples_per_step=1000, checks=checks))[2:5]
    assert advised == [
        use(500),
        "             it reaches 90% of the 64,000 samples/s this model approaches: larger batch sizes buy little "
        "speed for their memory;",
        "             500 divides your 1,000 samples per optimizer step, 432 does not",
    ]
    room_for = {b: math.ceil((1000 * b + 8_000_000) / 0.9) for b in (450, 300)}  # the capacity that fits b at most
    advised = summary(document(line, capacity=room_for[450], samples_per_step=1000, checks=checks))[2:5]
    assert advised == [
        use(250),
        "             the largest up to 450 that divides your 1,000 samples per optimizer step;",
        "             throughput reaches 90% of the 64,000 samples/s this model approaches at 432",
    ]
    advised = summary(document(line, capacity=room_for[300], samples_per_step=1000, checks=checks))[2:5]
    assert advised == [
        use(250),
        "             250 divides your 1,000 samples per optimizer step, 300 does not;",
        "             the largest predicted to fit: memory runs out before throughput levels off",
    ]
    assert summary(document(line, capacity=room_for[300], checks=checks))[2] == use(300)
    # 256 samples a step end the trusted range below the knee: one micro-batch takes them all. It
    # was timed with the models: their measurements decide.
    assert summary(document(line, samples_per_step=256))[2:4] == [
        use(256),
        "             all your 256 samples per optimizer step in one micro-batch: no accumulation",
    ]


def test_past_the_knee_no_change_is_recommended():
    # The knee falls below the smallest measured: throughput has levelled off by then.
    doc = document(run_time(1.0, 0.5), batch_size=64)
    assert doc["models"]["throughput_knee_batch_size"] < 64
    assert summary(doc)[2] == (
        "Batch size   none to recommend: yours is at or past the knee: throughput reaches 90% of the 1,000 "
        "samples/s this model approaches at 5, and larger batch sizes buy little speed for their memory"
    )


def test_no_batch_size_is_advised_when_time_does_not_follow_it():
    doc = document((30.0, 20.0, 10.0))
    lines = summary(doc)
    assert lines[2:4] == [
        "Batch size   none to recommend: the iteration time did not follow the batch size (see the warnings);",
        "             re-run on a quiet machine",
    ]


def test_where_the_line_predicts_nothing_the_fastest_measured_is_advised():
    # A small model's times grow too unevenly for a line (R² 0.89, missing one by 4 %) while its
    # throughput nearly doubles with each doubling: the fastest measured, and where to look next.
    doc = document((0.70, 0.80, 0.86))
    assert doc["models"]["best_batch_size"] is None
    assert summary(doc)[2:5] == [
        f"Batch size   use 256 for {measured_rate(256, 0.86)}, {faster(256, 0.86, 0.80)}",
        "             the fastest measured: the run-time line predicts no other batch size (see the warnings);",
        "             profile with --batch-size 512 to measure further",
    ]
    # A GPU bound by kernel launches: the same time at every batch size measured.
    flat = summary(document((5.0, 5.0, 5.0)))
    assert flat[2] == "Batch size   use 256 for 51,200 samples/s (measured), 2.0× yours (128) timed beside it"
    # Throughputs within the noise of each other: nothing worth changing to.
    assert summary(document((10.0, 10.3, 20.5)))[2] == (
        "Batch size   none to recommend: 256, which the models suggest, ran no faster than yours (128) timed beside "
        "it: a change must be at least 10% faster to clear the noise"
    )


def test_no_batch_size_is_advised_from_one_measurement():
    doc = document(run_time(1 / 64, 0.5), with_models=False)
    lines = summary(doc)
    assert lines[2] == "Batch size   none to recommend: only batch size 128 could be measured (see the warnings)"
    assert len(lines) == 3


ACTION = re.compile(r"(?i)re-run|--batch-size|--memory-capacity|prefer|stay below|move|lower the")


@pytest.mark.parametrize(
    "times",
    [(30.0, 20.0, 10.0), (10.0, 40.0, 22.0), (2.0, 10.0, 26.0), run_time(1 / 64, 0.5)],
    ids=["falling", "noise", "crossing_zero", "extrapolated_memory"],
)
def test_each_warning_says_what_to_do(times):
    doc = document(times)
    assert doc["warnings"]
    for warning in doc["warnings"]:
        assert ACTION.search(warning), warning
    report = render_report(doc)
    # Right after the answers, before the detail.
    assert report.split("\n\n")[2].startswith("Warnings\n")


def test_the_breakdowns_warnings_give_the_documents_own_figures():
    # Operations recorded in 4 ms against an iteration measured at 2.75 ms (at batch size 128): the
    # document scales them by 0.6875, and its warning says so. (The warning was once said of the
    # breakdown before the document fitted it to the iteration timed last: a figure of its own,
    # or no warning at all.)
    doc = document(run_time(1 / 64, 0.75), recorded_ms=4.0)
    assert doc["attribution"]["scaled_by"] == pytest.approx(2.75 / 4.0)
    assert doc["warnings"][0].startswith("Operations ran 45% slower while recorded than in the measured iteration")
    assert not any(w.startswith("Operations ran") for w in document(run_time(1 / 64, 0.75))["warnings"])


def test_an_iteration_that_waited_beyond_its_operations_and_python_shares_the_wait_out_and_says_so():
    # Operations of 0.5 ms and 0.25 ms of Python between them, at their fastest, in an iteration
    # measured at 2.75 ms (a busy machine): each part scaled by 2.75 / 0.75, and the warning says so.
    doc = document(run_time(1 / 64, 0.75), recorded_ms=0.5, between_ms=0.25)
    assert doc["attribution"]["scaled_by"] == pytest.approx(2.75 / 0.75)
    assert doc["attribution"]["between_operations_ms"] == 0.25
    (note,) = [w for w in doc["warnings"] if w.startswith("The measured iteration took 3.7× as long as its operations")]
    assert "shared out over the lines in proportion to their own" in note and ACTION.search(note)
    assert doc["attribution"]["user_lines_ms"] + doc["untracked"]["run_time_ms"] == pytest.approx(2.75)
    # Where the iteration leaves no more beside its operations than the Python between them: no wait.
    quiet = document(run_time(1 / 64, 0.75), recorded_ms=2.0, between_ms=1.0)
    assert quiet["attribution"]["scaled_by"] == 1.0
    assert not any(w.startswith("The measured iteration took") for w in quiet["warnings"])
    # On a busy CPU the operations' times are their threads' CPU time, and the warning says so.
    busy = document(run_time(1 / 64, 0.75), recorded_ms=0.5, between_ms=0.25, device_time="thread_cpu")
    assert any(
        w.startswith("The measured iteration took 3.7× as long as its operations (each its thread's CPU time")
        for w in busy["warnings"]
    )


def test_on_a_gpu_the_slowdown_while_recorded_is_the_hosts_launch_in_each_span():
    """Measured on an H200: recorded operations took 2.2 to 3.4 times the iteration, as the GPU
    idles while the recorder works and every CUDA event span holds a kernel's launch."""
    cpu, gpu = (document(run_time(1 / 64, 0.75), recorded_ms=4.0, device=d)["warnings"][0] for d in (None, CUDA))
    assert cpu.startswith("Operations ran 45% slower") and gpu.startswith("Operations ran 45% slower")
    assert "CPU's threads idle" in cpu and "launch" not in cpu
    assert "CUDA events" in gpu and "host's launch of the kernel" in gpu and "CPU's threads" not in gpu


def test_the_breakdowns_warnings_say_what_to_do():
    from skyline_engine.analysis.breakdown_notes import breakdown_notes
    from skyline_engine.analysis.fitting import ONE_SAMPLE

    distorted = Breakdown(
        [], OperationNode("iteration", "", "module"), [], [], Untracked(7.0, 0), Attribution(3, 3.0, 3.0, 0.3, 0.5)
    )
    notes = breakdown_notes(distorted)
    assert len(notes) == 2  # slowed down while recorded, and little of the iteration on the user's lines
    for note in [*notes, ONE_SAMPLE]:
        assert ACTION.search(note), note
    # A training script has no --batch-size or input provider: its notes point to what it has.
    script_notes = " ".join(breakdown_notes(distorted, script=True))
    assert "--batch-size" not in script_notes and "input provider" not in script_notes
    assert "--set-batch-size" in script_notes and "num_workers" in script_notes


def test_the_memory_models_lines_name_their_phase_in_words():
    models = render_report(document(run_time(1 / 64, 0.75))).split("Batch-size models")[1]
    assert "peak memory    = 1000 B × batch size + 7.6 MiB (in the forward and backward pass)" in models
    inference = render_report(document(run_time(1 / 64, 0.75), backward=False)).split("Batch-size models")[1]
    assert "(in the forward pass)" in inference
    assert "forward_backward" not in models + inference


def test_two_lines_of_one_phase_are_told_apart_by_where_each_holds_the_peak():
    doc = document(run_time(1 / 64, 0.75))
    memory = doc["models"]["peak_memory_bytes"]
    memory["phases"] = [
        {"name": "optimizer", "slope": 0.0, "bias": 1000.0, "r2": None},
        {"name": "forward_backward", "slope": 2.0, "bias": 400.0, "r2": None},
        {"name": "forward_backward", "slope": 5.0, "bias": -1000.0, "r2": None},
    ]
    models = render_report(doc).split("Batch-size models")[1].splitlines()
    start = next(i for i, line in enumerate(models) if "peak memory    = the highest of" in line)
    assert [line.strip() for line in models[start + 1 : start + 4]] == [
        "0 B × batch size + 1000 B (in the optimizer step; the highest up to batch size 299)",
        "2 B × batch size + 400 B (in the forward and backward pass; the highest at batch sizes 300–466)",
        "5 B × batch size − 1000 B (in the forward and backward pass; the highest from batch size 467)",
    ]


def test_the_memory_model_lists_only_lines_that_hold_the_peak_up_to_the_largest_batch_size_that_fits():
    doc = document(run_time(1 / 64, 0.75))
    memory = doc["models"]["peak_memory_bytes"]
    line = {"name": "forward_backward", "slope": 1000.0, "bias": 8_000_000.0, "r2": 1.0}
    # A line of the same slope to the last digit shown, taking over far beyond what fits.
    nearly = {**line, "slope": 1000.5, "bias": 8_000_000.0 - 1e12}
    memory["phases"] = [{"name": "optimizer", "slope": 0.0, "bias": 8_010_000.0, "r2": 1.0}, line, nearly]
    models = render_report(doc).split("Batch-size models")[1].splitlines()
    start = next(i for i, text in enumerate(models) if "peak memory    = the highest of" in text)
    assert [text.strip() for text in models[start + 1 : start + 3]] == [
        "0 B × batch size + 7.6 MiB (in the optimizer step; the highest up to batch size 9)",
        "1000 B × batch size + 7.6 MiB (in the forward and backward pass; the highest from batch size 10)",
    ]
    assert "(fitted per operation" in models[start + 3]
    # With that line alone left, the model is one line, without "the highest of".
    memory["phases"] = [line, nearly]
    assert (
        "peak memory    = 1000 B × batch size + 7.6 MiB (in the forward and backward pass)\n"
        in render_report(doc).split("Batch-size models")[1]
    )


@pytest.mark.parametrize(
    ("device_time", "said"),
    [(None, "(one iteration; share"), ("kernels", "(one iteration, the GPU's kernel time; share"),
     ("spans", "(one iteration, spans on the GPU's stream; share"),
     ("thread_cpu", "(one iteration, each operation's CPU time: the CPU was busy; share")],
)  # fmt: skip
def test_the_lines_title_says_what_a_lines_time_is_on_a_gpu_or_a_busy_cpu(device_time, said):
    doc = document(run_time(1 / 64, 0.75))
    doc["lines"] = [_line(30, 0.5, 0.0)]
    doc["attribution"]["device_time"] = device_time
    section = next(part for part in render_report(doc, 400).split("\n\n") if part.startswith("Hottest lines"))
    assert said in section.splitlines()[0]
