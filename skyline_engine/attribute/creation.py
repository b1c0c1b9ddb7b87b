"""Where the model's parameters and the optimizer were created, in the user's code.

Weight memory belongs to the line that created the module (`self.fc = nn.Linear(...)`), found
while the model provider runs through torch's global parameter/buffer registration hooks. A copied
module (`copy.deepcopy`, as `nn.TransformerEncoder` clones its layer) registers none of its
parameters: they belong to the line that registered the module holding the copies
(`self.encoder = nn.TransformerEncoder(layer, 6)`), seen by the module registration hook.
Optimizer state belongs to the line that constructed the optimizer. torch offers no construction
hook for optimizers, and a profile function active while the iteration provider runs would slow
everything it does (torch imports its compiler stack on the first optimizer), so the optimizers
are found as the ones that step while the user's batch size is measured (torch's global step
pre-hook: one that steps every fifth call is found too; a scan
of every object in the process cost 0.1 s), and their construction line by reading the project's
source for a call of the optimizer's class. Where several calls construct that class (a GAN's two
Adams), the one assigned to the name the stepping code holds the optimizer by (`opt_d` in
`opt_d.step()`, `self.optimizer`) is the optimizer's; the first call is, where no name tells.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import re
import sys
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from skyline_engine.attribute.frames import CallSites, Context
from skyline_engine.entry.user_frames import ProjectFiles

Stack = tuple[Context, ...]


class CreationSites:
    def __init__(self, call_sites: CallSites) -> None:
        self.call_sites = call_sites
        # The project frames (innermost first) where each parameter or buffer was registered, by
        # the tensor's id, with a weak reference that tells a later tensor under a reused id apart.
        self._tensors: dict[int, tuple[weakref.ref[torch.Tensor], Stack]] = {}
        # Where each optimizer was constructed, by its id.
        self.optimizers: dict[int, Stack] = {}
        # The names the project's code held each optimizer by when it stepped, by its id.
        self._optimizer_names: dict[int, frozenset[str]] = {}
        self._optimizer_refs: list[weakref.ref[torch.optim.Optimizer]] = []
        # Where each module the iteration holds was assigned, by the name it is held by.
        self._held: dict[str, Stack] = {}
        self._entry_path = ""

    def optimizer_objects(self) -> list[torch.optim.Optimizer]:
        """The optimizers found by `finding_optimizers` that are still alive."""
        return [o for o in (ref() for ref in self._optimizer_refs) if o is not None]

    def tensor_stack(self, tensor: torch.Tensor) -> Stack:
        ref, stack = self._tensors.get(id(tensor), (None, ()))
        return stack if ref is not None and ref() is tensor else ()

    def created(self, tensor: torch.Tensor, stack: Stack) -> None:
        """`tensor` was registered at `stack`, unless an earlier registration named it already (a
        tied weight keeps the line of the module that made it)."""
        if stack and not self.tensor_stack(tensor):
            self._tensors[id(tensor)] = (weakref.ref(tensor), stack)

    def optimizer_stack(self, optimizer: torch.optim.Optimizer) -> Stack:
        """Where `optimizer` was constructed: looked up in the entry point first, then in the other
        project modules (once per optimizer)."""
        key = id(optimizer)
        if key not in self.optimizers:
            names = self._optimizer_names.get(key, frozenset())
            context = _construction_line(type(optimizer).__name__, names, self._entry_path, self.call_sites.files)
            self.optimizers[key] = (context,) if context else ()
        return self.optimizers[key]

    def held_stack(self, name: str) -> Stack:
        """Where a module the iteration holds by `name` (measure/held_modules.py: `shadow`,
        `critics[1]`) was made, for its weights no registration named: a bare
        `copy.deepcopy(model)` registers none, and its 1 MiB of weights stood at no line. The
        first assignment of a call's result to that name, the entry point read first (as an
        optimizer's construction is found)."""
        root = re.split(r"[\[.]", name, maxsplit=1)[0]
        if root in _UNASSIGNED_NAMES:
            return ()
        if root not in self._held:
            context = _construction_line(None, frozenset({root}), self._entry_path, self.call_sites.files)
            self._held[root] = (context,) if context else ()
        return self._held[root]

    def recording_modules(self) -> _ModuleCreation:
        return _ModuleCreation(self)

    @contextlib.contextmanager
    def finding_optimizers(self, entry_path: str) -> Iterator[None]:
        """While active, every optimizer that steps is found; `entry_path` (relative) is where its
        construction is looked for first."""
        self._entry_path = entry_path
        handle = register_optimizer_step_pre_hook(self._stepped)
        try:
            yield
        finally:
            handle.remove()

    def _stepped(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if all(ref() is not optimizer for ref in self._optimizer_refs):
            self._optimizer_refs.append(weakref.ref(optimizer))
            self._optimizer_names[id(optimizer)] = self._names_of(optimizer, sys._getframe(1))

    def _names_of(self, optimizer: torch.optim.Optimizer, frame: FrameType | None) -> frozenset[str]:
        """The names the innermost project frame from `frame` outwards holds `optimizer` by: its
        variables (closures' too), its module's globals, and its variables' attributes
        (`self.optimizer`)."""
        files = self.call_sites.files
        while frame is not None and not files.contains(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None:
            return frozenset()
        local_values = _variables_of(frame)
        names = {name for name, value in [*local_values.items(), *frame.f_globals.items()] if value is optimizer}
        for value in local_values.values():
            try:
                attributes = vars(value)
            except Exception:  # noqa: BLE001 - no __dict__ (TypeError), or a user's __getattr__ raising anything
                continue
            names.update(attribute for attribute, held in attributes.items() if held is optimizer)
        return frozenset(names)


def _variables_of(frame: FrameType) -> dict[str, Any]:
    """The frame's variables, read without keeping them alive. Before Python 3.13, reading a
    function frame's `f_locals` stores a snapshot of its variables on the frame until the next
    read: a training script's `main()` frame lives through its loop, and the snapshot taken at its
    first step kept that iteration's batch, logits and loss alive in every iteration measured after
    (19 KiB more in the test script's peak than in any later run of it; a language model's logits
    are far larger). The snapshot is emptied once read: a tracer (a debugger, coverage) refreshes it
    from the variables before it reads or writes them. A module-level frame's `f_locals` is its
    globals, the script's own namespace, left alone."""
    variables = dict(frame.f_locals)
    if sys.version_info < (3, 13) and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        frame.f_locals.clear()
    return variables


# Names measure/held_modules.py gives what a partial holds, which no assignment in the code makes:
# a search for `args = ...` would find `args = parser.parse_args()`.
_UNASSIGNED_NAMES = frozenset({"func", "args"})


def _construction_line(
    class_name: str | None, names: frozenset[str], entry_path: str, files: ProjectFiles
) -> Context | None:
    """Where an object of `class_name`, held by `names`, was constructed: the entry point is
    read first; the first construction assigned to one of `names` wins over the first at all.
    With no class name, any call assigned to one of `names`."""
    found = _construction_in(files.root, entry_path, class_name, names)
    if found is not None and found[1]:
        return (entry_path, found[0])
    first = (entry_path, found[0]) if found is not None else None
    # Elsewhere in the project: only then the scan of every loaded module.
    for path in (path for path in files.loaded() if path != entry_path):
        found = _construction_in(files.root, path, class_name, names)
        if found is not None and found[1]:
            return (path, found[0])
        if found is not None and first is None:
            first = (path, found[0])
    return first


def _construction_in(root: str, path: str, class_name: str | None, names: frozenset[str]) -> tuple[int, bool] | None:
    """The line of the first call of `class_name` (None: of anything) in `path` assigned to one
    of `names`, with True; else of the first call of `class_name` at all, with False; None where
    the file has none."""
    try:
        with open(f"{root}/{path}", "rb") as f:
            tree = ast.parse(f.read())  # bytes: decoded as Python does (a BOM, an encoding declaration)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    calls, named = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and class_name is not None and _called(node) == class_name:
            calls.append(node.lineno)
        elif (
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, ast.Call)
            and (class_name is None or _called(node.value) == class_name)
            and _assigned_names(node) & names
        ):
            named.append(node.value.lineno)
    if named:
        return min(named), True
    return (min(calls), False) if calls else None


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _assigned_names(node: ast.Assign | ast.AnnAssign) -> set[str]:
    """The names an assignment binds: `opt = ...` binds opt, `self.opt = ...` binds opt."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id if isinstance(t, ast.Name) else t.attr for t in targets if isinstance(t, (ast.Name, ast.Attribute))}


class _ModuleCreation:
    def __init__(self, sites: CreationSites) -> None:
        self.sites = sites
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> _ModuleCreation:
        register = torch.nn.modules.module
        self._handles = [
            register.register_module_parameter_registration_hook(self._registered),
            register.register_module_buffer_registration_hook(self._registered),
            register.register_module_module_registration_hook(self._module_registered),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def _registered(self, module: torch.nn.Module, name: str, tensor: torch.Tensor | None) -> None:
        if tensor is not None:
            self.sites.created(tensor, self.sites.call_sites.stack(skip=1)[0])

    def _module_registered(self, module: torch.nn.Module, name: str, submodule: torch.nn.Module | None) -> None:
        """The tensors of a registered module that no registration named: copies."""
        if submodule is None:
            return
        unnamed = [t for t in (*submodule.parameters(), *submodule.buffers()) if not self.sites.tensor_stack(t)]
        if unnamed:
            stack, _ = self.sites.call_sites.stack(skip=1)
            for tensor in unnamed:
                self.sites.created(tensor, stack)
