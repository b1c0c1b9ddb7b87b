"""Where a training script sets its batch size: the literal a user would edit.

Read from the script's source, in this order: an `argparse` option named for the batch size
(`--batch-size`, `--batch_size`, `--bs`, `-b`) and its `default=`; a `batch_size=` keyword of a call
(`DataLoader(data, batch_size=64)`; also `per_device_train_batch_size=`, as Hugging Face's
`TrainingArguments` takes it); a module-level constant named for it (`BATCH_SIZE = 64`). The one
whose value is the batch size the model was called with wins. Where the command line sets the
option (`-- --batch-size 64`), the value is the command line's and no literal is the user's.

`--set-batch-size` rewrites a script before it runs (and `--batch-size` sets the literal in memory
for one analysis), so it cannot tell by the value: it takes the first kind of the three that the
script has, and only where that kind is one literal. Where the command line gives the option, another
batch size is set there instead, in the arguments (`arguments_with_batch_size`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from skyline_engine.entry.batch_size import BatchSizeLocation, locate_literal, split_lines
from skyline_engine.errors import EntryPointError

_OPTION_NAMES = (
    "--batch-size",
    "--batch_size",
    "--batchsize",
    "--bs",
    "-b",
    "--train-batch-size",
    "--train_batch_size",
)
# Keywords of a call that set the training batch size (an evaluation's batch size is none of them).
_KEYWORD_NAMES = ("batch_size", "per_device_train_batch_size", "train_batch_size")


@dataclass(frozen=True)
class ScriptBatchSize:
    """The literal that sets the batch size (None where none was found or the command line sets
    it), what the command line gave (None where it gives none), and why no literal, where none."""

    location: BatchSizeLocation | None
    from_arguments: int | None
    reason: str | None


def find_script_batch_size(source: str, path: str, argv: tuple[str, ...], observed: int | None) -> ScriptBatchSize:
    found = _Found.of(source, argv)
    if found is None:
        return ScriptBatchSize(None, None, "the script does not parse")
    if found.given is not None:
        name, value = found.given
        return ScriptBatchSize(None, value, f"the command line sets it (`{name} {value}`)")
    lines = split_lines(source)
    located = [locate_literal(node, lines, path) for _, nodes in found.kinds for node in nodes]
    if not located:
        return ScriptBatchSize(
            None, None, "no `--batch-size` option, `batch_size=` keyword or `BATCH_SIZE` constant was found"
        )
    matching = [loc for loc in located if observed is not None and loc.value == observed]
    if matching:
        return ScriptBatchSize(matching[0], None, None)
    first = located[0]
    why = f"its value is not the batch size the model was called with ({observed})"
    return ScriptBatchSize(replace(first, editable=False, reason=first.reason or why), None, None)


def literal_to_set(source: str, path: str, argv: tuple[str, ...]) -> BatchSizeLocation:
    """The literal `--set-batch-size` rewrites in the script `source` (and `--batch-size`, or the
    editor's keys, set in memory for one analysis): the `--batch-size` option's
    default, else the `batch_size=` keyword, else the `BATCH_SIZE` constant; an EntryPointError
    where the command line sets the batch size, where none is found, where the first kind found
    is more than one literal (which sets the batch size shows only when the script runs), or
    where it is no integer literal."""
    hint = "Set the batch size where the script takes it, or give it after `--` (`-- --batch-size 64`)."
    found = _Found.of(source, argv)
    if found is None:
        raise EntryPointError("Cannot set the batch size: the script does not parse.", path=path)
    if found.given is not None:
        name, value = found.given
        raise EntryPointError(
            f"Cannot set the batch size: the command line sets it (`{name} {value}`); change it there.", path=path
        )
    lines = split_lines(source)
    for kind, nodes in found.kinds:
        located = [locate_literal(node, lines, path) for node in nodes]
        if len(located) > 1:
            where = ", ".join(str(location.line) for location in located)
            raise EntryPointError(
                f"Cannot set the batch size: the script has {len(located)} {kind} (lines {where}), and which "
                "one sets the batch size shows only when it runs.",
                path=path,
                line=located[0].line,
                hint="Edit the literal that sets it by hand, or give it after `--` (`-- --batch-size 64`).",
            )
        if located:
            (location,) = located
            if not location.editable:
                raise EntryPointError(
                    f"Cannot set the batch size: {location.reason}.", path=path, line=location.line, hint=hint
                )
            return location
    raise EntryPointError(
        "Cannot set the batch size: the script has no `--batch-size` option with a default, `batch_size=` "
        "keyword or `BATCH_SIZE` constant.",
        path=path,
        hint=hint,
    )


def arguments_with_batch_size(source: str, argv: tuple[str, ...], batch_size: int) -> tuple[str, ...] | None:
    """`argv` with each batch-size option it gives set to `batch_size` (`--batch-size 64` and
    `--batch-size=64` alike); None where it gives none (or the source does not parse)."""
    found = _Found.of(source, argv)
    if found is None or found.given is None:
        return None
    names = found.option_names
    changed = list(argv)
    for index, argument in enumerate(argv):
        name, equals, _ = argument.partition("=")
        if name not in names:
            continue
        if equals:
            changed[index] = f"{name}={batch_size}"
        elif index + 1 < len(argv):
            changed[index + 1] = str(batch_size)
    return tuple(changed)


@dataclass(frozen=True)
class _Found:
    """What a script's source says of its batch size: the option and value the command line gives
    (None where it gives none), and the expressions that may set it, by kind, in the order they
    are taken."""

    given: tuple[str, int] | None
    kinds: list[tuple[str, list[ast.expr]]]
    option_names: tuple[str, ...] = ()

    @staticmethod
    def of(source: str, argv: tuple[str, ...]) -> _Found | None:
        """None where the source does not parse."""
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return None
        options = _argparse_options(tree)
        option_names = tuple(name for names, _ in options for name in names)
        return _Found(
            given=_from_arguments(argv, list(option_names)),
            kinds=[
                ("`--batch-size` options", [default for _, default in options]),
                ("`batch_size=` keywords", _keywords(tree)),
                ("`BATCH_SIZE` constants", _constants(tree)),
            ],
            option_names=option_names,
        )


def _argparse_options(tree: ast.Module) -> list[tuple[tuple[str, ...], ast.expr]]:
    """`add_argument` calls with a batch-size option name and a `default=`: their names and default."""
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        ):
            continue
        names = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
        default = next((k.value for k in node.keywords if k.arg == "default"), None)
        if default is not None and any(name in _OPTION_NAMES for name in names):
            found.append((names, default))
    return found


def _keywords(tree: ast.Module) -> list[ast.expr]:
    return [
        keyword.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg in _KEYWORD_NAMES and isinstance(keyword.value, ast.Constant)
    ]


def _constants(tree: ast.Module) -> list[ast.expr]:
    """Module-level constants named for the batch size (`BATCH_SIZE`, `batch_size`, `BS`): not
    every name with "batch" in it (`NUM_BATCHES = 100` is no batch size)."""
    return [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and _names_the_batch_size(node.targets[0].id)
        and isinstance(node.value, ast.Constant)
    ]


def _names_the_batch_size(name: str) -> bool:
    lowered = name.lower()
    return "batch_size" in lowered or "batchsize" in lowered or lowered in ("bs", "batch")


def _from_arguments(argv: tuple[str, ...], names: list[str]) -> tuple[str, int] | None:
    """The batch-size option the command line gives, as `--batch-size 64` or `--batch-size=64`
    (the last one given wins, as with argparse)."""
    given = None
    for index, argument in enumerate(argv):
        name, equals, value = argument.partition("=")
        if name not in names:
            continue
        text = value if equals else (argv[index + 1] if index + 1 < len(argv) else "")
        if text.strip().isdigit():
            given = (name, int(text))
    return given
