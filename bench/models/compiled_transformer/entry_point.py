"""The benchmark's compiled model: the transformer example's entry point, unchanged but for
torch.compile around its model."""

import importlib.util
import sys
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "transformer"
sys.path.insert(0, str(EXAMPLE))  # its `from model import ...`
_spec = importlib.util.spec_from_file_location("transformer_example", EXAMPLE / "entry_point.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

skyline_input_provider = example.skyline_input_provider
skyline_iteration_provider = example.skyline_iteration_provider


def skyline_model_provider():
    return torch.compile(example.skyline_model_provider())
