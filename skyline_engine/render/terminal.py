"""The terminal report of an analysis document.

Its first lines answer what a deep-learning engineer acts on: how fast (samples/s and time per
iteration at the batch size), how much memory (the peak against the capacity, and which phase of
the iteration sets it), what batch size to use (the document's recommendation: one measured
faster than the user's, or why none); then the warnings, each saying what to do; then the
detail: the hottest lines, the batch sizes measured and predicted, the fitted models.

Given a width (a terminal's), every line fits in it: prose wraps beneath its label or indent, the
hottest lines' sources are cut shorter, or stand beside each place with the figures on a line of
their own, and a table's notes wrap in their column. Without one (a pipe, a file), the tables are
as wide as their content and only the warnings wrap.
"""

from __future__ import annotations

import linecache
import os
import textwrap
from collections.abc import Sequence
from typing import Callable

from skyline_engine.analysis.document import (
    BucketDict,
    CompilationDict,
    DocumentDict,
    LineDict,
    LineFitDict,
    ModelsDict,
    OperationNodeDict,
    PeakMemoryModelDict,
    PeakMemoryOperationDict,
    PhaseCurveDict,
)
from skyline_engine.predict.peak_memory import PeakMemoryModel
from skyline_engine.predict.recommendation import TIMED_BESIDE
from skyline_engine.units import bar, format_bytes, format_ms, format_rate
from skyline_engine.vocabulary import (
    FORWARD_BACKWARD,
    FORWARD_ONLY_LABEL,
    PEAK_PHASE_LABELS,
    TENSOR_KIND_LABELS,
    PeakPhase,
)

SAMPLES = " samples/s"

HOTTEST_LINES = 10
SOURCE_WIDTH = 40
NARROWEST_SOURCE = 20  # a source cut shorter says too little beside its figures: it goes beside its place
NARROWEST_CELL = 12  # a table's last cell wraps in a column at least this wide ("extrapolated")
WARNING_WIDTH = 100
NARROWEST = 70  # the hottest lines' figures need 66 columns: a terminal narrower than this wraps the report
LABEL = "{:<13}"  # the summary's labels, and the indent of its continuation lines

# Where the capacity comes from (device.memory_capacity_source), as the memory line says it.
CAPACITY_SOURCES = {
    "user": "planned for",
    "cuda": "free on the GPU",
    "nvml": "on the GPU",
    "system_available": "available",
    "cgroup": "left under the memory limit",
    "physical_memory": "of physical memory",
}
# The other tensors at the peak (analysis document, `peak_memory_operation.other_tensors`) named
# in the summary: those holding at least this share of it, and what made them.
NOTABLE_OTHER_TENSOR = 0.05


def render_report(document: DocumentDict, width: int | None = None) -> str:
    """The report; its lines fit in `width` columns when given (at least NARROWEST)."""
    if width is not None:
        width = max(width, NARROWEST)
    sections = [
        _wrap(_header(document), width),
        _wrap(_summary(document), width, indent=LABEL.format("")),
        render_warnings(document, width),
        _hottest_lines(document, width),
        _modules_beneath(document, width),
        _wrap(_data_parallel(document), width),
        _predictions(document, width),
        _wrap(_models(document), width),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _wrap(text: str, width: int | None, indent: str | None = None) -> str:
    """`text` with each line longer than `width` wrapped at its spaces, continued beneath `indent`
    (by default the line's own indent and four spaces more)."""
    if width is None:
        return text
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        beneath = indent if indent is not None else " " * (len(line) - len(line.lstrip()) + 4)
        out.append(
            textwrap.fill(line, width, subsequent_indent=beneath, break_long_words=False, break_on_hyphens=False)
        )
    return "\n".join(out)


def _data_parallel(doc: DocumentDict) -> str:
    """Ranks, buckets and predicted scaling of data-parallel training."""
    dp = doc.get("distributed")
    if not dp:
        return ""
    comm = dp["communication"]
    out = [
        f"Data parallel  {dp['world_size']} ranks ({dp['backend']}, {dp['threads_per_rank']} thread(s) each); "
        f"slowest: rank {dp['slowest_rank']}",
        f"  communication  {format_ms(comm['exposed_ms'])} exposed of the iteration; all-reduces "
        f"{format_ms(comm['all_reduce_ms'])} in {len(dp['buckets'])} bucket(s); "
        f"computation {format_ms(comm['compute_ms'])}",
    ]
    for rank in dp["ranks"]:
        out.append(
            f"  rank {rank['rank']:<3} {format_ms(rank['run_time_ms']):>10} per iteration, "
            f"{format_ms(rank['compute_ms'])} without communication, {format_bytes(rank['peak_memory_bytes'])} peak"
        )
    for position, bucket in enumerate(dp["buckets"]):
        where = ", ".join(f"{line['path']}:{line['line']}" for line in bucket["lines"][:4])
        out.append(
            f"  bucket {bucket['index']:<2} {format_bytes(bucket['size_bytes']):>10}  "
            f"{_bucket_all_reduce(bucket, dp['buckets'][:position])}, exposed {format_ms(bucket['exposed_ms'])}  "
            f"({where})"
        )
    link = dp["link"]
    if link is None:
        return "\n".join(out)  # one rank, or no link fits: no scaling (the warnings say why)
    out.append(
        f"  scaling over {link['description']}, {link['bandwidth_gbps']:.2g} Gbit/s, {link['latency_us']:.0f} µs "
        f"per step ({link['source']}):"
    )
    for row in dp["scaling"]:
        note = " (extrapolated)" if row["extrapolated"] else ""
        if row["measured_samples_per_second"] is not None:
            note = f" (measured {format_rate(row['measured_samples_per_second'], SAMPLES)})"
        out.append(
            f"    {row['world_size']:>3} ranks  {format_rate(row['samples_per_second'], SAMPLES):>18}  "
            f"exposed {format_ms(row['exposed_ms'])}{note}"
        )
    return "\n".join(out)


def _bucket_all_reduce(bucket: BucketDict, earlier: Sequence[BucketDict]) -> str:
    """A bucket's all-reduce time is what it added to the communication: none when it ran within
    the earlier buckets' all-reduces (gloo runs two at once), which "all-reduce 0.00 ms" would not
    say."""
    if bucket["all_reduce_ms"] > 0 or not earlier:
        return f"all-reduce {format_ms(bucket['all_reduce_ms'])}"
    if len(earlier) == 1:
        return f"all-reduce within bucket {earlier[0]['index']}'s"
    return "all-reduce within the earlier buckets'"


def _header(doc: DocumentDict) -> str:
    device = doc["device"]
    return (
        f"Skyline · {doc['entry_point']} · batch size {doc['batch_size']:,} · "
        f"{device['type'].upper()} ({device['name']}), torch {doc['torch_version']}"
    )


def _summary(doc: DocumentDict) -> str:
    lines = [("Speed", _speed(doc)), ("Memory", _memory(doc)), ("Batch size", _advice(doc))]
    models, compilation = doc["models"], doc["compilation"]
    if models:
        lines.append(("Largest fit", _largest_fit(doc, models)))
    if compilation:
        lines.append(("Compiled", _compiled(compilation)))
    continuation = "\n" + LABEL.format("")
    return "\n".join(LABEL.format(label) + text.replace("\n", continuation) for label, text in lines)


def _compiled(compilation: CompilationDict) -> str:
    """What torch.compile compiled, apart from the iteration's time, and where it compiled again."""
    first, *later = compilation["batch_sizes"]
    text = (
        f"torch.compile: {compilation['graphs']} graph(s) in {compilation['seconds']:.1f} s, compiled in warm-ups "
        f"and not in the iteration's time\n{first['graphs']} at batch size {first['batch_size']:,} "
        f"({first['seconds']:.1f} s)"
    )
    again = [f"{b['graphs']} at {b['batch_size']:,} ({b['seconds']:.1f} s)" for b in later]
    if again:
        text += f"; recompiled for new shapes: {', '.join(again)}"
    return text


def _speed(doc: DocumentDict) -> str:
    it = doc["iteration"]
    if it["repetitions"] > 1:
        timed = f"mean of {it['repetitions']:,} timed, IQR {format_ms(it['run_time_iqr_ms'])}"
    else:
        timed = "one iteration, not yet timed"
    k = it.get("micro_batches", 1)
    per_step = f" × {k} micro-batches ({k * doc['batch_size']:,} samples per optimizer step)" if k > 1 else ""
    return (
        f"{format_rate(it['samples_per_second'], SAMPLES)} at batch size {doc['batch_size']:,}{per_step}: "
        f"{format_ms(it['run_time_ms'])} per iteration ({timed})"
    )


def _memory(doc: DocumentDict) -> str:
    it, device = doc["iteration"], doc["device"]
    capacity = device["memory_capacity_bytes"]
    share = it["peak_memory_bytes"] / capacity if capacity else 0.0
    source = CAPACITY_SOURCES.get(device["memory_capacity_source"], "")
    phase = _phase(doc, it["peak_memory_phase"])
    reserved = it.get("peak_memory_reserved_bytes")
    # CUDA: what no tensor holds (absent from earlier documents), then the allocator's cache.
    workspaces = (doc.get("untracked") or {}).get("workspace_bytes")
    said = [f"{format_bytes(workspaces)} of it cuBLAS workspaces"] if workspaces else []
    said += [f"{format_bytes(reserved)} reserved by the allocator"] if reserved else []
    held = f" ({'; '.join(said)})" if said else ""
    return (
        f"{format_bytes(it['peak_memory_bytes'])} peak{held} of {format_bytes(capacity)} {source} "
        f"{bar(share, 20)} {share:.1%}, reached in {phase}{_peak_memory_operation(doc)}"
    )


def _peak_memory_operation(doc: DocumentDict) -> str:
    """`, at model.py:12 (addmm)`: where the recorded iteration's memory peaked, if at a line; then
    what is alive there, in parts that add up to the peak, and the other tensors worth naming."""
    peak = doc.get("peak_memory_operation")
    parts = _peak_memory_parts(doc)
    held = f":\n{parts}" if parts else ""
    if not peak or peak.get("path") is None:
        return held
    backward = ", backward" if peak["phase"] == "backward" else ""
    return f",\nat {peak['path']}:{peak['line']} ({peak['operation']}{backward}){held}{_other_tensors(doc, peak)}"


def _peak_memory_parts(doc: DocumentDict) -> str:
    """`weights 16.3 MiB, gradients 16.3 MiB, …`: what is alive at the peak, adding up to it; empty
    where the document does not know (absent from earlier documents, or all 0)."""
    parts = doc.get("peak_memory_parts")
    if not parts or not any(parts.values()):
        return ""
    named = (
        ("weights", parts["weights_bytes"]),
        ("gradients", parts["gradients_bytes"]),
        ("optimizer state", parts["optimizer_state_bytes"]),
        ("activations", parts["activations_bytes"]),
        ("other tensors", parts["other_bytes"]),
    )
    return ", ".join(f"{name} {format_bytes(size)}" for name, size in named)


def _other_tensors(doc: DocumentDict, peak: PeakMemoryOperationDict) -> str:
    """`; other tensors alive there from model.py:12: 15.6 MiB made in backward`: the largest of
    the other tensors at the peak (attribute/other_tensors.py), those that hold a notable share of it."""
    least = NOTABLE_OTHER_TENSOR * doc["iteration"]["peak_memory_bytes"]
    notable = [t for t in peak.get("other_tensors", []) if t["bytes"] >= least]
    if not notable:
        return ""
    by_place: dict[str, list[str]] = {}  # a line's backward and forward tensors together, largest first
    for made in notable:
        place = f"{made['path']}:{made['line']}"
        by_place.setdefault(place, []).append(f"{format_bytes(made['bytes'])} {TENSOR_KIND_LABELS[made['phase']]}")
    named = [f"from {place}: {', '.join(kinds)}" for place, kinds in by_place.items()]
    return ";\nother tensors alive there " + "; ".join(named)


def _advice(doc: DocumentDict) -> str:
    """The batch size to use and why, or why none can be recommended: the document's one
    recommendation (`models.recommendation`, predict/recommendation.py), in words."""
    models = doc.get("models")
    if not models and doc.get("memory_growth"):
        return "none to recommend: peak memory grows with every iteration (see the warnings)"
    if not models:
        return f"none to recommend: only batch size {doc['batch_size']:,} could be measured (see the warnings)"
    advice = models.get("recommendation")
    if advice is None:  # a document from before the field
        return "none to recommend: the document holds no recommendation (profile again)"
    batch_size, rate, yours = advice["batch_size"], advice["samples_per_second"], advice["users_samples_per_second"]
    if batch_size is None or rate is None:
        return f"none to recommend: {_clauses(advice['reason'])}"
    how = "measured" if advice["measured"] else "predicted"
    text = f"use {batch_size:,} for {format_rate(rate, SAMPLES)} ({how})"
    if yours:
        timed = advice.get("timed", TIMED_BESIDE)  # absent from documents before the field
        text += f", {_compared(rate / yours)} yours ({doc['batch_size']:,}) {timed}"
    return f"{text}\n{_clauses(advice['reason'])}"


def _clauses(reason: str) -> str:
    """A reason's clauses (`; `) one a line, as the summary's continuation lines show them."""
    return reason.replace("; ", ";\n")


def _compared(ratio: float) -> str:
    if ratio >= 2:
        return f"{ratio:.1f}×"
    return f"{abs(ratio - 1):.0%} {'faster' if ratio >= 1 else 'slower'} than"


def _own_ms(line: LineDict) -> float:
    return float(line["forward_ms"] + line["backward_ms"] + line["step_ms"])


def _inclusive_ms(line: LineDict) -> float:
    inclusive = line["inclusive"]
    return float(inclusive["forward_ms"] + inclusive["backward_ms"] + inclusive["step_ms"])


# What the untracked row holds, in its source column: time no operation took (Python, the framework
# between operations), and tensors alive at the peak that are none of the lines' (gradients in
# flight in backward, an output the user's code still holds, the inputs).
UNTRACKED = "time between operations; other tensors"
HOTTEST_TITLE = (
    "Hottest lines, then those holding most memory (one iteration{time}; share: the line's own operations, with "
    "calls: also what runs beneath it)"
)
# What a line's time is on a GPU and on a busy CPU (`attribution.device_time`); on a quiet CPU, wall
# time, said by nothing.
DEVICE_TIME = {
    "kernels": ", the GPU's kernel time",
    "spans": ", spans on the GPU's stream",
    "thread_cpu": ", each operation's CPU time: the CPU was busy",
}
# Beside the hottest lines by time: those holding at least this share of the peak memory, this many at most.
MEMORY_SHARE = 0.05
HOLDING_LINES = 5
FIGURES = ("forward", "backward", "step", "share", "with calls", "memory")


def _hottest_lines(doc: DocumentDict, width: int | None) -> str:
    """The lines that cost most time themselves, then those that hold most memory, then the entry
    point's lines that call into the rest (their own cost is next to nothing: what they hold is
    beneath them)."""
    records = doc.get("lines") or []
    hottest = sorted(records, key=lambda line: -_own_ms(line))[:HOTTEST_LINES]
    holding = _holding_most_memory([line for line in records if line not in hottest], doc)
    callers = [
        line
        for line in records
        if line["path"] == doc["entry_point"] and line not in hottest + holding and _inclusive_ms(line) > _own_ms(line)
    ]
    if not hottest:
        return ""
    total = doc["iteration"]["run_time_ms"]
    rows = []  # (place, figures, source)
    for line in hottest + holding + callers:
        own, inclusive = _own_ms(line), _inclusive_ms(line)
        figures = (
            _ms_or_blank(line["forward_ms"]),
            _ms_or_blank(line["backward_ms"]),
            _ms_or_blank(line["step_ms"]),
            _share(own, total),
            # Only where it says more than the line's own cost: a caller's whole subtree.
            _share(inclusive, total) if inclusive > own * (1 + 1e-9) else "",
            format_bytes(line["memory_bytes"]),
        )
        source = linecache.getline(os.path.join(doc["project_root"], line["path"]), line["line"]).strip()
        rows.append((f"{line['path']}:{line['line']}", figures, source))
    untracked = doc.get("untracked")
    if untracked:
        ms, share = format_ms(untracked["run_time_ms"]), _share(untracked["run_time_ms"], total)
        rows.append(("untracked", (ms, "", "", share, "", format_bytes(untracked["memory_bytes"])), UNTRACKED))
    title = HOTTEST_TITLE.format(time=DEVICE_TIME.get(str(doc["attribution"].get("device_time")), ""))
    return _wrap(title, width) + "\n" + _hottest_table(rows, width)


def _holding_most_memory(lines: list[LineDict], doc: DocumentDict) -> list[LineDict]:
    """Of `lines`, those holding at least MEMORY_SHARE of the peak, most first, HOLDING_LINES at
    most: a line that costs no time can hold the most memory (an optimizer's state at its
    construction, 24 MiB of an LSTM tagger's 75 MiB peak, was left out among the hottest lines)."""
    least = MEMORY_SHARE * doc["iteration"]["peak_memory_bytes"]
    holding = [line for line in lines if line["memory_bytes"] >= least and line["memory_bytes"] > 0]
    return sorted(holding, key=lambda line: -line["memory_bytes"])[:HOLDING_LINES]


# A line that runs at least this share of the iteration itself runs library code (a model from
# transformers or timm called at `out = model(...)`): the report breaks it down by module too.
ONE_LINE_HOLDS = 0.5
MODULE_SHARE = 0.05  # modules below this share of the iteration are left out, with what they hold
MODULE_ROWS = 15


def _modules_beneath(doc: DocumentDict, width: int | None) -> str:
    """Where one line holds most of the iteration (its operations ran in library code, which has
    no lines of the project), the modules beneath it, in the order they ran: a GPT-2 from
    transformers was 92 % at one line, and the report said no more."""
    records, root = doc.get("lines") or [], doc.get("operations")
    total = doc["iteration"]["run_time_ms"]
    if not records or not root or total <= 0:
        return ""
    line = max(records, key=_own_ms)
    if _own_ms(line) < ONE_LINE_HOLDS * total:
        return ""
    rows: list[tuple[str, ...]] = []

    def visit(node: OperationNodeDict) -> None:
        for child in node.get("children") or []:
            ms = child["forward_ms"] + child["backward_ms"] + child.get("step_ms", 0.0)
            if child["kind"] != "module" or ms < MODULE_SHARE * total or len(rows) >= MODULE_ROWS:
                continue
            rows.append(
                (format_ms(child["forward_ms"]), format_ms(child["backward_ms"]), _share(ms, total), child["module"])
            )
            visit(child)

    visit(root)
    if len(rows) < 2:
        return ""
    title = (
        f"Modules ({line['path']}:{line['line']} runs {_share(_own_ms(line), total)} of the iteration itself, in "
        f"library code; the modules that took at least {MODULE_SHARE:.0%} of it, in the order they ran)"
    )
    table = _table([("forward", "backward", "share", "module"), *rows], right_aligned=(0, 1, 2), width=width)
    return _wrap(title, width) + "\n" + table


def _hottest_table(rows: Sequence[tuple[str, tuple[str, ...], str]], width: int | None) -> str:
    """One line a row, its source cut to what the width leaves (at most SOURCE_WIDTH); where that
    is less than NARROWEST_SOURCE, two: the place and its source, then the figures beneath."""
    header = ("line", *FIGURES)
    before_source = _indent_of_last_column([(*header, ""), *((place, *figures, "") for place, figures, _ in rows)])
    room = SOURCE_WIDTH if width is None else min(SOURCE_WIDTH, width - before_source)
    if room >= NARROWEST_SOURCE:
        table = [(*header, "source"), *((place, *figures, _cut(source, room)) for place, figures, source in rows)]
        return _table(table, right_aligned=(1, 2, 3, 4, 5, 6))
    assert width is not None  # without a width there is always room
    figure_lines = _table([FIGURES, *(figures for _, figures, _ in rows)], right_aligned=(0, 1, 2, 3, 4, 5))
    figures_first, *figures_rest = ["    " + line for line in figure_lines.split("\n")]
    out = ["  line   source", figures_first]
    for (place, _, source), figures in zip(rows, figures_rest):
        beside = width - len(f"  {place}   ")
        out.append(f"  {place}   {_cut(source, beside)}".rstrip() if beside > 0 else f"  {place}")
        out.append(figures)
    return "\n".join(out)


def _ms_or_blank(ms: float) -> str:
    return format_ms(ms) if ms > 0 else ""


def _share(ms: float, total: float) -> str:
    return f"{ms / total:.1%}" if total else "—"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _phase(doc: DocumentDict, phase: PeakPhase) -> str:
    """A phase of the iteration as the report names it: an iteration whose recording has no
    backward work (inference, evaluation) has a forward pass, not a forward and backward one."""
    operations = doc.get("operations") or {}
    if phase == FORWARD_BACKWARD and not operations.get("backward_ms"):
        return FORWARD_ONLY_LABEL
    return PEAK_PHASE_LABELS.get(phase, phase)


def _largest_fit(doc: DocumentDict, models: ModelsDict) -> str:
    largest = models["max_batch_size"]
    if largest is None:
        return "no limit (memory does not grow with the batch size)"
    if largest == 0:
        return "— (not even batch size 1 is predicted to fit)"
    phase = models["peak_memory_bytes"]["phase_at_max_batch_size"]
    assert phase is not None  # written with every max_batch_size above 0 (PeakMemoryModel.to_dict)
    kept = f"{models['memory_headroom_fraction']:.0%} of memory kept free"
    set_by = f"set by {_phase(doc, phase)}"
    if models["max_batch_size_extrapolated"]:
        # What is known to fit: the trusted range, or a batch size whose memory was measured beyond it.
        high = max([models["trusted_range"][1], *(s["batch_size"] for s in models["memory_samples"])])
        fit = f"more than {high:,}: the memory model says {largest:,}, {set_by}, far beyond the measurements ({kept})"
    else:
        fit = f"{largest:,}, {set_by} ({kept})"
    failing = [b for b in models.get("failing_batch_sizes", []) if b > doc["batch_size"]]
    if failing and min(failing) <= largest:
        fit += f";\nyour code fails at batch size {min(failing):,} (see the warnings)"
    return fit


def _predictions(doc: DocumentDict, width: int | None) -> str:
    predictions, models = doc["predictions"], doc["models"]
    if not predictions or models is None:  # no predictions without models
        return ""
    rows = [("batch size", "iteration", "throughput", "peak memory", "")]
    for prediction in predictions:
        batch_size, measured = prediction["batch_size"], prediction["measured"]
        notes = []
        if batch_size == doc["batch_size"]:
            notes.append("yours")
        if measured:
            notes.append("measured")
        if batch_size == (models.get("recommendation") or {}).get("batch_size"):
            notes.append("recommended")
        if batch_size == models["max_batch_size"]:
            notes.append("largest that fits")
        if not prediction["fits"]:
            notes.append("does not fit")
        if prediction["extrapolated"] and not measured:
            notes.append("extrapolated")
        # What was measured, not the line through it: a row marked "measured" shows the sample.
        figures = measured or prediction
        rows.append(
            (
                f"{batch_size:,}",
                format_ms(figures["run_time_ms"]),
                format_rate(figures["samples_per_second"]),
                format_bytes(figures["peak_memory_bytes"]),
                ", ".join(notes),
            )
        )
    return "Batch sizes, measured and predicted\n" + _table(rows, right_aligned=(0, 1, 2, 3), width=width)


def _models(doc: DocumentDict) -> str:
    models = doc.get("models")
    if not models:
        return ""
    sizes = ", ".join(str(s["batch_size"]) for s in models["samples"])
    rt = models["run_time_ms"]
    mem = models["peak_memory_bytes"]
    memory_lines = [
        f"{_curve(curve)} (in {_phase(doc, curve['name'])}{_held(batch_sizes)})"
        for curve, batch_sizes in _phases_that_hold(mem, models["max_batch_size"])
    ]
    memory = memory_lines[0] if len(memory_lines) == 1 else "the highest of\n      " + "\n      ".join(memory_lines)
    time = f"{rt['slope']:.4g} ms × batch size {_signed(rt['bias'], format_ms)}"
    per_step = models.get("samples_per_step")
    if per_step:  # accumulation to a fixed number of samples: the line is one micro-batch's
        time = f"({time}) × {per_step:,} / batch size micro-batches"
    return (
        f"Batch-size models (least squares over batch sizes {sizes})\n"
        f"  iteration time = {time}   {_fit(rt)}\n"
        f"  peak memory    = {memory}\n"
        f"                   (fitted {mem['fitted'].replace('_', ' ')}, largest residual "
        f"{mem['max_relative_residual']:.1%})"
    )


def _curve(curve: PhaseCurveDict) -> str:
    """`5.0 KiB × batch size + 17.0 MiB`, or `21 B × batch size² + 5.0 KiB × batch size + 17.0 MiB`
    where tensors grow with the batch size squared."""
    bias = _signed(curve["bias"], format_bytes)
    if not curve.get("quadratic"):
        return f"{format_bytes(curve['slope'])} × batch size {bias}"
    slope = _signed(curve["slope"], format_bytes)
    return f"{format_bytes(curve['quadratic'])} × batch size² {slope} × batch size {bias}"


def _phases_that_hold(
    memory: PeakMemoryModelDict, largest_that_fits: int | None
) -> list[tuple[PhaseCurveDict, tuple[int, int | None] | None]]:
    """The memory model's curves in the order they hold the peak at whole batch sizes up to the
    largest that fits, with where they hold it (None for a model of one curve): a line that takes
    over only beyond it (nearly parallel lines cross at 10^12) or between two batch sizes plans
    nothing."""
    phases = memory["phases"]
    if len(phases) == 1:
        return [(phases[0], None)]
    model = PeakMemoryModel.from_dict(memory)
    segments = model.segments(largest_that_fits)
    if len(segments) == 1:
        return [(phases[model.phases.index(segments[0][2])], None)]
    return [(phases[model.phases.index(curve)], (first, last)) for first, last, curve in segments]


def _held(batch_sizes: tuple[int, int | None] | None) -> str:
    """Where a line of the memory model holds the peak: two lines of one phase (two operations of
    the forward and backward pass) are told apart by it."""
    if batch_sizes is None:
        return ""
    first, last = batch_sizes
    if last is None:
        return f"; the highest from batch size {first:,}"
    if first == 1:
        return f"; the highest up to batch size {last:,}"
    return (
        f"; the highest at batch size {first:,}"
        if first == last
        else f"; the highest at batch sizes {first:,}–{last:,}"
    )


def _signed(value: float, fmt: Callable[[float], str]) -> str:
    return f"− {fmt(-value)}" if value < 0 else f"+ {fmt(value)}"


def _fit(model: LineFitDict) -> str:
    residual = f"largest residual {model['max_relative_residual']:.1%}"
    if model["r2"] is None:
        return f"(two points: fit unchecked, {residual})"
    return f"(R² {model['r2']:.3f}, {residual})"


def render_warnings(doc: DocumentDict, width: int | None = None) -> str:
    """The document's warnings under a heading, each wrapped to `width` (the report's last section,
    and what `skyline time` and `skyline memory` say beside the file they write); "" when none."""
    warnings = doc.get("warnings") or []
    if not warnings:
        return ""
    fill = WARNING_WIDTH if width is None else min(width, WARNING_WIDTH)
    wrapped = [
        textwrap.fill(w, fill, initial_indent="  ! ", subsequent_indent="    ", break_on_hyphens=False)
        for w in warnings
    ]
    return "Warnings\n" + "\n".join(wrapped)


def _table(rows: Sequence[tuple[str, ...]], right_aligned: tuple[int, ...] = (), width: int | None = None) -> str:
    """Rows in columns three spaces apart, indented two; with a `width`, a last cell that runs past
    it wraps at its spaces, continued beneath its own start."""
    widths = _column_widths(rows)
    indent = _indent_of_last_column(rows)
    out = []
    for row in rows:
        cells = [cell.rjust(widths[i]) if i in right_aligned else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        line = ("  " + "   ".join(cells)).rstrip()
        if width is not None and len(line) > width and row[-1] and width - indent >= NARROWEST_CELL:
            first, *rest = textwrap.wrap(row[-1], width - indent, break_long_words=False, break_on_hyphens=False)
            line = ("  " + "   ".join([*cells[:-1], first])).rstrip()
            line += "".join("\n" + " " * indent + more for more in rest)
        out.append(line)
    return "\n".join(out)


def _column_widths(rows: Sequence[tuple[str, ...]]) -> list[int]:
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]


def _indent_of_last_column(rows: Sequence[tuple[str, ...]]) -> int:
    """Where `_table` starts the last column of `rows`."""
    return 2 + sum(width + 3 for width in _column_widths(rows)[:-1])
