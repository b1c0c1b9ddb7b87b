"""Where the model's parameters and the optimizer were created, in the user's code.

Weight memory belongs to the line that created the module (`self.fc = nn.Linear(...)`), optimizer
state to the line that constructed the optimizer. Both are found while the providers run:
torch's global parameter/buffer registration hooks for modules, and a profile function for the
optimizer's constructor (torch offers no construction hook for optimizers; the profile function
is active only while `skyline_iteration_provider` runs).
"""

from __future__ import annotations

import sys
import weakref
from typing import Dict, List, Tuple

import torch

from skyline_engine.attribute.frames import CallSites, Context

Stack = Tuple[Context, ...]

_OPTIMIZER_INIT = torch.optim.Optimizer.__init__.__code__


class CreationSites:
    def __init__(self, call_sites: CallSites) -> None:
        self.call_sites = call_sites
        # The project frames (innermost first) where each parameter or buffer was registered and
        # each optimizer constructed, keyed by the object's id.
        self.tensors: Dict[int, Stack] = {}
        self.optimizers: Dict[int, Stack] = {}
        self._optimizer_refs: List[weakref.ref] = []

    def optimizer_objects(self) -> List[torch.optim.Optimizer]:
        """The optimizers constructed while recording that are still alive."""
        return [o for o in (ref() for ref in self._optimizer_refs) if o is not None]

    def tensor_stack(self, tensor: torch.Tensor) -> Stack:
        return self.tensors.get(id(tensor), ())

    def optimizer_stack(self, optimizer) -> Stack:
        return self.optimizers.get(id(optimizer), ())

    def recording_modules(self) -> "_ModuleCreation":
        return _ModuleCreation(self)

    def recording_optimizers(self) -> "_OptimizerCreation":
        return _OptimizerCreation(self)


class _ModuleCreation:
    def __init__(self, sites: CreationSites) -> None:
        self.sites = sites
        self._handles = []

    def __enter__(self):
        register = torch.nn.modules.module
        self._handles = [
            register.register_module_parameter_registration_hook(self._registered),
            register.register_module_buffer_registration_hook(self._registered),
        ]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()

    def _registered(self, module, name, tensor) -> None:
        if tensor is None:
            return
        stack, _ = self.sites.call_sites.stack(skip=1)
        if stack:
            self.sites.tensors.setdefault(id(tensor), stack)


class _OptimizerCreation:
    def __init__(self, sites: CreationSites) -> None:
        self.sites = sites
        self._previous = None

    def __enter__(self):
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._previous)

    def _profile(self, frame, event, arg) -> None:
        if event == "call" and frame.f_code is _OPTIMIZER_INIT:
            optimizer = frame.f_locals.get("self")
            stack, _ = self.sites.call_sites.stack(skip=1)
            if optimizer is not None and id(optimizer) not in self.sites.optimizers:
                self.sites.optimizers[id(optimizer)] = stack
                self.sites._optimizer_refs.append(weakref.ref(optimizer))
