"""Every torch API the engine names exists in the torch installed.

The engine leans on torch internals (dispatch modes, autograd's sequence numbers, global optimizer
and module hooks, DDP's communication hooks) that a torch release may move. The names are read
from the engine's own source, so none is forgotten here; bench/gpu_check.sh runs this file on the
GPU machine's torch (2.11) as well as CI does on this one's.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

ENGINE = Path(__file__).resolve().parent.parent / "skyline_engine"


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "torch":
        return ".".join(["torch", *reversed(parts)])
    return None


def torch_names_in_the_engine() -> dict[str, str]:
    """Each `torch.a.b` the engine writes, and each name it imports from torch: where it is used."""
    found: dict[str, str] = {}
    for path in sorted(ENGINE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Attribute):  # `torch.a.b` and, on the way, `torch.a`
                dotted = _dotted(node)
                if dotted:
                    names.append(dotted)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
                names += [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names += [alias.name for alias in node.names if alias.name.split(".")[0] == "torch"]
            for name in names:
                found.setdefault(name, f"{path.relative_to(ENGINE.parent)}:{node.lineno}")
    return found


def resolves(dotted: str) -> bool:
    """Import the longest module prefix, then follow attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


NAMES = torch_names_in_the_engine()


def test_the_engine_names_the_internals_it_relies_on():
    # The walk finds what matters: if it found none of these, the test below would prove nothing.
    for name in ("torch._C._current_autograd_node", "torch.utils._python_dispatch.TorchDispatchMode"):
        assert name in NAMES


@pytest.mark.parametrize("name", sorted(NAMES))
def test_each_torch_name_the_engine_uses_exists(name):
    assert resolves(name), f"{name} (used at {NAMES[name]}) does not exist in this torch"


def test_operator_schemas_say_what_they_write():
    # attribute/updates.py reads an operator's schema to find the arguments it writes in place
    # (`p -= lr * p.grad` is aten.sub_ writing its self): attributes of torch's C++ schema
    # objects, which the walk above does not see.
    sub_ = torch.ops.aten.sub_.Tensor._schema
    assert sub_.is_mutable and not torch.ops.aten.sub.Tensor._schema.is_mutable
    written = [a.name for a in sub_.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["self"]
    out = torch.ops.aten.add.out._schema
    assert [a.name for a in out.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write] == [
        "out"
    ]
