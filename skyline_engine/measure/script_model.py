"""Which module a training script trains, and with how many samples: from the calls it makes.

A script hands Skyline no model and no inputs. The model is the outermost module it calls (no
other module's forward around the call) whose parameters its optimizer updates; the batch size is
the leading dimension of the first tensor that call gets (positional, or by keyword as Hugging
Face models are called). Seen through torch's global module forward hooks over one iteration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._pytree import tree_leaves


@dataclass
class OutermostCalls:
    """The outermost module calls seen, in order, each once, with the leading dimension of the
    first tensor each got (None when it got no tensor with a dimension)."""

    calls: dict[int, tuple[torch.nn.Module, int | None]] = field(default_factory=dict)
    _depth: int = 0

    def model(self, optimizer: torch.optim.Optimizer | None) -> tuple[torch.nn.Module, int | None] | None:
        """The first outermost module whose parameters `optimizer` updates (the first called
        where no optimizer is known), with its batch size."""
        updated = {id(p) for group in optimizer.param_groups for p in group["params"]} if optimizer else None
        for module, batch_size in self.calls.values():
            if updated is None or any(id(p) in updated for p in module.parameters()):
                return module, batch_size
        return None

    def others(self, model: torch.nn.Module) -> dict[str, torch.nn.Module]:
        """The other outermost modules with parameters (a GAN's discriminator, an EMA copy), by
        their class names: their weights count beside the model's."""
        held: dict[str, torch.nn.Module] = {}
        for module, _ in self.calls.values():
            if module is not model and any(True for _ in module.parameters()):
                name = type(module).__name__
                held[name if name not in held else f"{name}_{len(held)}"] = module
        return held

    def _before(self, module: torch.nn.Module, args: Any) -> None:
        if self._depth == 0 and id(module) not in self.calls:
            self.calls[id(module)] = (module, _leading_dimension(args))
        self._depth += 1

    def _after(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        # torch's global pre-hook gets no keyword arguments, its global forward hook does: a model
        # called by keyword (`model(**batch)`, as Hugging Face's Trainer calls it) is read here.
        if self._depth == 0 and self.calls.get(id(module), (None, 0))[1] is None:
            self.calls[id(module)] = (module, _leading_dimension(kwargs))


@contextlib.contextmanager
def watching_outermost_calls() -> Iterator[OutermostCalls]:
    seen = OutermostCalls()
    pre = register_module_forward_pre_hook(seen._before)
    post = register_module_forward_hook(seen._after, with_kwargs=True)
    try:
        yield seen
    finally:
        pre.remove()
        post.remove()


def _leading_dimension(arguments: Any) -> int | None:
    for leaf in tree_leaves(arguments):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return None
