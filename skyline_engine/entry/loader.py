"""Loading a Skyline entry point and checking its three providers against Skyline's contract.

An entry point is a Python file with:

    def skyline_model_provider() -> torch.nn.Module
    def skyline_input_provider(batch_size=32) -> tuple of inputs
    def skyline_iteration_provider(model) -> callable(*inputs) running one training iteration

Every violation becomes an `EntryPointError` naming the file and line and what to write instead;
every exception raised by the user's code becomes a `UserCodeError` at the user's innermost frame.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import io
import linecache
import os
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any, Callable, TypeVar

import torch

from skyline_engine.entry.contract import (
    BATCH_SIZE_PARAMETER,
    INPUT_PROVIDER,
    ITERATION_PROVIDER,
    MODEL_PROVIDER,
    PROVIDERS,
)
from skyline_engine.entry.user_frames import ProjectFiles, innermost_user_frame, user_traceback_text
from skyline_engine.errors import EntryPointError, SkylineError, UserCodeError

_MODULE_NAME = "skyline_entry_point"

_ENCODING_HINT = "Python reads a source file as UTF-8 unless its first two lines declare another encoding."

T = TypeVar("T")

_EXAMPLES = {
    MODEL_PROVIDER: "def skyline_model_provider():\n    return MyModel()",
    INPUT_PROVIDER: "def skyline_input_provider(batch_size=32):\n    return (torch.randn(batch_size, 10),)",
    ITERATION_PROVIDER: (
        "def skyline_iteration_provider(model):\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    def iteration(*inputs):\n"
        "        optimizer.zero_grad()\n"
        "        model(*inputs).backward()\n"
        "        optimizer.step()\n"
        "    return iteration"
    ),
}


@dataclass
class EntryPoint:
    path: Path  # absolute
    relative_path: str  # relative to the project root
    source: str  # the text that was imported, line endings kept
    files: ProjectFiles
    module: ModuleType
    model_provider: Callable[[], Any]
    input_provider: Callable[..., Any]
    iteration_provider: Callable[[Any], Callable[..., Any]]
    default_batch_size: int
    imports: ImportScope

    def unload(self) -> None:
        self.imports.undo()

    def line_of(self, fn: Callable[..., Any]) -> int | None:
        return _line(fn)

    def input_provider_code(self) -> CodeType:
        """The code of the input provider this module holds, compiled from the entry point's text:
        it tells which `def` ran where the file defines the provider more than once. An
        `EntryPointError` naming the file says why when it cannot be known."""
        provider = inspect.unwrap(self.input_provider)
        code = getattr(provider, "__code__", None)
        if not isinstance(code, CodeType):
            why = f"it is a {type(provider).__name__}, not a function defined with `def`"
        elif code.co_filename != str(self.path):
            where = self.files.relative(code.co_filename) if self.files.contains(code.co_filename) else None
            why = f"it is defined in {where or code.co_filename}, not in this file"
        else:
            return code
        raise EntryPointError(
            f"cannot tell which definition of `{INPUT_PROVIDER}` holds the batch size: {why}.",
            path=self.relative_path,
            hint=f"Define `{INPUT_PROVIDER}` with `def` in the entry point, with `batch_size` as an integer literal.",
        )

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run user code; an exception becomes a `UserCodeError` at the user's innermost frame."""
        return call_user_code(self.files, what, fn, *args, **kwargs)


def resolve_entry_path(entry: str, project_root: Path, base: Path | None = None) -> Path:
    """The entry point as an absolute path, checked to lie inside the project root and to exist.

    A relative `entry` is taken relative to `base` (the CLI's working directory) or else the root.
    A path outside the root gets the same answer whether or not it exists: the service's clients
    must not learn which files exist on its machine.
    """
    root = project_root.resolve()
    if not root.is_dir():
        raise SkylineError(f"the project root {str(project_root)!r} is not a directory.")
    path = Path(entry)
    if not path.is_absolute():
        path = (base or root) / path
    path = path.resolve()
    try:
        path.relative_to(root)
    except ValueError:
        raise EntryPointError(
            f"the entry point {entry!r} lies outside the project root {root}.",
            hint="Run from the project's folder or pass --project-root.",
        ) from None
    try:
        exists, is_file = path.exists(), path.is_file()
    except OSError as exc:  # a name longer than the file system allows, a loop of links
        shown = entry if len(entry) <= 80 else entry[:60] + "…"
        raise EntryPointError(f"the entry point {shown!r} cannot be opened: {exc.strerror}.") from None
    if not exists:
        raise EntryPointError(f"the entry point {entry!r} does not exist (looked for {path}).")
    if not is_file:
        raise EntryPointError(f"the entry point {entry!r} is not a file.")
    return path


def load_entry_point(path: Path, project_root: Path) -> EntryPoint:
    """Import the entry point (its folder importable, as with `python entry_point.py`; inside a
    package, as a module of it, as with `python -m package.entry_point`, so that its relative
    imports work) and check it."""
    files = ProjectFiles(project_root)
    relative = files.relative(str(path))
    source = read_source(path, relative)
    code = compile_source(source, path, relative)
    package = package_of(path.parent)
    imports = ImportScope(path.parent, files, package[1] if package else None)
    try:
        module = _import(path, code, files, package[0] if package else None)
        providers = {name: _provider(module, name, relative) for name in PROVIDERS}
        _check_no_required_parameters(providers[MODEL_PROVIDER], relative)
        default_batch_size = _default_batch_size(providers[INPUT_PROVIDER], relative)
        _check_takes_model(providers[ITERATION_PROVIDER], relative)
    except BaseException:
        imports.undo()
        raise
    return EntryPoint(
        path=path,
        relative_path=relative,
        source=source,
        files=files,
        module=module,
        model_provider=providers[MODEL_PROVIDER],
        input_provider=providers[INPUT_PROVIDER],
        iteration_provider=providers[ITERATION_PROVIDER],
        default_batch_size=default_batch_size,
        imports=imports,
    )


def compile_source(source: str, path: Path, relative: str) -> CodeType:
    """`source` compiled as the file at `path`; a syntax error is an `EntryPointError` at its line."""
    try:
        return compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise EntryPointError(f"syntax error: {exc.msg}.", path=relative, line=exc.lineno) from None


def read_source(path: Path, relative: str) -> str:
    """The file's text, decoded as Python decodes it (a UTF-8 BOM, or an encoding declaration on
    its first two lines; else UTF-8), with its line endings as they are; an `EntryPointError` at
    the offending line (not a traceback) when it cannot be decoded."""
    return decode_source(path.read_bytes(), relative)


def decode_source(data: bytes, relative: str) -> str:
    """`data` decoded as Python decodes a source file. A BOM is not part of the text: Neovim keeps
    it out of the buffer too (the 'bomb' option), so the columns of both agree."""
    encoding = source_encoding(data, relative)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        declared = encoding not in ("utf-8", "utf-8-sig")
        raise EntryPointError(
            f"the file is not {'valid ' + encoding if declared else 'UTF-8'} text "
            f"(byte {data[exc.start]:#04x} cannot be decoded).",
            path=relative,
            line=data[: exc.start].count(b"\n") + 1,
            hint="Fix its encoding declaration, or save it as UTF-8." if declared else "Save it as UTF-8.",
        ) from None


def source_encoding(data: bytes, relative: str) -> str:
    """The codec that decodes `data` as Python would: `utf-8-sig` for a BOM (which it removes)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # an unknown codec, or a BOM with another declared encoding
        raise EntryPointError(f"{exc.msg.rstrip('.')}.", path=relative, line=exc.lineno, hint=_ENCODING_HINT) from None
    return encoding


class ImportScope:
    """Makes the entry point's folder importable (as `python entry_point.py` does) and can undo what
    importing it changed, so that the next analysis in this process imports the user's (maybe
    edited) files afresh."""

    def __init__(self, folder: Path, files: ProjectFiles, package_root: Path | None = None) -> None:
        """`package_root`: where the entry point's package is imported from (`package_of`)."""
        self.files = files
        self.modules_before = frozenset(sys.modules)
        self.added_paths: list[str] = []
        for importable in (folder, package_root):
            if importable is not None and str(importable) not in sys.path:
                self.added_paths.append(str(importable))
                sys.path.insert(0, str(importable))

    def undo(self) -> None:
        for name in set(sys.modules) - self.modules_before:
            filename = getattr(sys.modules.get(name), "__file__", None)
            if name.rpartition(".")[2] == _MODULE_NAME or (filename and self.files.contains(filename)):
                del sys.modules[name]
        for added in self.added_paths:
            if added in sys.path:
                sys.path.remove(added)


def package_of(folder: Path) -> tuple[str, Path] | None:
    """The package `folder` is (the dotted names of it and of the folders above it that hold an
    `__init__.py`), and the folder above the outermost, from which `python -m` would import it;
    None for a folder that is no package."""
    names = []
    while (folder / "__init__.py").is_file() and folder.name.isidentifier() and folder.parent != folder:
        names.append(folder.name)
        folder = folder.parent
    return (".".join(reversed(names)), folder) if names else None


def call_user_code(files: ProjectFiles, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    except SkylineError:
        raise
    except (Exception, SystemExit) as exc:
        raise user_code_error(files, what, exc, fallback=fn) from exc


def user_code_error(
    files: ProjectFiles,
    what: str,
    exc: BaseException,
    fallback: Callable[..., Any] | None = None,
    advice: str | None = None,
) -> UserCodeError:
    """The error at the user's innermost frame; at `fallback`'s definition when the exception has
    no frame of the user's (calling it with the wrong arguments fails before it runs). `advice`:
    what to do, where the caller knows better than the exception."""
    frame = innermost_user_frame(exc.__traceback__, files)
    path, line = (files.relative(frame.filename), frame.lineno) if frame else _definition(fallback, files)
    text = str(exc)  # empty for a bare `raise KeyboardInterrupt`
    message = f"{type(exc).__name__}{': ' + text if text else ''} (raised while running {what})."
    if isinstance(exc, SyntaxError) and exc.filename and os.path.isfile(exc.filename) and files.contains(exc.filename):
        # A syntax error in a module the entry point imports: the traceback ends at the import
        # statement, but the line to fix is the one the compiler names.
        path, line = files.relative(exc.filename), exc.lineno
        message = f"syntax error: {exc.msg} (raised while running {what})."
    elif isinstance(exc, SystemExit):
        # Left alone, it would end Skyline silently, with the user's exit code (0 included).
        code = "" if exc.code is None else repr(exc.code)
        # The advice goes in the message: a hint would follow the frames below.
        message = (
            f"the code called sys.exit({code}) (raised while running {what}). Skyline imports the entry "
            "point and calls its providers, which must not exit; parse command-line arguments "
            '(argparse exits on Skyline\'s) only under `if __name__ == "__main__":`.'
        )
    advice = (
        _relative_path_advice(exc, frame.filename if frame else None, files)
        or _no_cuda_advice(exc)
        or _data_parallel_advice(exc)
        or advice
    )
    if advice:
        message += " " + advice  # in the message, as sys.exit's: a hint would follow the frames below
    trace = user_traceback_text(exc.__traceback__, files)
    if trace:
        message += "\nYour code's frames, innermost last:\n" + trace
    return UserCodeError(message, path=path, line=line)


# What torch says where the code asks for CUDA and there is none (a CPU build; no driver; no GPU).
_NO_CUDA = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available")


def _no_cuda_advice(exc: BaseException) -> str | None:
    """For code that names CUDA on a machine without it (profiling GPU code on a laptop): how to
    write it so that it runs on the analysis device."""
    if not any(text in str(exc) for text in _NO_CUDA):
        return None
    return (
        "This machine has no CUDA device for your code's `.cuda()` or `device='cuda'`. Name no device: Skyline "
        "runs the providers with the analysis device (--device, the editor's `device` option) as torch's "
        "default device, and inside the iteration `device=x.device` follows the inputs; the same code then "
        "runs on the CPU and on a GPU."
    )


def _data_parallel_advice(exc: BaseException) -> str | None:
    """For code that reaches into the model it is given (`model.encoder`, `model["generator"]`)
    when data-parallel analysis gave it the model wrapped in DistributedDataParallel."""
    if not isinstance(exc, (AttributeError, TypeError)) or "'DistributedDataParallel' object" not in str(exc):
        return None
    return (
        "In data-parallel analysis (--nproc, or under torchrun) the iteration provider gets the model wrapped "
        "in DistributedDataParallel, which averages the gradients only of what runs through its own forward: "
        "call `model(...)`, and let the model's forward run its parts. A model whose parts are trained apart "
        "(a GAN's generator and discriminator, each with its own backward pass) is not one "
        "DistributedDataParallel can wrap: profile it without --nproc."
    )


def _relative_path_advice(exc: BaseException, code_file: str | None, files: ProjectFiles) -> str | None:
    """For a relative path that was not found: where it was looked for, and where it lies when it
    lies beside the code that opened it or in the project root (the editor's engine runs there;
    the command line, wherever it was started)."""
    name = getattr(exc, "filename", None) if isinstance(exc, FileNotFoundError) else None
    if not isinstance(name, str) or os.path.isabs(name):
        return None
    cwd = os.getcwd()
    said = f"`{name}` is relative, so it was looked for in the working directory, {cwd}"
    beside = os.path.dirname(code_file) if code_file else None
    if beside and os.path.realpath(beside) != os.path.realpath(cwd) and os.path.exists(os.path.join(beside, name)):
        return f"{said}; it lies beside your code: open `Path(__file__).parent / {name!r}`, found from anywhere."
    if os.path.realpath(files.root) != os.path.realpath(cwd) and os.path.exists(os.path.join(files.root, name)):
        return f"{said}; it lies in the project root, {files.root}: run Skyline from there, as the editor does."
    return said + "."


def _definition(fn: Callable[..., Any] | None, files: ProjectFiles) -> tuple[str | None, int | None]:
    if fn is None:
        return None, None
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None or not files.contains(code.co_filename):
        return None, None
    return files.relative(code.co_filename), _line(fn)


def _import(path: Path, code: CodeType, files: ProjectFiles, package: str | None) -> ModuleType:
    """The entry point's module: in `package` where it is one's (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location(f"{package}.{_MODULE_NAME}" if package else _MODULE_NAME, path)
    if spec is None:  # a name that Python does not import, such as one without `.py`
        raise EntryPointError(
            "the entry point is not a Python file: its name does not end in `.py`.",
            path=files.relative(str(path)),
            hint="Rename it with the `.py` suffix.",
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as exc:
        raise user_code_error(files, f"the entry point {files.relative(str(path))}", exc) from exc
    return module


def _provider(module: ModuleType, name: str, relative: str) -> Callable[..., Any]:
    fn = getattr(module, name, None)
    if fn is None:
        near = _near_miss(module, name)
        if near is not None:  # a typo: the message goes to the line of the misspelled name
            near_name, near_line = near
            raise EntryPointError(
                f"`{near_name}` looks like `{name}`, misspelled: the entry point does not define `{name}`.",
                path=relative,
                line=near_line,
                hint=f"Rename it `{name}`.",
            )
        raise EntryPointError(
            f"the entry point does not define `{name}`.",
            path=relative,
            hint="Skyline needs three providers; add:\n" + _EXAMPLES[name],
        )
    # A model instance is callable too, but calling it runs `forward` without inputs.
    if not callable(fn) or isinstance(fn, torch.nn.Module):
        raise EntryPointError(
            f"`{name}` is a {type(fn).__name__}, not a function.",
            path=relative,
            hint="Define it with:\n" + _EXAMPLES[name],
        )
    provider: Callable[..., Any] = fn
    return provider


def _near_miss(module: ModuleType, name: str) -> tuple[str, int | None] | None:
    """A function of the module whose name is a near miss of the provider `name`
    (`skyline_modle_provider`), with its `def` line; None where there is none."""
    functions = {n: v for n, v in vars(module).items() if inspect.isfunction(v) and n != name}
    close = difflib.get_close_matches(name, list(functions), n=1, cutoff=0.85)
    return (close[0], _line(functions[close[0]])) if close else None


def _line(fn: Callable[..., Any]) -> int | None:
    """The line of `fn`'s `def`. A decorator's wrapper (functools.wraps, lru_cache) leads to the
    user's function through `__wrapped__`; the first line of a decorated function's code is its
    first decorator's, so the `def` is looked for below it."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return None
    first: int = code.co_firstlineno
    linecache.checkcache(code.co_filename)  # the editor's service analyzes edited files again
    lines = linecache.getlines(code.co_filename)
    if first > len(lines) or not lines[first - 1].lstrip().startswith("@"):
        return first
    for number in range(first, len(lines) + 1):
        if lines[number - 1].lstrip().startswith(("def ", "async def ")):
            return number
    return first


def _signature(fn: Callable[..., Any], name: str, relative: str) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        raise EntryPointError(f"cannot read the parameters of `{name}`.", path=relative, line=_line(fn)) from None


def _required(sig: inspect.Signature) -> list[inspect.Parameter]:
    return [
        p
        for p in sig.parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _check_no_required_parameters(fn: Callable[..., Any], relative: str) -> None:
    required = _required(_signature(fn, MODEL_PROVIDER, relative))
    if required:
        names = ", ".join(p.name for p in required)
        raise EntryPointError(
            f"`{MODEL_PROVIDER}` must take no arguments, but it requires: {names}.",
            path=relative,
            line=_line(fn),
            hint="Write `def skyline_model_provider():`.",
        )


def _default_batch_size(fn: Callable[..., Any], relative: str) -> int:
    sig = _signature(fn, INPUT_PROVIDER, relative)
    line = _line(fn)
    hint = "Write `def skyline_input_provider(batch_size=32):` with your batch size."
    param = sig.parameters.get(BATCH_SIZE_PARAMETER)
    if param is None or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
        raise EntryPointError(
            f"`{INPUT_PROVIDER}` must take a `batch_size` argument.", path=relative, line=line, hint=hint
        )
    others = [p.name for p in _required(sig) if p.name != BATCH_SIZE_PARAMETER]
    if others:
        raise EntryPointError(
            f"`{INPUT_PROVIDER}` may take only `batch_size`, but it also requires: {', '.join(others)}.",
            path=relative,
            line=line,
            hint=hint,
        )
    default = param.default
    if default is inspect.Parameter.empty:
        raise EntryPointError(
            f"`batch_size` of `{INPUT_PROVIDER}` has no default; Skyline profiles at the default batch size.",
            path=relative,
            line=line,
            hint=hint,
        )
    if isinstance(default, bool) or not isinstance(default, int):
        raise EntryPointError(
            f"the default batch size must be an integer, not {default!r} ({type(default).__name__}).",
            path=relative,
            line=line,
            hint=hint,
        )
    if default <= 0:
        raise EntryPointError(
            f"the default batch size must be positive, not {default}.", path=relative, line=line, hint=hint
        )
    return default


def _check_takes_model(fn: Callable[..., Any], relative: str) -> None:
    sig = _signature(fn, ITERATION_PROVIDER, relative)
    positional = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_varargs = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    if not (positional or takes_varargs) or len(_required(sig)) > 1:
        raise EntryPointError(
            f"`{ITERATION_PROVIDER}` must take exactly one argument, the model.",
            path=relative,
            line=_line(fn),
            hint="Write `def skyline_iteration_provider(model):`.",
        )
