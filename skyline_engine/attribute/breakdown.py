"""From a recorded iteration to the breakdown: per line, per module and operation, per weight.

Definitions (also in docs/analysis-document.md):
- A line's `forward_ms` is the time of the operations it ran itself (the innermost project frame
  at the operation was at that line), forward or optimizer; its `backward_ms` is the time of the
  backward operations of autograd nodes its forward operations created.
- A line's `memory_bytes` is the activation memory its operations left for backward, plus the
  weights and gradients of the modules it created, plus the optimizer state of an optimizer it
  constructed.
- `untracked` is what the measured iteration holds beyond the attributed parts: time between
  operations (Python, framework overhead, idle device) and memory not in those categories.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

import torch

from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import Context
from skyline_engine.attribute.recorder import BACKWARD, FORWARD, OperationRecord, Recording


@dataclass
class _Line:
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    memory_bytes: int = 0
    invocations: set = field(default_factory=set)


@dataclass
class _Node:
    name: str
    module: str
    kind: str  # "module" or "operation"
    contexts: list[Context] = field(default_factory=list)
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    activation_bytes: int = 0
    children: OrderedDict[tuple, _Node] = field(default_factory=OrderedDict)

    def child(self, key: tuple, make) -> _Node:
        node = self.children.get(key)
        if node is None:
            node = self.children[key] = make()
        return node

    def totals(self) -> None:
        for child in self.children.values():
            child.totals()
        if self.kind == "module":
            self.forward_ms = sum(c.forward_ms for c in self.children.values())
            self.backward_ms = sum(c.backward_ms for c in self.children.values())
            self.activation_bytes = sum(c.activation_bytes for c in self.children.values())

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "module": self.module,
            "forward_ms": self.forward_ms,
            "backward_ms": self.backward_ms,
            "activation_bytes": self.activation_bytes,
            "contexts": [_context_dict(c) for c in self.contexts],
            "children": [c.to_dict() for c in self.children.values()],
        }


def build_breakdown(
    recording: Recording,
    iterations: int,
    model: torch.nn.Module,
    creation: CreationSites,
    run_time_ms: float,
    peak_memory_bytes: int,
    timeline: bool = False,
) -> dict:
    """The breakdown's part of the analysis document; times are per iteration (`iterations`
    iterations were recorded). With `timeline`, the first recorded iteration's operations too."""
    first_iteration = _timeline(recording.first_iteration()) if timeline else None
    operations = _per_iteration(recording.operations, iterations)
    recorded_ms = sum(op.duration_ms for op in operations)
    scale = _fit_to_iteration(operations, recorded_ms, run_time_ms)
    lines: dict[Context, _Line] = OrderedDict()
    for op in operations:
        if op.context is None:
            continue
        line = lines.setdefault(op.context, _Line())
        if op.phase == FORWARD:
            line.forward_ms += op.duration_ms
            line.invocations.add(op.invocation)
            line.memory_bytes += op.activation_bytes
        else:
            line.backward_ms += op.duration_ms

    weights = _weights(model, creation)
    optimizer_state = _optimizer_state(creation)
    for entry in weights + optimizer_state:
        if entry["contexts"]:
            innermost = entry["contexts"][0]
            line = lines.setdefault((innermost["path"], innermost["line"]), _Line())
            line.memory_bytes += entry["size_bytes"] + entry.get("grad_size_bytes", 0)

    attributed_ms = sum(op.duration_ms for op in operations if op.context is not None)
    all_ops_ms = sum(op.duration_ms for op in operations)
    tracked_memory = (
        sum(op.activation_bytes for op in operations)
        + sum(w["size_bytes"] + w["grad_size_bytes"] for w in weights)
        + sum(s["size_bytes"] for s in optimizer_state)
    )
    breakdown = {
        "lines": [_line_dict(ctx, line) for ctx, line in lines.items()],
        "operations": _operation_tree(operations, recording).to_dict(),
        "weights": weights,
        "optimizer_state": optimizer_state,
        "untracked": {
            "run_time_ms": max(0.0, run_time_ms - attributed_ms),
            "memory_bytes": max(0, peak_memory_bytes - tracked_memory),
        },
        "attribution": {
            "recorded_iterations": iterations,
            "operations_ms": all_ops_ms,
            "user_lines_ms": attributed_ms,
            "user_lines_fraction": attributed_ms / run_time_ms if run_time_ms > 0 else None,
            "scaled_by": scale,
        },
    }
    if first_iteration is not None:
        breakdown["timeline"] = first_iteration
    return breakdown


def _timeline(operations: list[OperationRecord]) -> list[dict]:
    origin = operations[0].start_ms if operations else 0.0
    return [
        {
            "name": op.name,
            "phase": op.phase,
            "start_ms": op.start_ms - origin,
            "duration_ms": op.duration_ms,
            "path": op.context[0] if op.context else None,
            "line": op.context[1] if op.context else None,
            "module": op.module,
        }
        for op in operations
    ]


def _fit_to_iteration(operations: list[OperationRecord], recorded_ms: float, run_time_ms: float) -> float:
    """Operations can run slower while recorded than in the measured iteration (the recorder's own
    work between them evicts caches; the machine's load can change). When their sum exceeds the
    measured iteration, scale them to it, so that lines and `untracked` add up to the iteration;
    the factor is reported as `attribution.scaled_by`."""
    if recorded_ms <= run_time_ms or recorded_ms <= 0:
        return 1.0
    scale = run_time_ms / recorded_ms
    for op in operations:
        op.duration_ms *= scale
    return scale


def _per_iteration(operations: list[OperationRecord], iterations: int) -> list[OperationRecord]:
    """Copies of the records of `iterations` recorded iterations, scaled to one iteration. Copies:
    a recording is broken down more than once (a first result, then the final one)."""
    copies = {
        id(op): replace(op, duration_ms=op.duration_ms / iterations, activation_bytes=op.activation_bytes // iterations)
        for op in operations
    }
    for op in copies.values():
        if op.creator is not None:
            op.creator = copies.get(id(op.creator), op.creator)
    return list(copies.values())


def _line_dict(ctx: Context, line: _Line) -> dict:
    return {
        "path": ctx[0],
        "line": ctx[1],
        "forward_ms": line.forward_ms,
        "backward_ms": line.backward_ms,
        "memory_bytes": line.memory_bytes,
        "invocations": len(line.invocations),
    }


def _context_dict(ctx: Context) -> dict:
    return {"path": ctx[0], "line": ctx[1]}


def _operation_tree(operations: list[OperationRecord], recording: Recording) -> _Node:
    """Modules in execution order, each with its operations (one node per operation name and
    line) and its submodules; operations outside any module hang from the root."""
    root = _Node("iteration", "", "module")
    call_sites: dict[str, list[Context]] = {}
    for call in recording.module_calls:
        sites = call_sites.setdefault(call.path, [])
        if call.context is not None and call.context not in sites:
            sites.append(call.context)
    leaves: dict[int, _Node] = {}
    for op in operations:
        if op.phase == FORWARD:
            leaf = _leaf(root, op, call_sites)
            leaf.forward_ms += op.duration_ms
            leaf.activation_bytes += op.activation_bytes
            leaves[id(op)] = leaf
    for op in operations:
        if op.phase != BACKWARD:
            continue
        leaf = leaves.get(id(op.creator)) if op.creator is not None else None
        if leaf is None:
            name = op.node_name or op.name
            leaf = root.child(
                ("backward", name, op.stack),
                lambda name=name, stack=op.stack: _Node(name, "", "operation", list(stack)),
            )
        leaf.backward_ms += op.duration_ms
    root.totals()
    return root


def _leaf(root: _Node, op: OperationRecord, call_sites: dict[str, list[Context]]) -> _Node:
    node = root
    if op.module:
        parts = op.module.split(".")
        for depth in range(1, len(parts) + 1):
            path = ".".join(parts[:depth])
            node = node.child(
                ("module", path),
                lambda name=parts[depth - 1], path=path: _Node(name, path, "module", list(call_sites.get(path, []))),
            )
    return node.child(("operation", op.name, op.stack), lambda: _Node(op.name, op.module, "operation", list(op.stack)))


def _weights(model: torch.nn.Module, creation: CreationSites) -> list[dict]:
    entries = []
    seen = set()
    for name, param in model.named_parameters(prefix="model"):
        if id(param) in seen:
            continue
        seen.add(id(param))
        grad = param.grad
        entries.append(
            {
                "name": name,
                "size_bytes": _bytes(param),
                "grad_size_bytes": _bytes(grad) if grad is not None else 0,
                "contexts": _stack_dicts(creation.tensor_stack(param)),
            }
        )
    return entries


def _optimizer_state(creation: CreationSites) -> list[dict]:
    entries = []
    for optimizer in creation.optimizer_objects():
        size = 0
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    size += _bytes(value)
        entries.append(
            {
                "name": type(optimizer).__name__,
                "size_bytes": size,
                "contexts": _stack_dicts(creation.optimizer_stack(optimizer)),
            }
        )
    return entries


def _stack_dicts(stack) -> list[dict]:
    return [_context_dict(ctx) for ctx in stack]


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
