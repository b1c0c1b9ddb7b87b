"""The engine's own hold on the tensors alive at the memory peak. A classifier's logits are
freed once its cross-entropy has run; the engine kept the model's last output (to check the loss
is finite) through backward and into the next iteration, so every peak it measured held them (a
1 MiB tensor in a 4.3 MiB peak). The real engine on iterations whose tensors are known by
construction: a Linear to 4,096 classes, 64 samples, so the logits and each gradient flowing back
through the cross-entropy are 1 MiB of float32."""

from __future__ import annotations

from service_client import marked_line
from skyline_engine.analysis.session import AnalysisRequest, analyze
from skyline_engine.measure.timing import TimingBudget

QUICK = TimingBudget(min_run_s=0.05, max_run_s=0.3)
LOGITS_BYTES = 64 * 4096 * 4

HEAD = """\
import torch
import torch.nn.functional as F


def skyline_model_provider():
    return torch.nn.Linear(16, 4096)


def skyline_input_provider(batch_size=64):
    return torch.randn(batch_size, 16), torch.randint(0, 4096, (batch_size,))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def iteration(x, y):
        optimizer.zero_grad()
"""
TAIL = """\
        loss.backward()
        optimizer.step()

    return iteration
"""
# The logits dropped as soon as the loss is computed, or held by a name to the end of the iteration.
DROPPED = "        loss = F.cross_entropy(model(x), y)  # LOSS\n"
HELD = "        logits = model(x)  # LOGITS\n        loss = F.cross_entropy(logits, y)  # LOSS\n"


def analysed(tmp_path, body: str, name: str) -> tuple[dict, dict[str, int]]:
    entry = tmp_path / name
    entry.write_text(HEAD + body + TAIL, encoding="utf-8")
    request = AnalysisRequest(name, tmp_path, device="cpu", budget=QUICK, predict=False)
    document = analyze(request).to_dict()
    return document, {mark: marked_line(entry, mark) for mark in ("LOSS", "LOGITS") if f"# {mark}" in body}


def test_the_engine_holds_no_output_holding_the_logits_costs_exactly_their_bytes(tmp_path):
    held, _ = analysed(tmp_path, HELD, "held.py")
    dropped, _ = analysed(tmp_path, DROPPED, "dropped.py")
    peaks = [doc["iteration"]["peak_memory_bytes"] for doc in (held, dropped)]
    assert peaks[0] - peaks[1] == LOGITS_BYTES
