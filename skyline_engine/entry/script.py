"""A training script as an analysis target: a Python file without Skyline's providers, run as
`python SCRIPT.py arguments` would run it.

A file that defines any of the three providers at its top level is an entry point (entry/loader.py,
whose checks say what is missing); one that defines none is a script. This is decided by reading
the file, never by importing it: importing a script runs its training.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

from skyline_engine.entry.batch_size import BatchSizeLocation, check_new_batch_size, location_span
from skyline_engine.entry.contract import PROVIDERS
from skyline_engine.entry.loader import ImportScope, compile_source, read_source
from skyline_engine.entry.script_batch_size import arguments_with_batch_size, literal_to_set
from skyline_engine.entry.user_frames import ProjectFiles


def is_script(source: str) -> bool:
    """Whether `source` defines none of the providers at its top level (a file that does not
    parse is left to the entry-point loader, whose message names the line)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    defined = {
        node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    defined |= {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    defined |= {
        alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    return not defined & set(PROVIDERS)


@dataclass
class TrainingScript:
    path: Path  # absolute
    relative_path: str  # relative to the project root
    source: str  # the text that runs, line endings kept
    code: CodeType
    files: ProjectFiles
    argv: tuple[str, ...]  # the script's arguments, after its name (its batch size set there, where it was)
    # The batch-size literal the analysis set in memory, as the file has it (its value the file's;
    # None where the batch size was set in the arguments), and the value it was set to.
    literal_set: BatchSizeLocation | None = None
    batch_size_set: int | None = None

    def where_set(self) -> str:
        """Where `batch_size_set` was set: the literal, or the command line's option."""
        if self.literal_set is not None:
            return f"{self.literal_set.path}:{self.literal_set.line}"
        return "the batch-size option of the script's arguments"

    @contextmanager
    def as_main(self) -> Iterator[dict[str, object]]:
        """What `python SCRIPT.py arguments` gives the script, undone afterwards: a fresh
        `__main__` module (its globals, yielded), `sys.argv`, the script's folder first on
        `sys.path` (its own imports), and the project's modules imported afresh next time. The
        working directory stays the one the analysis runs in, as the user's shell's would."""
        module = types.ModuleType("__main__")
        module.__file__ = str(self.path)
        module.__dict__["__builtins__"] = __builtins__
        saved_main, saved_argv = sys.modules.get("__main__"), sys.argv
        imports = ImportScope(self.path.parent, self.files)
        sys.modules["__main__"], sys.argv = module, [str(self.path), *self.argv]
        try:
            yield module.__dict__
        finally:
            sys.argv = saved_argv
            if saved_main is not None:
                sys.modules["__main__"] = saved_main
            imports.undo()


def load_training_script(
    path: Path, project_root: Path, argv: tuple[str, ...] = (), batch_size: int | None = None
) -> TrainingScript:
    """The script at `path`, compiled (a syntax error is an `EntryPointError` at its line); with
    its batch size set to `batch_size` where given, in memory only: in `argv` where they give the
    batch-size option, else at the literal `--set-batch-size` would rewrite
    (entry/script_batch_size.py: an EntryPointError where there is no one such literal). Line
    numbers stay those of the file."""
    files = ProjectFiles(project_root)
    relative = files.relative(str(path))
    source = read_source(path, relative)
    literal = None
    argv = tuple(argv)
    if batch_size is not None:
        check_new_batch_size(batch_size)
        arguments = arguments_with_batch_size(source, argv, batch_size)
        if arguments is not None:
            argv = arguments
        else:
            literal = literal_to_set(source, relative, argv)
            start, end = location_span(source, literal)
            source = source[:start] + str(batch_size) + source[end:]
    code = compile_source(source, path, relative)
    return TrainingScript(path, relative, source, code, files, argv, literal, batch_size)
