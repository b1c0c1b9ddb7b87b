"""An input provider that ignores its `batch_size` gets no predictions, and is told why (as is
every document without models: `models_withheld`).

`def skyline_input_provider(batch_size=16): return (torch.randn(16, 8),)` made every batch size
measure the same iteration: a flat time line, throughputs counted from samples that were never
there (477,639/s "at batch size 32" for an iteration of 16) and a largest batch size of 34 billion.
The analysis now sees the same input shapes at two batch sizes, keeps the user's batch size
(timed in full) and withholds the models, with a warning at the provider's line. The analyses run
the real engine on tiny models; the shape comparison is checked on real tensors.
"""

from __future__ import annotations

import pytest
import torch

from engine_helpers import analysed, marked_line
from skyline_engine.errors import EntryPointError
from skyline_engine.measure.inputs import Emptied, InputShapesSeen, InputsIgnoreBatchSize, input_shapes
from skyline_engine.render.terminal import render_report

ENTRY = """\
import torch
import torch.nn as nn


def skyline_model_provider():
    return nn.Linear(8, 2)


def skyline_input_provider(batch_size=16):  # <- HERE
    return {inputs}


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def iteration(*inputs):
        optimizer.zero_grad()
        model(inputs[0]).pow(2).mean().backward()
        optimizer.step()

    return iteration
"""


def analysis(tmp_path, inputs: str) -> dict:
    return analysed(tmp_path, source=ENTRY.format(inputs=inputs))


@pytest.mark.slow
@pytest.mark.parametrize(
    "inputs",
    ["(torch.randn(16, 8),)", "(torch.randn(16, 8), {'mask': torch.ones(16, 8), 'scale': 2})"],
    ids=["fixed-tensor", "fixed-tensor-and-dict"],
)
def test_inputs_that_ignore_the_batch_size_get_no_predictions(tmp_path, inputs):
    doc = analysis(tmp_path, inputs)
    assert doc["models"] is None
    assert doc["predictions"] == []
    assert doc["batch_size"] == 16
    # The user's batch size is timed in full, as the others would have been (not its quick first timing).
    assert doc["iteration"]["repetitions"] > 1
    said = [w for w in doc["warnings"] if "skyline_input_provider" in w]
    assert len(said) == 1, doc["warnings"]
    assert f"entry_point.py:{marked_line(tmp_path / 'entry_point.py')}" in said[0]
    assert "same shapes" in said[0] and "(16, 8)" in said[0] and "nothing is predicted" in said[0]
    assert doc["models_withheld"] == said[0]
    report = render_report(doc)
    assert "none to recommend" in report
    assert "largest that fits" not in report


@pytest.mark.slow
def test_inputs_that_follow_the_batch_size_are_predicted(tmp_path):
    """The control: the same entry point with `batch_size` as the batch dimension."""
    doc = analysis(tmp_path, "(torch.randn(batch_size, 8),)")
    assert doc["models"] is not None and doc["models_withheld"] is None
    assert len(doc["models"]["samples"]) >= 2
    assert not [w for w in doc["warnings"] if "skyline_input_provider" in w]


def test_the_same_shapes_at_two_batch_sizes_are_caught():
    seen = InputShapesSeen()
    seen.check(16, (torch.randn(16, 8), torch.zeros(16, dtype=torch.long)))
    seen.check(16, (torch.randn(16, 8), torch.zeros(16, dtype=torch.long)))  # the same batch size again
    with pytest.raises(InputsIgnoreBatchSize) as caught:
        seen.check(8, (torch.randn(16, 8), torch.zeros(16, dtype=torch.long)))
    assert caught.value.batch_sizes == (8, 16)
    assert "(16, 8), (16,)" in caught.value.warning("skyline_input_provider", "entry_point.py:9")


def test_inputs_that_differ_anywhere_are_not_judged_the_same():
    seen = InputShapesSeen()
    seen.check(4, (torch.randn(4, 8),))
    seen.check(8, (torch.randn(8, 8),))  # the tensor follows the batch size
    seen.check(16, (torch.randn(8, 8), 16))  # a number that does: the iteration may build from it
    seen.check(32, ([torch.randn(8, 8)] * 2,))  # another structure


@pytest.mark.parametrize(
    "inputs",
    [
        (torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 8)), batch_size=4),),
        (8, "mean"),  # no tensor at all: the iteration makes its data
        (torch.randn(4, 8), object()),
        (torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)]),),  # no single shape
    ],
    ids=["data-loader", "no-tensor", "an-object", "a-nested-tensor"],
)
def test_inputs_whose_size_cannot_be_read_are_not_judged(inputs):
    """A DataLoader, or any object, may hold its batch size inside: nothing is concluded from it."""
    assert input_shapes(inputs) is None
    seen = InputShapesSeen()
    seen.check(4, inputs)
    seen.check(8, inputs)


def test_a_structure_of_tensors_reads_every_shape():
    shapes = input_shapes((torch.randn(2, 3), {"mask": torch.ones(2), "n": 2}, [None, 1.5]))
    assert shapes is not None
    assert [tuple(s) for s in shapes if isinstance(s, torch.Size)] == [(2, 3), (2,)]


@pytest.mark.slow
def test_the_breakdown_asked_for_alone_says_so(tmp_path):
    (tmp_path / "entry_point.py").write_text(ENTRY.format(inputs="(torch.randn(batch_size, 8),)"), encoding="utf-8")
    doc = analysed(tmp_path, predict=False)
    assert doc["models"] is None
    assert "breakdown alone" in doc["models_withheld"]


@pytest.mark.slow
def test_an_input_emptied_at_a_larger_batch_size_is_a_batch_size_the_code_does_not_support(tmp_path):
    # 16 // batch_size micro-batches: none above 16, the user's. Probes there trained on nothing,
    # and their peaks (no forward pass) bent the memory model down: a negative slope, 16 % off.
    doc = analysis(tmp_path, "(torch.randn(16 // batch_size, batch_size, 8),)")
    failing = doc["models"]["failing_batch_sizes"]
    assert failing and min(failing) > 16
    line = f"entry_point.py:{marked_line(tmp_path / 'entry_point.py')}: "
    # One warning however many batch sizes failed there (a confirming step may find 31 after 32).
    (warning,) = [w for w in doc["warnings"] if w.startswith(line) and "empty input" in w]
    assert f"at batch size {min(failing)} (shape (0, {min(failing)}, 8)" in warning
    assert all(str(b) in warning.rsplit("The models leave", 1)[1] for b in failing)
    assert all(s["peak_memory_bytes"] > 0 for s in doc["models"]["samples"])
    assert doc["models"]["peak_memory_bytes"]["slope"] >= 0


def test_an_input_empty_at_every_batch_size_is_the_users_own():
    seen = InputShapesSeen()
    for batch_size in (8, 16):
        seen.check(batch_size, (torch.randn(batch_size, 4), torch.zeros(0)))
        assert seen.emptied(batch_size) is None
    seen.check(32, (torch.randn(0, 4), torch.zeros(0)))
    assert seen.emptied(32) == Emptied(32, torch.Size([0, 4]), 8, torch.Size([8, 4]))


@pytest.mark.slow
def test_the_users_batch_size_may_be_the_empty_one(tmp_path):
    # The user at 32 with 16 // batch_size micro-batches: none. The iteration trained on nothing,
    # and its "throughput" counted 32 samples it never saw; the half, 16, makes one.
    (tmp_path / "entry_point.py").write_text(
        ENTRY.format(inputs="(torch.randn(16 // batch_size, batch_size, 8),)").replace(
            "batch_size=16", "batch_size=32"
        ),
        encoding="utf-8",
    )
    with pytest.raises(EntryPointError) as raised:
        analysed(tmp_path)
    error = raised.value
    assert (error.path, error.line) == ("entry_point.py", marked_line(tmp_path / "entry_point.py"))
    # Told at once, at the user's own batch size, before anything is measured there.
    assert "made an input with no samples at your batch size 32 (shape (0, 32, 8))" in error.message


@pytest.mark.slow
@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        # An empty batch read as a throughput: "293,979 samples/s at batch size 64".
        ("(torch.randn(0, 8),)", "made an input with no samples at your batch size 16 (shape (0, 8))"),
        # An endless generator, taken whole, ran the service out of memory.
        ("iter(lambda: torch.randn(batch_size, 8), None)", "returned more than 10,000 inputs"),
    ],
    ids=["empty", "endless"],
)
def test_inputs_with_no_samples_or_without_end_are_an_error_at_the_input_provider(tmp_path, inputs, said):
    with pytest.raises(EntryPointError) as raised:
        analysis(tmp_path, inputs)
    assert (raised.value.path, raised.value.line) == ("entry_point.py", marked_line(tmp_path / "entry_point.py"))
    assert said in raised.value.message
