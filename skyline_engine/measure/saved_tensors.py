"""Saved-tensor hooks, where the user's iteration lets them run.

The breakdown counts activations as autograd saves them (attribute/recorder.py), and the memory
meters run hooks that change nothing so that they see the same operations as the recorder
(measure/memory.py, measure/retention.py). torch.func's transforms (grad, vjp, jacrev, hessian)
refuse to run under any saved-tensor hook: a functional training step (`torch.func.grad` of a
`functional_call`) failed at its first recorded iteration. So the first warm-up iteration runs
under hooks that change nothing (measure/iteration.py); when torch refuses them, every part runs
without hooks for the rest of the analysis, and activations are not counted by line.

A pack hook keeps the tensor detached (`kept`): the tensor itself carries its grad_fn, which holds
the saved tensor, a reference cycle through autograd's C++ graph that no garbage collection frees.
Backward breaks it; a graph never backwarded (a GAN's `generator(noise).detach()`, a metric
computed with gradients on) stayed alive for good, and read as the user's leak.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

# What torch.func's RuntimeError says ("torch.func.{grad, vjp, jacrev, hessian} don't yet support
# saved tensor hooks. ...").
REFUSAL = "support saved tensor hooks"


class _Switch:
    """Whether this analysis's iteration refused the hooks (one analysis runs at a time in a process)."""

    refused = False


_SWITCH = _Switch()


def hooks(pack: Callable[[torch.Tensor], Any]) -> contextlib.AbstractContextManager[Any]:
    """Autograd's saved-tensor hooks: `pack`, which keeps what `kept` keeps (a tensor autograd
    unpacks as it is), or nothing where the iteration refuses them."""
    if _SWITCH.refused:
        return contextlib.nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(pack, _same)


def unchanged() -> contextlib.AbstractContextManager[Any]:
    """Saved-tensor hooks that change nothing: an iteration run under them dispatches the same
    operations as one recorded for the breakdown (without any, autograd saves some outputs
    through an extra `detach`)."""
    return hooks(kept)


def refuse(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is torch refusing saved-tensor hooks; if so, none run
    from now on."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, RuntimeError) and REFUSAL in str(cause):
            _SWITCH.refused = True
            return True
        cause = cause.__cause__
    return False


def allow() -> None:
    """Hooks run again (a new analysis: its iteration may allow them)."""
    _SWITCH.refused = False


def kept(tensor: torch.Tensor) -> torch.Tensor:
    """What a pack hook keeps of a saved tensor: the tensor detached, which is all autograd needs
    (it restores the grad_fn on unpacking; see the module docstring). The detach is hidden from
    dispatch modes, so that the recorder and the meters see the iteration's operations alone."""
    if type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter:
        with torch._C._DisableTorchDispatch():
            return tensor.detach()
    return tensor.detach()  # a tensor subclass: its own dispatch must see it


def _same(tensor: Any) -> Any:
    return tensor
