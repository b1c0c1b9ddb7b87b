"""A training script, no entry point: run as `python train.py arguments` would, measured on its own
iterations (from one optimizer step to the next) and stopped before what follows its loop."""

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_skyline
from engine_helpers import QUICK, analysed, marked_line
from skyline_engine.analysis.fitting import NOT_ASKED
from skyline_engine.analysis.script_sizes import ScriptBatchSizes, ScriptTarget, UsersIteration, in_both_orders
from skyline_engine.entry.rewrite import set_script_batch_size
from skyline_engine.entry.script import is_script
from skyline_engine.entry.script_batch_size import find_script_batch_size
from skyline_engine.errors import EntryPointError, UserCodeError
from skyline_engine.measure import work_per_call
from skyline_engine.measure.iteration import Sample
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.measure.script_run import STEP_TIMEOUT_S
from skyline_engine.measure.timing import TimingStats
from skyline_engine.predict.recommendation import TIMED_IN_TURN, Recommendation
from skyline_engine.processes import own_children

SCRIPTS = REPO / "tests" / "projects" / "scripts"


@pytest.fixture
def project(tmp_path) -> Path:
    shutil.copytree(SCRIPTS, tmp_path / "project")
    return tmp_path / "project"


def analysed_script(project: Path, *arguments: str, **request) -> dict:
    checkpoint = project / "checkpoint.pt"
    script_args = ("--checkpoint", str(checkpoint), *arguments)
    doc = analysed(project, "train.py", budget=QUICK, script_args=script_args, **request)
    assert not checkpoint.exists(), "the script ran past its loop"
    return doc


def line_of(doc: dict, path: str, number: int) -> dict:
    (line,) = [line for line in doc["lines"] if line["path"] == path and line["line"] == number]
    return line


@pytest.mark.slow
def test_a_training_script_is_measured_on_its_own_iterations_and_stopped(project):
    doc = analysed_script(project, predict=False)
    train = project / "train.py"
    assert doc["entry_point"] == "train.py"
    assert doc["batch_size"] == 64  # what the model was called with: the argparse default
    location = doc["batch_size_location"]
    assert (location["path"], location["line"], location["value"], location["editable"]) == (
        "train.py",
        marked_line(train, "# BATCH"),
        64,
        True,
    )
    source_line = train.read_text().splitlines()[location["line"] - 1].encode()
    assert source_line[location["col_start"] : location["col_end"]] == b"64"
    assert doc["iteration"]["run_time_ms"] > 0 and doc["iteration"]["repetitions"] >= 3
    # The model's forward and backward at its own line, the step at the script's, the loss at its line.
    model = line_of(doc, "model.py", marked_line(project / "model.py", "return self.head"))
    assert model["forward_ms"] > 0 and model["backward_ms"] > 0
    assert line_of(doc, "train.py", marked_line(train, "# STEP"))["step_ms"] > 0
    assert line_of(doc, "train.py", marked_line(train, "# LOSS"))["forward_ms"] > 0
    # Weights at the lines that created them, the optimizer's state at its construction.
    assert line_of(doc, "model.py", marked_line(project / "model.py", "self.head ="))["memory_bytes"] > 0
    assert doc["optimizer_state"] and doc["peak_memory_operation"] is not None
    assert doc["models"] is None and doc["models_withheld"] == NOT_ASKED


@pytest.mark.slow
def test_other_batch_sizes_run_the_script_again_with_the_literal_set_in_memory(project):
    train = project / "train.py"
    text = train.read_bytes()
    doc = analysed_script(project)
    assert train.read_bytes() == text  # set in memory, never on disk
    models = doc["models"]
    samples = {s["batch_size"]: s for s in models["samples"]}
    assert {32, 64, 128} <= set(samples) and doc["models_withheld"] is None
    # Each run trains at its own batch size, measured as the first: more activations, more memory.
    peaks = [samples[b]["peak_memory_bytes"] for b in (32, 64, 128)]
    assert peaks == sorted(set(peaks))
    assert samples[64]["peak_memory_bytes"] == doc["iteration"]["peak_memory_bytes"]
    # The first run keeps nothing of an earlier iteration alive (the optimizer's finder once read
    # the script's variables, and that snapshot held a batch, its logits and loss): a later run at
    # the user's batch size measures the same bytes.
    sizes = ScriptBatchSizes(
        ScriptTarget(train, project, ("--checkpoint", str(project / "checkpoint.pt")), STEP_TIMEOUT_S),
        UsersIteration(64, 1, 1.0),
        torch.device("cpu"),
        QUICK,
        lambda phase, fraction: None,
    )
    assert sizes.measure(64, timed=False).memory.peak_bytes == doc["iteration"]["peak_memory_bytes"]
    assert not (project / "checkpoint.pt").exists()
    advice = models["recommendation"]
    if advice["batch_size"] is not None:  # a recommendation compares runs in both orders
        assert advice["timed"] == TIMED_IN_TURN
        assert {advice["batch_size"], 64} <= {c["batch_size"] for c in models["checks"]}


@pytest.mark.slow
def test_a_literal_that_does_not_set_the_batch_size_withholds_the_models(project):
    # The option's default is 64, and so is the loader's own literal: the option is found, but
    # setting it changes nothing the model gets.
    train = project / "train.py"
    train.write_text(train.read_text().replace("batch_size=args.batch_size", "batch_size=64"))
    doc = analysed_script(project)
    assert doc["batch_size"] == 64 and doc["models"] is None
    assert "still got batches of 64" in doc["models_withheld"] and doc["iteration"]["repetitions"] >= 3


@pytest.mark.slow
def test_a_batch_size_beyond_the_scripts_data_is_a_probe_that_fails_at_its_literal(project):
    doc = analysed_script(project, "--samples", "96")
    line = marked_line(project / "train.py", "# BATCH")
    (said,) = [w for w in doc["warnings"] if "gave the model batches of 96" in w]
    assert said.startswith(f"train.py:{line}: Batch size 128, set at train.py:{line}")
    assert 128 in doc["models"]["failing_batch_sizes"]
    assert 32 in {s["batch_size"] for s in doc["models"]["samples"]}


def sample(batch_size: int, ms: float) -> Sample:
    memory = MemoryProfile(0, (batch_size,), ("addmm",), ((0, "forward_backward"),))
    return Sample(batch_size, TimingStats(ms, 0.0, 30, 1), memory)


@pytest.mark.parametrize(("before_ms", "stands"), [(10.0, True), (8.0, False)])
def test_a_scripts_recommendation_stands_where_both_orders_of_its_runs_agree(before_ms, stands):
    # Timed after the suggestion (the confirming runs), 64 took 16 ms and 128 took 16 ms: 128 twice
    # as fast. Timed before it (the models' runs, the user's first), 64 took 10 ms (128 25 % faster,
    # more than the noise), or 8 ms (as fast as 128: the runs' order made the difference).
    samples = [sample(64, before_ms), sample(128, 16.0)]
    checks = [sample(64, 16.0), sample(128, 16.0)]
    made = Recommendation(128, 8000.0, True, "the knee", 4000.0, TIMED_IN_TURN)
    kept = in_both_orders(made, 64, samples, checks)
    if stands:
        assert kept is made
    else:
        assert kept.batch_size is None
        assert "no faster than yours timed before it" in kept.reason and "their order decides" in kept.reason


@pytest.mark.slow
def test_the_command_line_sets_the_batch_size_and_no_literal_is_offered(project):
    doc = analysed_script(project, "--batch-size", "16")
    assert doc["batch_size"] == 16
    assert doc["batch_size_location"] is None
    assert any("the command line sets it (`--batch-size 16`)" in w for w in doc["warnings"])
    # Other batch sizes are set where the command line sets it, in the arguments of their runs.
    assert {8, 16, 32} <= {s["batch_size"] for s in doc["models"]["samples"]}


@pytest.mark.slow
def test_a_script_that_raises_is_an_error_at_its_line(project):
    with pytest.raises(UserCodeError) as raised:
        analysed_script(project, "--fail-at-step", "4")
    assert (raised.value.path, raised.value.line) == ("train.py", marked_line(project / "train.py", "# FAILS"))
    assert "step 4 went wrong" in raised.value.message


@pytest.mark.slow
@pytest.mark.parametrize(
    ("epochs", "said"), [("0", "without an optimizer step"), ("1", "ended after 2 optimizer steps")]
)
def test_a_script_that_ends_too_soon_says_so(project, epochs, said):
    with pytest.raises(EntryPointError) as raised:
        analysed_script(project, "--epochs", epochs, "--samples", "128")
    assert said in raised.value.message and raised.value.path == "train.py"


@pytest.mark.slow
def test_accumulation_a_grad_scaler_and_an_evaluation_every_fifth_step(project, monkeypatch):
    # On a busy machine an iteration of this script took 600 ms, and five of them are more than
    # the engine spends on one cycle (CYCLE_BUDGET_MS, a bound on cost): lifted here, so that what
    # is checked is how the cycle is found and measured, whatever the machine's load.
    monkeypatch.setattr(work_per_call, "CYCLE_BUDGET_MS", 1e9)
    doc = analysed(project, "train_features.py", budget=QUICK, script_args=("--workers", "0"))
    script = project / "train_features.py"
    # Four backward passes a step: micro-batches of the batch size, the samples a step four times it.
    assert doc["batch_size"] == 32 and doc["iteration"]["micro_batches"] == 4
    iteration = doc["iteration"]
    assert iteration["samples_per_second"] == pytest.approx(128 / (iteration["run_time_ms"] / 1000))
    # The evaluation every fifth step makes those iterations differ: measured in whole cycles of 5,
    # so the evaluation's line is in the breakdown, its time spread over the cycle.
    (differing,) = [w for w in doc["warnings"] if w.startswith("Your training iterations")]
    assert "ran the model 4 times" in differing and "ran the model 8 times (one in 5)" in differing
    assert "whole cycles of 5" in differing and doc["attribution"]["recorded_iterations"] == 5
    assert line_of(doc, "train_features.py", marked_line(script, "# EVAL"))["forward_ms"] > 0
    assert line_of(doc, "train_features.py", marked_line(script, "# STEP"))["step_ms"] > 0
    # Each other batch size's run accumulates four micro-batches too, and is measured in cycles of 5.
    samples = doc["models"]["samples"]
    assert len(samples) >= 2 and {s["micro_batches"] for s in samples} == {4}


@pytest.mark.slow
def test_a_data_loaders_worker_processes_end_with_the_script(project):
    before = set(own_children())
    doc = analysed(project, "train_features.py", budget=QUICK, script_args=("--workers", "2"))
    assert doc["batch_size"] == 32 and doc["iteration"]["micro_batches"] == 4
    assert set(own_children()) <= before


NEVER_STEPS = """import torch

model = torch.nn.Linear(4, 2)
while True: model(torch.randn(8, 4)).sum()  # LOOPS
"""

WAITS_AFTER_A_STEP = """import time
import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    while step == 1:
        try:
            time.sleep(3600)  # WAITS
        except BaseException:
            pass  # swallows whatever stops it: it is stopped again
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "marker", "said"),
    [
        (NEVER_STEPS, "# LOOPS", "never.py ran 1 s without an optimizer step"),
        (WAITS_AFTER_A_STEP, "# WAITS", "never.py ran 1 s after 2 optimizer steps without another"),
    ],
)
def test_a_script_that_does_not_step_in_time_is_stopped_at_its_line(tmp_path, source, marker, said):
    # A timer set before the analysis (pytest-timeout's, here) runs on after it.
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    with pytest.raises(EntryPointError) as raised:
        analysed(tmp_path, "never.py", source=source, budget=QUICK, step_timeout_s=1.0)
    assert (raised.value.path, raised.value.line) == ("never.py", marked_line(source, marker))
    assert raised.value.message.startswith(said) and "--step-timeout" in (raised.value.hint or "")
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0


@pytest.mark.slow
def test_a_batch_size_asked_for_is_set_at_the_scripts_literal_in_memory(project):
    # As the editor's keys ask for it (the buffer's new literal, unsaved): the file stays as it is.
    train = project / "train.py"
    text = train.read_bytes()
    doc = analysed_script(project, batch_size=16)
    assert doc["batch_size"] == 16 and train.read_bytes() == text
    location = doc["batch_size_location"]
    assert (location["line"], location["value"], location["editable"]) == (marked_line(train, "# BATCH"), 16, True)
    assert f"Batch size 16 was set at train.py:{location['line']} for this analysis, in memory" in " ".join(
        doc["warnings"]
    )
    # Where the command line sets it, it is set there, in the arguments; never written to a file.
    doc = analysed_script(project, "--batch-size", "8", batch_size=16, predict=False)
    assert doc["batch_size"] == 16 and train.read_bytes() == text
    with pytest.raises(EntryPointError, match=r"the command line sets it \(`--batch-size 8`\); change it there"):
        analysed_script(project, "--batch-size", "8", batch_size=16, write_batch_size=True)


def test_a_file_with_any_provider_is_an_entry_point():
    assert is_script((SCRIPTS / "train.py").read_text())
    assert not is_script("def skyline_model_provider():\n    return None\n")
    assert not is_script("from common import skyline_input_provider\n")
    assert not is_script("def broken(:\n")  # the loader's message names the line


@pytest.mark.parametrize(
    ("source", "argv", "observed", "expected"),
    [
        ("p.add_argument('--bs', type=int, default=32)\n", (), 32, (1, 32, True)),
        ("loader = DataLoader(data, batch_size=128)\n", (), 128, (1, 128, True)),
        ("BATCH_SIZE = 8\nloader = DataLoader(data, batch_size=BATCH_SIZE)\n", (), 8, (1, 8, True)),
        ("BATCH_SIZE = 8\n", (), 16, (1, 8, False)),  # not the batch size the model got
        ("p.add_argument('--batch-size', default=8)\n", ("--batch-size=4",), 4, None),
    ],
    ids=["argparse", "data-loader", "constant", "another-value", "command-line"],
)
def test_the_literal_that_sets_a_scripts_batch_size(source, argv, observed, expected):
    found = find_script_batch_size(source, "train.py", argv, observed)
    location = found.location
    if expected is None:
        assert location is None and found.from_arguments == 4
    else:
        assert (location.line, location.value, location.editable) == expected


@pytest.mark.slow
def test_skyline_profile_runs_a_script_with_its_arguments(project, tmp_path):
    out = tmp_path / "analysis.json"
    checkpoint = tmp_path / "checkpoint.pt"
    result = run_skyline(
        "profile",
        "train.py",
        "--device",
        "cpu",
        "--json",
        out,
        "--",
        "--batch-size",
        "32",
        "--checkpoint",
        checkpoint,
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["batch_size"] == 32
    assert "train.py · batch size 32" in result.stdout
    assert not checkpoint.exists()


@pytest.mark.slow
def test_set_batch_size_rewrites_the_scripts_option_default_alone_and_profiles_it(project, tmp_path):
    out = tmp_path / "analysis.json"
    train = project / "train.py"
    before = train.read_bytes()
    checkpoint = tmp_path / "checkpoint.pt"
    arguments = ("--json", out, "--", "--checkpoint", checkpoint)
    result = run_skyline("profile", "train.py", "--device", "cpu", "--set-batch-size", "48", *arguments, cwd=project)
    assert result.returncode == 0, result.stderr
    assert train.read_bytes() == before.replace(b"default=64)  # BATCH", b"default=48)  # BATCH")
    doc = json.loads(out.read_text())
    assert doc["batch_size"] == 48
    location = doc["batch_size_location"]
    assert (location["line"], location["value"], location["editable"]) == (marked_line(train, "BATCH"), 48, True)
    assert not any("in memory" in warning for warning in doc["warnings"])  # written: the file says 48


EVALUATION_LOADER_ONLY_LITERAL = """import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from model import Classifier

BATCH_SIZE = 64
data = TensorDataset(torch.randn(1024, 64), torch.randint(0, 10, (1024,)))
loader = DataLoader(data, batch_size=BATCH_SIZE)
validation = DataLoader(data, batch_size=256)  # VALIDATION
model = Classifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(1000):
    for x, y in loader:
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
"""


@pytest.mark.slow
def test_set_batch_size_writes_nothing_where_the_literal_found_is_not_the_training_batch_size(project):
    # By kind alone, the one `batch_size=` literal is the validation loader's: set in memory first,
    # the model's batches stay 64, so the file is left as it was.
    script = project / "evaluates.py"
    script.write_text(EVALUATION_LOADER_ONLY_LITERAL)
    before = script.read_bytes()
    result = run_skyline("profile", "evaluates.py", "--device", "cpu", "--set-batch-size", "16", cwd=project)
    assert result.returncode == 1
    line = marked_line(EVALUATION_LOADER_ONLY_LITERAL, "# VALIDATION")
    assert f"skyline: error: evaluates.py:{line}: Batch size 16 was set at evaluates.py:{line}" in result.stderr
    assert "the model got batches of 64" in result.stderr and script.read_bytes() == before


@pytest.mark.parametrize(
    ("source", "argv", "said", "line"),
    [
        ("p.add_argument('--bs', default=32)\n", ("--bs", "16"), "the command line sets it (`--bs 16`)", None),
        (
            "train = DataLoader(a, batch_size=32)\nvalid = DataLoader(b, batch_size=256)\n",
            (),
            "2 `batch_size=` keywords (lines 1, 2)",
            1,
        ),
        ("p.add_argument('-b', default=2 * 16)\n", (), "the default is the expression `2 * 16`", 1),
        ("loader = DataLoader(data, batch_size=args.bs)\n", (), "has no `--batch-size` option", None),
        ("NUM_BATCHES = 100\n", (), "has no `--batch-size` option", None),  # a count of batches, no batch size
    ],
    ids=["command-line", "two-keywords", "no-literal", "none", "number-of-batches"],
)
def test_set_batch_size_leaves_a_script_alone_where_its_literal_is_not_clear(tmp_path, source, argv, said, line):
    script = tmp_path / "train.py"
    script.write_text(source)
    with pytest.raises(EntryPointError) as raised:
        set_script_batch_size(script, tmp_path, 64, argv)
    assert said in str(raised.value)
    assert raised.value.line == line
    assert script.read_text() == source


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("BATCH_SIZE = 8\nloader = DataLoader(data, batch_size=BATCH_SIZE)\n", "BATCH_SIZE = 64\n"),
        ("loader = DataLoader(data, batch_size=128, shuffle=True)\n", "batch_size=64, shuffle"),
    ],
    ids=["constant", "keyword"],
)
def test_set_batch_size_rewrites_a_scripts_constant_or_keyword(tmp_path, source, expected):
    script = tmp_path / "train.py"
    script.write_text(source)
    set_script_batch_size(script, tmp_path, 64, ())
    assert expected in script.read_text()


def test_an_entry_point_takes_no_script_arguments(project):
    entry = (REPO / "examples" / "default" / "entry_point.py").read_text()
    (project / "entry_point.py").write_text(entry)
    with pytest.raises(EntryPointError, match=r"the arguments after `--` are a training script's own") as raised:
        analysed(project, "entry_point.py", script_args=("--epochs", "1"))
    assert raised.value.path == "entry_point.py"
