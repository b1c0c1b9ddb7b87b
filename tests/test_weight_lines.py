"""Weight memory lands on a line for modules that are copies: `nn.TransformerEncoder(layer, 2)`
clones its layer with `copy.deepcopy`, and so do hand-written `clones()` helpers; a copy registers
none of its parameters, so they had no line (2 MiB of a small encoder's weights and gradients
belonged to nothing). A sparse Embedding's gradient counts the rows it holds, not the table. The
real engine, breaking down one analysis of a purpose-built model (no predictions: quicker)."""

from __future__ import annotations

import pytest

from engine_helpers import analysed, marked_line

pytestmark = pytest.mark.slow  # an analysis

TOKENS, BATCH = 12, 4

ENTRY = f"""\
import copy

import torch
import torch.nn as nn


def clones(module, n):
    return nn.ModuleList(copy.deepcopy(module) for _ in range(n))  # CLONES


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 32, sparse=True)  # EMBED
        layer = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)  # ENCODER
        self.blocks = clones(nn.Linear(32, 32), 3)  # BLOCKS
        self.head = nn.Linear(32, 2)  # HEAD
        self.head2 = nn.Linear(32, 2)  # TIED
        self.head2.weight = self.head.weight

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens))
        for block in self.blocks:
            h = block(h)
        return (self.head(h) + self.head2(h)).pow(2).mean()


def skyline_model_provider():
    return Net()


def skyline_input_provider(batch_size={BATCH}):
    return (torch.randint(0, 1000, (batch_size, {TOKENS})),)


def skyline_iteration_provider(model):
    sparse = torch.optim.SparseAdam(list(model.embed.parameters()))
    dense = torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("embed")], lr=0.01)

    def iteration(tokens):
        sparse.zero_grad()
        dense.zero_grad()
        model(tokens).backward()
        sparse.step()
        dense.step()

    return iteration
"""


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    return analysed(tmp_path_factory.mktemp("weights"), source=ENTRY, predict=False)


def weights_at(document, line):
    return [w for w in document["weights"] if w["contexts"] and w["contexts"][0]["line"] == line]


def test_every_weight_has_a_line(document):
    assert [w["name"] for w in document["weights"] if not w["contexts"]] == []


def test_a_cloned_layers_weights_belong_to_the_line_that_made_the_clones(document):
    encoder = weights_at(document, marked_line(ENTRY, "# ENCODER"))
    assert {w["name"].split(".")[3] for w in encoder} == {"0", "1"}  # model.encoder.layers.<i>
    assert all(w["name"].startswith("model.encoder.layers.") for w in encoder)
    # A helper of the project that makes the copies is their line, as for any weight it creates;
    # the line that called it comes next.
    blocks = weights_at(document, marked_line(ENTRY, "# CLONES"))
    assert sorted(w["name"] for w in blocks) == [f"model.blocks.{i}.{p}" for i in range(3) for p in ("bias", "weight")]
    assert all(w["contexts"][1]["line"] == marked_line(ENTRY, "# BLOCKS") for w in blocks)
    line = next(row for row in document["lines"] if row["line"] == marked_line(ENTRY, "# ENCODER"))
    assert line["memory_bytes"] == sum(w["size_bytes"] + w["grad_size_bytes"] for w in encoder)


def test_a_tied_weight_keeps_the_line_that_made_it(document):
    names = [w["name"] for w in weights_at(document, marked_line(ENTRY, "# HEAD"))]
    assert "model.head.weight" in names and "model.head.bias" in names
    assert [w["name"] for w in weights_at(document, marked_line(ENTRY, "# TIED"))] == ["model.head2.bias"]


def test_a_sparse_gradient_counts_its_rows(document):
    (embed,) = weights_at(document, marked_line(ENTRY, "# EMBED"))
    assert embed["size_bytes"] == 1000 * 32 * 4
    # The rows of the batch's tokens (coalesced at most once each) with their indices, not the table.
    rows = BATCH * TOKENS
    assert 0 < embed["grad_size_bytes"] <= rows * (32 * 4 + 8)
