"""Training frameworks through the training-script mechanism: a LightningModule trained by
Lightning's `Trainer.fit` and a Hugging Face model trained by transformers' `Trainer.train`, each
profiled unchanged by the real CLI in a subprocess (the frameworks set process-wide state: signal
handlers, warning filters, float32 matmul precision), stopped once measured though told to train
for 1,000 epochs. Both frameworks are test extras (pyproject.toml), never the plugin's dependencies."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, run_skyline
from engine_helpers import marked_line

FRAMEWORKS = REPO / "tests" / "projects" / "frameworks"


@pytest.fixture
def project(tmp_path) -> Path:
    shutil.copytree(FRAMEWORKS, tmp_path / "project")
    return tmp_path / "project"


def profiled(project: Path, script: str) -> dict:
    document = project / "document.json"
    result = run_skyline("profile", script, "--device", "cpu", "--json", document, cwd=project)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(document.read_text(encoding="utf-8"))


def line_of(doc: dict, path: str, number: int) -> dict:
    (line,) = [line for line in doc["lines"] if line["path"] == path and line["line"] == number]
    return line


def modules_in(node: dict) -> set[str]:
    """The modules of the document's operation tree, by their paths in the model."""
    found = {node["module"]} if node.get("kind") == "module" else set()
    for child in node.get("children") or []:
        found |= modules_in(child)
    return found


def literal_at(project: Path, location: dict) -> bytes:
    text = (project / location["path"]).read_text(encoding="utf-8").splitlines()[location["line"] - 1]
    return text.encode()[location["col_start"] : location["col_end"]]


@pytest.mark.slow
def test_a_lightning_module_trained_by_trainer_fit(project):
    doc = profiled(project, "lightning_train.py")
    script = project / "lightning_train.py"
    # Lightning calls the module's training_step, which calls the module itself: the model.
    assert doc["entry_point"] == "lightning_train.py" and doc["batch_size"] == 32
    location = doc["batch_size_location"]
    assert location["editable"] and literal_at(project, location) == b"32"
    assert location["line"] == marked_line(script, "BATCH_SIZE = 32")
    # Forward and backward inside the step's closure (Lightning runs them there) are still the
    # forward and backward passes, at the user's lines.
    forward = line_of(doc, "lightning_train.py", marked_line(script, "# FORWARD"))
    assert forward["forward_ms"] > 0 and forward["backward_ms"] > 0
    assert line_of(doc, "lightning_train.py", marked_line(script, "# LOSS"))["forward_ms"] > 0
    # The optimizer steps inside Lightning, called from `trainer.fit`: its time stands there.
    assert line_of(doc, "lightning_train.py", marked_line(script, "trainer.fit(Classifier(), loader)"))["step_ms"] > 0
    assert doc["optimizer_state"] and doc["iteration"]["micro_batches"] == 1
    # Other batch sizes: Trainer.fit run again with the literal set in memory.
    assert len(doc["models"]["samples"]) >= 2


@pytest.mark.slow
def test_a_hugging_face_model_trained_by_trainer_train(project):
    doc = profiled(project, "hf_train.py")
    script = project / "hf_train.py"
    # The Trainer calls the model by keyword (`model(**inputs)`): the batch is input_ids' leading dimension.
    assert doc["entry_point"] == "hf_train.py" and doc["batch_size"] == 16
    location = doc["batch_size_location"]
    assert location["editable"] and literal_at(project, location) == b"16"
    assert location["line"] == marked_line(script, "per_device_train_batch_size=16")
    # The model is library code: its forward, backward and the step stand at `trainer.train()`, and
    # its modules say where inside it the time went.
    train = line_of(doc, "hf_train.py", marked_line(script, "trainer.train()"))
    assert train["forward_ms"] > 0 and train["backward_ms"] > 0 and train["step_ms"] > 0
    assert {"model.bert.encoder.layer.0", "model.bert.encoder.layer.1"} <= modules_in(doc["operations"])
    assert doc["optimizer_state"]
    assert len(doc["models"]["samples"]) >= 2  # Trainer.train run again at other batch sizes
