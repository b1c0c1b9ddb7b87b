"""Communication attributed to the user's lines: each gradient bucket's exposed all-reduce time,
shared among the lines whose forward calls used its parameters (their backward produced the
gradients), by the bytes of the parameters; a parameter used outside a module call counts for the
line that created it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import Context
from skyline_engine.measure.distributed import BucketTiming


class ParameterCallSites:
    """Where each parameter's module is called from: the innermost project frame at the call."""

    def __init__(self, model: torch.nn.Module, creation: CreationSites) -> None:
        self.creation = creation
        self._owned = {id(m): [p for p in m._parameters.values() if p is not None] for m in model.modules()}
        self.lines: dict[int, Context] = {}

    @contextmanager
    def watching(self) -> Iterator[None]:
        handle = torch.nn.modules.module.register_module_forward_pre_hook(self._called)
        try:
            yield
        finally:
            handle.remove()

    def _called(self, module: torch.nn.Module, args: object) -> None:
        parameters = self._owned.get(id(module))
        if not parameters:
            return
        context, _ = self.creation.call_sites.innermost()
        if context is not None:
            for parameter in parameters:
                self.lines.setdefault(id(parameter), context)

    def lines_of(self, parameter: torch.Tensor) -> list[Context]:
        """The line that called the parameter's module, and the line that created it."""
        lines = [self.lines[id(parameter)]] if id(parameter) in self.lines else []
        created = self.creation.tensor_stack(parameter)
        if created and created[0] not in lines:
            lines.append(created[0])
        return lines


@dataclass(frozen=True)
class BucketLines:
    index: int
    parameter_names: list[str]
    lines: list[Context]


def attribute_buckets(
    buckets: Sequence[BucketTiming], model: torch.nn.Module, sites: ParameterCallSites
) -> tuple[list[BucketLines], dict[Context, float]]:
    """Each bucket's parameter names and lines, and the exposed milliseconds of each calling line."""
    names = {id(p): name for name, p in model.named_parameters(prefix="model")}
    described = []
    per_line: dict[Context, float] = defaultdict(float)
    for bucket in buckets:
        lines: list[Context] = []
        total = sum(_bytes(p) for p in bucket.parameters) or 1
        for parameter in bucket.parameters:
            found = sites.lines_of(parameter)
            lines.extend(line for line in found if line not in lines)
            if found:  # the calling line where known, else the creating one
                per_line[found[0]] += bucket.exposed_ms * _bytes(parameter) / total
        described.append(BucketLines(bucket.index, [names.get(id(p), "?") for p in bucket.parameters], lines))
    return described, dict(per_line)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
