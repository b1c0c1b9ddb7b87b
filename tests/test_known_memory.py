"""What an analysis takes from the previous analysis of the same code (analysis/known_memory.py):
the memory of batch sizes measured before and the memory growth check, only where the code is
unchanged (the batch-size literal aside) and the memory measured now at the user's batch size
agrees; nothing otherwise. Real analyses of a small model, in this process, as the service's
workers run them one after another."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from engine_helpers import QUICK
from skyline_engine.analysis.known_memory import KnownMemory
from skyline_engine.analysis.session import AnalysisRequest, analyze
from skyline_engine.entry.user_frames import ProjectFiles

pytestmark = pytest.mark.slow  # real analyses

MODEL = """\
import dataclasses
import json
from pathlib import Path

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        # The width comes from a data file, which no digest of the code sees.
        width = json.loads((Path(__file__).parent / "config.json").read_text())["width"]
        self.first = nn.Linear(32, width)
        self.second = nn.Linear(width, 1)

    def forward(self, x):
        return self.second(torch.relu(self.first(x))).pow(2).mean()
"""

ENTRY = """\
import torch

from model import Model


def skyline_model_provider():
    return Model()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 32),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters())

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return iteration
"""


class Analyses:
    """Analyses of one project in a row, each given what the one before it handed on."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.known: KnownMemory | None = None

    def run(self, batch_size: int | None = None) -> tuple[dict, list[str]]:
        """The document, and the phases its progress went through."""
        phases: list[str] = []
        handed: list[KnownMemory] = []
        request = AnalysisRequest(
            "entry_point.py", self.root, batch_size=batch_size, device="cpu", budget=QUICK, known_memory=self.known
        )
        document = analyze(request, progress=lambda phase, _: phases.append(phase), remember=handed.append)
        self.known = handed[-1] if handed else None
        return document.to_dict(), phases


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "entry_point.py").write_text(ENTRY)
    (tmp_path / "config.json").write_text(json.dumps({"width": 64}))
    return tmp_path


def peaks(document: dict) -> dict[int, int]:
    """Every batch size's peak memory the document gives: timed, confirming, memory alone."""
    models = document["models"]
    rows = [*models["samples"], *models["checks"], *models["memory_samples"]]
    return {row["batch_size"]: row["peak_memory_bytes"] for row in rows}


def measured_memory(phases: list[str]) -> set[int]:
    """The batch sizes whose memory the analysis measured, as its progress said."""
    prefix = "measuring the memory of batch size "
    return {int(phase[len(prefix) :].split(",")[0]) for phase in phases if phase.startswith(prefix)}


def test_an_unchanged_model_takes_the_memory_measured_before_and_says_so(project):
    analyses = Analyses(project)
    first, first_phases = analyses.run()
    assert first["reused"] is None
    probed = measured_memory(first_phases)
    assert probed  # the first measures its probes' memory

    second, second_phases = analyses.run()
    reused = second["reused"]
    assert reused is not None and reused["memory_growth_check_skipped"] is True
    taken = set(reused["memory_batch_sizes"])
    assert taken and taken <= probed
    assert not taken & measured_memory(second_phases)  # not measured again
    assert "not measured again" in reused["reason"]
    # The same figures, the user's batch size measured afresh among them.
    assert {b: peaks(second)[b] for b in taken} == {b: peaks(first)[b] for b in taken}
    assert second["iteration"]["peak_memory_bytes"] == first["iteration"]["peak_memory_bytes"]


def test_a_new_batch_size_literal_takes_what_still_holds(project):
    analyses = Analyses(project)
    first, _ = analyses.run()
    entry = project / "entry_point.py"
    entry.write_text(entry.read_text().replace("batch_size=32", "batch_size=64"))
    second, phases = analyses.run()
    assert second["batch_size"] == 64
    reused = second["reused"]
    # The growth check skipped: 64's memory, measured now, agrees with the line through the
    # memory measured before (64 was one of its probes, or lies on their line).
    assert reused is not None and reused["memory_growth_check_skipped"] is True
    assert set(reused["memory_batch_sizes"]) <= set(peaks(first))
    assert not set(reused["memory_batch_sizes"]) & measured_memory(phases)


def test_changed_code_takes_nothing(project):
    analyses = Analyses(project)
    analyses.run()
    assert analyses.known is not None  # something to take, were the code unchanged
    model = project / "model.py"
    model.write_text(model.read_text().replace("nn.Linear(width, 1)", "nn.Linear(width, 1, bias=False)"))
    second, phases = analyses.run()
    assert second["reused"] is None
    assert measured_memory(phases)


def test_a_changed_data_file_the_model_reads_takes_nothing(project):
    """No digest of the code sees config.json; the memory measured at the user's batch size
    disagrees with what is known, so nothing is taken and every figure is the new model's."""
    analyses = Analyses(project)
    first, _ = analyses.run()
    (project / "config.json").write_text(json.dumps({"width": 4096}))
    second, phases = analyses.run()
    assert second["reused"] is None
    assert measured_memory(phases)
    common = set(peaks(first)) & set(peaks(second))
    assert common and all(peaks(second)[b] > peaks(first)[b] for b in common)


def test_code_written_during_the_analysis_hands_nothing_on(project):
    """The code on disk at the end is not the code measured: nothing for the next analysis."""
    model = project / "model.py"
    entry = project / "entry_point.py"
    later = "\n\n# written while the analysis ran\n"
    # The model provider appends to model.py, as an editor's save during the analysis would.
    entry.write_text(
        entry.read_text().replace(
            "    return Model()", f"    Path({str(model)!r}).open('a').write({later!r})\n    return Model()"
        )
    )
    entry.write_text("from pathlib import Path\n" + entry.read_text())
    analyses = Analyses(project)
    document, _ = analyses.run()
    assert document["models"] is not None
    assert analyses.known is None


def test_known_memory_survives_the_trip_and_garbage_is_ignored(project):
    analyses = Analyses(project)
    analyses.run()
    known = analyses.known
    assert known is not None
    assert KnownMemory.from_dict(known.to_dict()) == known
    for garbage in (None, 3, "x", {}, {**known.to_dict(), "memory": [[0, {}]]}, {**known.to_dict(), "code": []}):
        assert KnownMemory.from_dict(garbage) is None
    # Files outside the project, which hashing would read (for ever, /dev/zero).
    for path in ("/dev/zero", "../../dev/zero"):
        assert KnownMemory.from_dict({**known.to_dict(), "code": {path: "0" * 64}}) is None
    (project / "device").symlink_to("/dev/zero")
    assert not dataclasses.replace(known, code={**known.code, "device": "0" * 64}).unchanged(
        project, None, known.device
    )


def test_the_projects_loaded_files_are_files_of_the_project_only(project, monkeypatch):
    """torch.ops and torch.classes name "_ops.py" and "_classes.py": relative names, which resolved
    against a working directory inside the project made them the project's files."""
    import torch  # noqa: F401 - its torch.ops

    monkeypatch.chdir(project)
    loaded = ProjectFiles(project).loaded()
    assert not any(os.path.basename(path) in ("_ops.py", "_classes.py") for path in loaded)


def test_known_memory_too_large_for_a_message_is_not_handed_on(project):
    """A model with very many operations: its profiles would crowd the document out of the
    worker's result message (the service reads 16 MiB of one at most); the next analysis then
    measures everything."""
    from skyline_engine.service.worker_main import MAX_KNOWN_MEMORY_BYTES, handed_on

    analyses = Analyses(project)
    analyses.run()
    known = analyses.known
    assert known is not None and handed_on(known) == known.to_dict()
    profile = next(iter(known.memory.values()))
    operations = MAX_KNOWN_MEMORY_BYTES // 8  # each at least a byte count and a name: 8 bytes or more
    large = dataclasses.replace(
        profile,
        operation_bytes=(1 << 20,) * operations,
        operation_names=("aten::mm",) * operations,
        phase_starts=((0, profile.phase_starts[0][1]),),
    )
    assert handed_on(dataclasses.replace(known, memory={8: large})) is None
