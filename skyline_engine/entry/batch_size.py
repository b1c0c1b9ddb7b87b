"""Find and rewrite the `batch_size` default of an entry point's `skyline_input_provider`.

Columns are UTF-8 *byte* offsets into the line, the way `ast` counts them
(`col_offset` / `end_col_offset`), because Neovim's `nvim_buf_set_text` counts
bytes too: the editor can replace the span as given, with no conversion.
Lines are 1-based and split only at `\\n`, `\\r\\n` and `\\r`, the breaks the
Python tokenizer knows (`str.splitlines` also splits at form feeds, U+2028 and
others, which would shift line numbers).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from types import CodeType
from typing import Any

from skyline_engine.entry.contract import BATCH_SIZE_PARAMETER, INPUT_PROVIDER
from skyline_engine.errors import EntryPointError

_HINT = "Write the default as an integer literal, e.g. `def skyline_input_provider(batch_size=32):`."
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_CONSTANT_KINDS = {bool: "a boolean", float: "a float", str: "a string", bytes: "bytes", complex: "a complex number"}


@dataclass(frozen=True)
class BatchSizeLocation:
    """Where the `batch_size` default lies, and whether it can be rewritten in place.

    `col_start`/`col_end` are byte offsets into line `line`. For a default that spans
    several lines, `col_end` is clipped to the end of its first line.
    """

    path: str
    line: int
    col_start: int
    col_end: int
    editable: bool
    value: int | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "col_start": self.col_start,
            "col_end": self.col_end,
            "editable": self.editable,
            "value": self.value,
            "reason": self.reason,
        }


def find_batch_size_location(source: str, path: str, code: CodeType) -> BatchSizeLocation | None:
    """The location of the `batch_size` default of the definition whose code is `code` (the input
    provider the loaded module holds: with several definitions, in `if`/`else` or `try`/`except` or
    one replacing another, the one that ran), or None when `source` has no such definition (it
    changed since it was loaded), it takes no `batch_size` parameter, or that has no default.
    Raises SyntaxError when `source` does not parse."""
    tree = ast.parse(source, filename=path)
    provider = _definition_of(tree, code)
    if provider is None:
        return None
    default = _batch_size_default(provider.args)
    if default is None:
        return None
    lines = split_lines(source)
    if isinstance(default, ast.Name):
        return _locate_constant(default, tree, lines, path)
    return locate_literal(default, lines, path)


def rewrite_batch_size(source: str, new_batch_size: int, path: str, code: CodeType) -> str:
    """`source` with the `batch_size` literal of `code`'s definition replaced by `new_batch_size`;
    every other character unchanged."""
    start, end = literal_span(source, new_batch_size, path, code)
    return source[:start] + str(new_batch_size) + source[end:]


def literal_span(source: str, new_batch_size: int, path: str, code: CodeType) -> tuple[int, int]:
    """Where in `source` (character indices, end exclusive) the literal to replace by
    `new_batch_size` lies; an EntryPointError when there is none or it is not one integer literal."""
    check_new_batch_size(new_batch_size)
    location = find_batch_size_location(source, path, code)
    if location is None:
        raise EntryPointError(
            f"Found no `{INPUT_PROVIDER}` with a `{BATCH_SIZE_PARAMETER}` default to rewrite.",
            path=path,
            hint=_HINT,
        )
    if not location.editable:
        raise EntryPointError(
            f"Cannot rewrite the batch size: {location.reason}.",
            path=path,
            line=location.line,
            hint=_HINT,
        )
    return location_span(source, location)


def check_new_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"The new batch size must be an integer greater than 0, not {batch_size!r}.")


def location_span(source: str, location: BatchSizeLocation) -> tuple[int, int]:
    """Where in `source` (character indices, end exclusive) `location`'s literal lies."""
    lines = split_lines(source)
    line = lines[location.line - 1].encode("utf-8")
    start = sum(map(len, lines[: location.line - 1])) + len(line[: location.col_start].decode("utf-8"))
    return start, start + len(line[location.col_start : location.col_end].decode("utf-8"))


def split_lines(source: str) -> list[str]:
    """Lines with their endings kept, numbered as `ast` numbers them."""
    lines = []
    start = 0
    for match in _LINE_BREAK.finditer(source):
        lines.append(source[start : match.end()])
        start = match.end()
    if start < len(source):
        lines.append(source[start:])
    return lines


def _definition_of(tree: ast.Module, code: CodeType) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | None:
    """The `def` compiled into `code`: of its name, and starting at its first line (a decorated
    function's code starts at its first decorator); or the `lambda` that starts on that line
    (`skyline_input_provider = lambda batch_size=16: ...` was told it had no default)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda) and code.co_name == "<lambda>" and node.lineno == code.co_firstlineno:
            return node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            first_line = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
            if first_line == code.co_firstlineno:
                return node
    return None


def _batch_size_default(arguments: ast.arguments) -> ast.expr | None:
    """The default expression of `batch_size`, positional or keyword-only; None when it has none."""
    positional = arguments.posonlyargs + arguments.args
    first_with_default = len(positional) - len(arguments.defaults)
    for index, arg in enumerate(positional):
        if arg.arg == BATCH_SIZE_PARAMETER:
            return arguments.defaults[index - first_with_default] if index >= first_with_default else None
    for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
        if arg.arg == BATCH_SIZE_PARAMETER:
            return default  # None when the keyword-only parameter has no default
    return None


def locate_literal(default: ast.expr, lines: list[str], path: str) -> BatchSizeLocation:
    """Where the expression `default` lies in `lines` (`split_lines`), and whether it is an
    integer literal that can be rewritten in place (else why not)."""
    value = _int_literal_value(default)
    reason = _not_editable_reason(default, value)
    col_end = default.end_col_offset
    if default.end_lineno != default.lineno or col_end is None:  # None: not from a parse (never here)
        col_end = len(lines[default.lineno - 1].rstrip("\r\n").encode("utf-8"))
    return BatchSizeLocation(
        path=path,
        line=default.lineno,
        col_start=default.col_offset,
        col_end=col_end,
        editable=reason is None,
        value=value,
        reason=reason,
    )


def _locate_constant(default: ast.Name, tree: ast.Module, lines: list[str], path: str) -> BatchSizeLocation:
    """A default that names a module-level constant (`BATCH_SIZE = 64` at the top, then
    `batch_size=BATCH_SIZE`): the constant's literal, when the name is bound once, at the module's
    level, to one value, and read nowhere but in the default (changing it must change the batch
    size alone); else the default itself, not editable, with why."""
    name = default.id
    bound = [node for node in ast.walk(tree) if _binds(node, name)]
    reads = sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load) and node is not default
    )
    value = _constant_value(bound[0], tree) if len(bound) == 1 else None
    if value is None:
        reason = f"the default is `{name}`, which is not one integer literal assigned once at the top level of {path}"
    elif reads:
        reason = (
            f"the default is `{name}`, which line {reads[0]} uses too: changing it would change more than the "
            "batch size"
        )
    else:
        located = locate_literal(value, lines, path)
        if located.reason is None:
            return located
        # `BATCH = 2 ** 5`: why the constant's value is not editable, naming the constant.
        return replace(
            located, reason=located.reason.replace("the default is", f"the default is `{name}`, which is", 1)
        )
    return replace(locate_literal(default, lines, path), reason=reason)


def _binds(node: ast.AST, name: str) -> bool:
    """Whether `node` (re)binds `name`: an assignment or deletion of it, `global`/`nonlocal`, an
    import as it, a `def`/`class` of it."""
    if isinstance(node, ast.Name):
        return node.id == name and isinstance(node.ctx, (ast.Store, ast.Del))
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return name in node.names
    if isinstance(node, ast.alias):
        return (node.asname or node.name.split(".")[0]) == name
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    return False


def _constant_value(target: ast.AST, tree: ast.Module) -> ast.expr | None:
    """The value of the module-level statement `NAME = <value>` (or `NAME: int = <value>`) whose
    target is `target`, when it is one."""
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and statement.targets == [target]:
            return statement.value
        if isinstance(statement, ast.AnnAssign) and statement.target is target and statement.value is not None:
            return statement.value
    return None


def _int_literal_value(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _not_editable_reason(node: ast.expr, value: int | None) -> str | None:
    """Why the default cannot be rewritten in place, or None when it can."""
    text = ast.unparse(node)
    if value is not None:
        return None if value > 0 else f"the default is `{text}`, but the batch size must be greater than 0"
    if node.end_lineno != node.lineno:
        return f"the default `{text}` spans lines {node.lineno}-{node.end_lineno}, not one integer literal"
    if isinstance(node, ast.Constant):
        kind = _CONSTANT_KINDS.get(type(node.value))  # None and `...` need no name
        return f"the default is `{text}`, {kind + ', ' if kind else ''}not an integer literal"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return f"the default is `{text}`, but the batch size must be greater than 0"
    return f"the default is the expression `{text}`, not an integer literal"
