"""Bad input to `skyline profile`: every mistake gets one clear error paragraph, never a traceback.

Each test builds a small project in `tmp_path`, runs the real command line in a subprocess
(`python -m skyline_engine profile ... --device cpu --quiet`) from that folder, and checks that it
fails with a non-zero exit code, that the message names the file (relative to the project root)
and the line where there is one, that it says what is wrong, and that `--json` wrote nothing.

Expected lines are never literals: the fixture's line carries a `# <- HERE` marker comment (or a
distinctive piece of text) and the test finds it. The models are a `Linear(4, 2)`, so a run that
gets as far as measuring takes a few seconds and most errors come before any measuring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent, indent

import pytest
import torch

import skyline_engine
from engine_helpers import HERE, marked_line

pytestmark = pytest.mark.slow  # the CLI in a subprocess, each test

ERROR_PREFIX = "skyline: error: "
FRAMES_HEADING = "Your code's frames, innermost last:\n"
ENGINE_DIR = os.path.dirname(os.path.realpath(skyline_engine.__file__))
RUN_TIMEOUT_S = 240

# --- fixture sources ------------------------------------------------------------------------

MODEL_HEAD = '''\
import torch
import torch.nn as nn


class TinyModel(nn.Module):
    """Returns its loss, as Skyline's entry points expect."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x):
'''


def model_source(forward_body: str = "return self.linear(x).pow(2).mean()") -> str:
    """model.py with `TinyModel.forward` running `forward_body`."""
    return MODEL_HEAD + indent(dedent(forward_body).strip("\n") + "\n", " " * 8)


IMPORTS = """
import torch

from model import TinyModel
"""

MODEL_PROVIDER = """
def skyline_model_provider():
    return TinyModel()
"""

INPUT_PROVIDER = """
def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 4),)
"""

# Plain SGD by hand: constructing a torch.optim optimizer imports torch._dynamo, a second per run.
ITERATION_PROVIDER = """
def skyline_iteration_provider(model):
    learning_rate = 0.01

    def iteration(x):
        model.zero_grad()
        loss = model(x)
        loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= learning_rate * parameter.grad

    return iteration
"""

DEFAULT_BATCH_SIZE = 8


def entry_source(
    imports: str | None = IMPORTS,
    model_provider: str | None = MODEL_PROVIDER,
    input_provider: str | None = INPUT_PROVIDER,
    iteration_provider: str | None = ITERATION_PROVIDER,
) -> str:
    """An entry point from its four parts; None leaves a part out."""
    parts = [imports, model_provider, input_provider, iteration_provider]
    return "\n\n".join(dedent(p).strip("\n") + "\n" for p in parts if p is not None)


def valid_files() -> dict[str, str]:
    return {"entry_point.py": entry_source(), "model.py": model_source()}


def write_project(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
    return root


# --- running the command line ---------------------------------------------------------------


def run_skyline(
    cwd: Path, *args: str, entry: str = "entry_point.py", device: str = "cpu"
) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "skyline_engine", "profile", entry, *args, "--device", device, "--quiet"]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


def error_paragraph(result: subprocess.CompletedProcess) -> str:
    """Skyline's error paragraph: the end of stderr (the user's code may have printed before it)."""
    stderr = result.stderr
    assert ERROR_PREFIX in stderr, f"no Skyline error on stderr:\n{stderr}"
    paragraph = stderr[stderr.index(ERROR_PREFIX) :]
    assert paragraph.startswith(ERROR_PREFIX)
    return paragraph


def assert_error(
    result: subprocess.CompletedProcess,
    path: str | None = None,
    line: int | None = None,
    says: Sequence[str] = (),
) -> str:
    """Exit code 1 and one error paragraph at `path:line:` (or `path:`) that says all of `says`."""
    details = f"exit code {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 1, details
    assert "Traceback (most recent call last)" not in result.stderr, details
    paragraph = error_paragraph(result)
    assert "\n\n" not in paragraph.strip(), f"not one paragraph:\n{paragraph}"
    assert paragraph.count(ERROR_PREFIX) == 1, details
    assert result.stdout == "", f"a failed analysis printed a report:\n{result.stdout}"
    location = paragraph[len(ERROR_PREFIX) :]
    if path is not None:
        where = f"{path}:{line}: " if line is not None else f"{path}: "
        assert location.startswith(where), f"expected the location {where!r}:\n{paragraph}"
    assert not location.startswith(ENGINE_DIR) and "skyline_engine" + os.sep not in location.split(" ")[0], paragraph
    for phrase in says:
        assert phrase.lower() in paragraph.lower(), f"expected {phrase!r} in:\n{paragraph}"
    if FRAMES_HEADING in paragraph:
        # The user's frames end the paragraph, one `  path:line in function | source` each.
        frames = paragraph.split(FRAMES_HEADING, 1)[1].strip("\n").split("\n")
        assert frames and all(f.startswith("  ") and " in " in f for f in frames), paragraph
        if line is not None and "syntax error" not in paragraph:  # an import's syntax error has no frame
            assert frames[-1].startswith(f"  {path}:{line} in "), f"the innermost frame is not {path}:{line}"
    return paragraph


def assert_no_json(project: Path, name: str = "out.json") -> None:
    assert not (project / name).exists(), f"{name} was written by a failed analysis"
    leftovers = [p.name for p in project.iterdir() if p.name.startswith(f".{name}.")]
    assert leftovers == [], f"temporary files left behind: {leftovers}"


# --- a bad project: its files, where the error must point, and what it must say -------------


@dataclass
class Case:
    id: str
    files: dict[str, str | bytes]
    says: tuple[str, ...]
    path: str | None = "entry_point.py"  # where the error must point (relative to the root)
    marker: str | None = HERE  # the text marking the error's line in `path`; None: no line

    def expected_line(self) -> int | None:
        if self.marker is None:
            return None
        text = self.files[self.path]
        if isinstance(text, bytes):
            text = text.decode("latin-1")
        return marked_line(text, self.marker)


def with_entry(**parts: str | None) -> dict[str, str]:
    """The valid project with some parts of its entry point replaced (None: left out)."""
    return {**valid_files(), "entry_point.py": entry_source(**parts)}


def with_model(forward_body: str, **parts: str | None) -> dict[str, str]:
    return {**with_entry(**parts), "model.py": model_source(forward_body)}


def check(case: Case, tmp_path: Path, *extra_args: str) -> str:
    project = write_project(tmp_path, case.files)
    result = run_skyline(project, "--json", "out.json", *extra_args)
    paragraph = assert_error(result, case.path, case.expected_line(), case.says)
    assert_no_json(project)
    return paragraph


def cases(*items: Case):
    return pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in items])


# --- the positive control -------------------------------------------------------------------


def test_valid_tiny_entry_point_succeeds(tmp_path):
    """The fixtures are valid apart from each case's one mistake."""
    project = write_project(tmp_path, valid_files())
    result = run_skyline(project, "--json", "out.json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "batch size 8" in result.stdout
    document = json.loads((project / "out.json").read_text(encoding="utf-8"))
    assert document["batch_size"] == DEFAULT_BATCH_SIZE
    assert document["entry_point"] == "entry_point.py"


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, says",
    [
        (["--batch-size", "0"], "the batch size must be positive, not 0"),
        (["--batch-size", "-3"], "the batch size must be positive, not -3"),
        (["--batch-size", "eight"], "'eight' is not an integer"),
        (["--set-batch-size", "0"], "the batch size must be positive, not 0"),
    ],
    ids=["batch-size-0", "batch-size-negative", "batch-size-not-integer", "set-batch-size-0"],
)
def test_bad_batch_size_option_is_a_usage_error(tmp_path, args, says):
    project = write_project(tmp_path, valid_files())
    before = (project / "entry_point.py").read_bytes()
    result = run_skyline(project, *args, "--json", "out.json")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"argument {args[0]}: {says}" in result.stderr
    assert result.stderr.startswith("usage: skyline profile")
    assert_no_json(project)
    assert (project / "entry_point.py").read_bytes() == before


def test_entry_point_that_does_not_exist(tmp_path):
    project = write_project(tmp_path, valid_files())
    result = run_skyline(project, "--json", "out.json", entry="entry_pont.py")
    assert_error(result, says=["'entry_pont.py' does not exist"])
    assert_no_json(project)


def test_entry_point_that_is_a_folder(tmp_path):
    project = write_project(tmp_path, {**valid_files(), "experiments/readme.txt": ""})
    result = run_skyline(project, "--json", "out.json", entry="experiments")
    assert_error(result, says=["'experiments' is not a file"])
    assert_no_json(project)


def test_entry_point_without_the_py_suffix(tmp_path):
    """Python imports no file named `train`; this crashed with an AttributeError (found by mypy)."""
    project = write_project(tmp_path, {**valid_files(), "train": entry_source()})
    result = run_skyline(project, "--json", "out.json", entry="train")
    assert_error(result, path="train", says=["not a Python file", "Rename it with the `.py` suffix."])
    assert_no_json(project)


def test_entry_point_outside_the_project_root(tmp_path):
    project = write_project(tmp_path, {**valid_files(), "sub/notes.txt": ""})
    result = run_skyline(project, "--project-root", "sub", "--json", "out.json")
    paragraph = assert_error(result, says=["'entry_point.py' lies outside the project root", "--project-root"])
    assert str((project / "sub").resolve()) in paragraph
    assert_no_json(project)


def test_project_root_that_does_not_exist(tmp_path):
    project = write_project(tmp_path, valid_files())
    result = run_skyline(project, "--project-root", "no_such_folder", "--json", "out.json")
    assert_error(result, says=["no_such_folder' is not a directory"])
    assert_no_json(project)


@pytest.mark.parametrize(
    "device, says",
    [("meta", "device 'meta' is not supported"), ("gpu0", "unknown device 'gpu0'")],
)
def test_unknown_device(tmp_path, device, says):
    project = write_project(tmp_path, valid_files())
    result = run_skyline(project, "--json", "out.json", device=device)
    assert_error(result, says=[says, "Use auto, cpu, cuda or cuda:N"])
    assert_no_json(project)


@pytest.mark.parametrize("json_path", ["missing_folder/out.json", "a_folder"], ids=["missing-folder", "is-a-folder"])
def test_json_path_that_cannot_be_written_fails_before_measuring(tmp_path, json_path):
    project = write_project(tmp_path, {**valid_files(), "a_folder/keep.txt": ""})
    result = run_skyline(project, "--json", json_path)
    assert_error(result, says=[json_path, "--json"])
    assert not (project / "missing_folder").exists()
    assert sorted(p.name for p in (project / "a_folder").iterdir()) == ["keep.txt"]


# --- loading the entry point ----------------------------------------------------------------

HELPER_RAISES = """
import torch

SCALE = 2.0
raise RuntimeError("helper could not find its configuration")  # <- HERE
"""

ARGPARSE_AT_IMPORT = (
    IMPORTS
    + """
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()  # <- HERE
"""
)


@cases(
    Case(
        "syntax-error-in-entry-point",
        with_entry(
            model_provider="""
            def skyline_model_provider()  # <- HERE
                return TinyModel()
            """
        ),
        says=("syntax error", "expected ':'"),
    ),
    Case(
        "syntax-error-in-imported-model",
        {**valid_files(), "model.py": model_source("return self.linear(x).pow(2).mean(  # <- HERE")},
        path="model.py",
        says=("syntax error", "'(' was never closed"),
    ),
    Case(
        "exception-at-import-in-entry-point",
        with_entry(imports=IMPORTS + "\nDEFAULTS = {}\nLEARNING_RATE = DEFAULTS['lr']  # <- HERE\n"),
        says=("KeyError: 'lr'", "entry point"),
    ),
    Case(
        "exception-at-import-in-helper-module",
        {**with_entry(imports=IMPORTS + "\nimport helper\n"), "helper.py": HELPER_RAISES},
        path="helper.py",
        says=("RuntimeError: helper could not find its configuration",),
    ),
    Case(
        "exception-at-import-in-helper-package",
        {
            **with_entry(imports=IMPORTS + "\nfrom utils import config\n"),
            "utils/__init__.py": "",
            "utils/config.py": HELPER_RAISES,
        },
        path=os.path.join("utils", "config.py"),
        says=("RuntimeError: helper could not find its configuration",),
    ),
    Case(
        "import-of-missing-module",
        with_entry(imports=IMPORTS + "\nimport no_such_module_for_skyline  # <- HERE\n"),
        says=("ModuleNotFoundError", "no_such_module_for_skyline"),
    ),
    Case(
        "sys-exit-at-import",
        with_entry(imports=IMPORTS + "\nimport sys\nsys.exit(0)  # <- HERE\n"),
        says=("sys.exit(0)", "must not exit"),
    ),
    Case(
        # argparse rejects Skyline's own command line and exits 2 after printing its usage.
        "argparse-at-import",
        with_entry(imports=ARGPARSE_AT_IMPORT),
        says=("sys.exit(2)", 'if __name__ == "__main__":'),
    ),
)
def test_entry_point_that_does_not_import(tmp_path, case):
    paragraph = check(case, tmp_path)
    assert ENGINE_DIR not in paragraph


def test_exception_at_import_names_the_helper_not_the_engine(tmp_path):
    """The innermost user frame is the helper's line; the entry point's import is an outer frame."""
    files = {**with_entry(imports=IMPORTS + "\nimport helper  # <- HERE\n"), "helper.py": HELPER_RAISES}
    project = write_project(tmp_path, files)
    result = run_skyline(project)
    paragraph = assert_error(result, "helper.py", marked_line(files["helper.py"]), ["helper could not find"])
    assert f"  entry_point.py:{marked_line(files['entry_point.py'])} in <module>" in paragraph
    assert ENGINE_DIR not in paragraph and "skyline_engine" not in paragraph


@pytest.mark.parametrize(
    ("data", "advice"),
    [
        ("train/data.txt", "it lies beside your code: open `Path(__file__).parent / 'data.txt'`, found from anywhere."),
        ("data.txt", "it lies in the project root, {root}: run Skyline from there, as the editor does."),
        (None, "was looked for in the working directory, {cwd}."),
    ],
    ids=["beside the code", "in the project root", "nowhere"],
)
def test_a_relative_path_not_found_says_where_it_was_looked_for_and_where_it_lies(tmp_path, data, advice):
    """Run from outside the project, `open("data.txt")` looks in the working directory: the editor's
    engine runs in the project root, the command line wherever it was started."""
    reads = """
    def skyline_model_provider():
        open("data.txt").read()  # <- HERE
        return TinyModel()
    """
    entry = entry_source(model_provider=reads)
    project = tmp_path / "project"
    files = {"pyproject.toml": "", "train/entry_point.py": entry, "train/model.py": model_source()}
    write_project(project, {**files, **({data: "1 2 3\n"} if data else {})})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_skyline(elsewhere, entry="../project/train/entry_point.py")
    cwd, root = os.path.realpath(elsewhere), os.path.realpath(project)
    says = [
        f"`data.txt` is relative, so it was looked for in the working directory, {cwd}",
        advice.format(root=root, cwd=cwd),
    ]
    assert_error(result, "train/entry_point.py", marked_line(entry), says)


@pytest.mark.parametrize("extra_args", [[], ["--set-batch-size", "4"]], ids=["profile", "set-batch-size"])
def test_entry_point_that_is_not_utf8(tmp_path, extra_args):
    source = entry_source(imports=IMPORTS + "\n# Modèle  # <- HERE\n").encode("latin-1")
    case = Case("not-utf8", {**valid_files(), "entry_point.py": source}, says=("not UTF-8", "Save it as UTF-8"))
    check(case, tmp_path, *extra_args)
    assert (tmp_path / "entry_point.py").read_bytes() == source


BOM = b"\xef\xbb\xbf"
WITH_OPTIMIZER = """
def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # <- HERE

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return iteration
"""
LATIN_1_DECLARED = "# -*- coding: latin-1 -*-\n"


@pytest.mark.parametrize(
    "header, encoding, input_provider",
    [
        pytest.param(BOM, "utf-8", INPUT_PROVIDER, id="bom"),
        pytest.param(
            b"",
            "latin-1",
            INPUT_PROVIDER.replace("(batch_size=8)", "(label='Modèle', batch_size=8)"),
            id="latin-1-declared",
        ),
    ],
)
def test_entry_point_read_as_python_reads_it(tmp_path, header, encoding, input_provider):
    """Python runs a file that starts with a UTF-8 BOM (Windows editors write one), or that
    declares its encoding (PEP 263); so does Skyline, and --set-batch-size keeps the BOM and the
    encoding. The location's columns count the UTF-8 bytes of the text, as the editor's buffer
    holds it."""
    imports = (LATIN_1_DECLARED if encoding == "latin-1" else "") + IMPORTS.lstrip("\n")
    source = entry_source(imports=imports, input_provider=input_provider, iteration_provider=WITH_OPTIMIZER)
    project = write_project(tmp_path, {**valid_files(), "entry_point.py": header + source.encode(encoding)})
    result = run_skyline(project, "--set-batch-size", "4", "--json", "out.json")
    assert result.returncode == 0, result.stderr
    rewritten = source.replace("batch_size=8)", "batch_size=4)")
    assert (project / "entry_point.py").read_bytes() == header + rewritten.encode(encoding)
    document = json.loads((project / "out.json").read_text(encoding="utf-8"))
    location = document["batch_size_location"]
    line = rewritten.split("\n")[location["line"] - 1].encode("utf-8")
    assert line[location["col_start"] : location["col_end"]] == b"4"
    assert document["batch_size"] == 4
    # The optimizer's line is found by parsing the entry point as well.
    (optimizer,) = document["optimizer_state"]
    assert optimizer["contexts"] == [{"path": "entry_point.py", "line": marked_line(rewritten)}]


def test_set_batch_size_on_a_syntax_error_leaves_the_file_alone(tmp_path):
    files = with_entry(
        input_provider="""
        def skyline_input_provider(batch_size=8)  # <- HERE
            return (torch.randn(batch_size, 4),)
        """
    )
    case = Case("set-batch-size-syntax-error", files, says=("syntax error",))
    check(case, tmp_path, "--set-batch-size", "4")
    assert (tmp_path / "entry_point.py").read_text(encoding="utf-8") == files["entry_point.py"]


# --- the providers' contract ----------------------------------------------------------------


@pytest.mark.parametrize(
    "missing, part",
    [
        ("skyline_model_provider", "model_provider"),
        ("skyline_input_provider", "input_provider"),
        ("skyline_iteration_provider", "iteration_provider"),
    ],
    ids=["model", "input", "iteration"],
)
def test_missing_provider(tmp_path, missing, part):
    case = Case(
        f"missing-{missing}",
        with_entry(**{part: None}),
        marker=None,  # a missing definition has no line
        says=(f"does not define `{missing}`", "add:", f"def {missing}("),
    )
    check(case, tmp_path)


def iteration_provider_with(old: str, new: str) -> str:
    assert old in ITERATION_PROVIDER
    return ITERATION_PROVIDER.replace(old, new)


@cases(
    Case(
        "provider-is-a-model-not-a-function",
        with_entry(model_provider="skyline_model_provider = TinyModel()\n"),
        marker=None,
        says=("`skyline_model_provider` is a TinyModel, not a function", "def skyline_model_provider():"),
    ),
    Case(
        "model-provider-requires-an-argument",
        with_entry(
            model_provider="""
            def skyline_model_provider(hidden_size):  # <- HERE
                return TinyModel()
            """
        ),
        says=("`skyline_model_provider` must take no arguments", "hidden_size"),
    ),
    Case(
        "input-provider-without-batch-size",
        with_entry(
            input_provider="""
            def skyline_input_provider(size=8):  # <- HERE
                return (torch.randn(size, 4),)
            """
        ),
        says=("must take a `batch_size` argument", "def skyline_input_provider(batch_size=32):"),
    ),
    Case(
        "input-provider-without-default",
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size):  # <- HERE
                return (torch.randn(batch_size, 4),)
            """
        ),
        says=("`batch_size` of `skyline_input_provider` has no default",),
    ),
    Case(
        "input-provider-float-default",
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size=32.0):  # <- HERE
                return (torch.randn(int(batch_size), 4),)
            """
        ),
        says=("the default batch size must be an integer, not 32.0 (float)",),
    ),
    Case(
        "input-provider-string-default",
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size="32"):  # <- HERE
                return (torch.randn(int(batch_size), 4),)
            """
        ),
        says=("the default batch size must be an integer, not '32' (str)",),
    ),
    Case(
        "input-provider-zero-default",
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size=0):  # <- HERE
                return (torch.randn(batch_size, 4),)
            """
        ),
        says=("the default batch size must be positive, not 0",),
    ),
    Case(
        "input-provider-extra-required-argument",
        with_entry(
            input_provider="""
            def skyline_input_provider(path, batch_size=8):  # <- HERE
                return (torch.randn(batch_size, 4),)
            """
        ),
        says=("may take only `batch_size`", "also requires: path"),
    ),
    Case(
        "iteration-provider-without-argument",
        with_entry(
            iteration_provider=iteration_provider_with(
                "def skyline_iteration_provider(model):", "def skyline_iteration_provider():  # <- HERE"
            )
        ),
        says=("`skyline_iteration_provider` must take exactly one argument, the model",),
    ),
    Case(
        # co_firstlineno of a decorated function is its decorator's line, and the wrapper that
        # lru_cache returns has no code at all: the line must still be the def's.
        "decorated-model-provider-requires-an-argument",
        with_entry(
            model_provider="""
            import functools


            @functools.lru_cache()
            def skyline_model_provider(size):  # <- HERE
                return TinyModel()
            """
        ),
        says=("must take no arguments", "size"),
    ),
)
def test_provider_with_wrong_signature(tmp_path, case):
    check(case, tmp_path)


@cases(
    Case(
        "input-provider-returns-bare-tensor",
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size=8):  # <- HERE
                return torch.randn(batch_size, 4)
            """
        ),
        says=("returned a bare Tensor of shape (8, 4)", "return (x,)"),
    ),
    Case(
        "input-provider-returns-int",
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size=8):  # <- HERE
                return batch_size
            """
        ),
        says=("`skyline_input_provider` returned a value of type int", "tuple"),
    ),
    Case(
        "input-provider-returns-dict",  # a Hugging Face batch, taken by keyword
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size=8):  # <- HERE
                return {"input_ids": torch.zeros(batch_size, 4, dtype=torch.long)}
            """
        ),
        says=("`skyline_input_provider` returned a value of type dict", "return `(batch,)`", "model(**batch)"),
    ),
    Case(
        "input-provider-returns-none",
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size=8):  # <- HERE
                inputs = (torch.randn(batch_size, 4),)
            """
        ),
        says=("`skyline_input_provider` returned None", "tuple"),
    ),
    Case(
        "model-provider-returns-none",
        with_entry(
            model_provider="""
            def skyline_model_provider():  # <- HERE
                model = TinyModel()
            """
        ),
        says=("`skyline_model_provider` returned None, not a torch.nn.Module",),
    ),
    Case(
        "model-provider-returns-the-class",
        with_entry(
            model_provider="""
            def skyline_model_provider():  # <- HERE
                return TinyModel
            """
        ),
        says=("`skyline_model_provider` returned the class TinyModel itself", "not a torch.nn.Module"),
    ),
    Case(
        "iteration-provider-returns-none",
        with_entry(
            iteration_provider=iteration_provider_with(
                "def skyline_iteration_provider(model):", "def skyline_iteration_provider(model):  # <- HERE"
            ).replace("    return iteration\n", "")
        ),
        says=("`skyline_iteration_provider` returned None, not a function", "return iteration"),
    ),
    Case(
        "iteration-provider-returns-a-loss",
        with_entry(
            iteration_provider="""
            def skyline_iteration_provider(model):  # <- HERE
                return model(torch.randn(2, 4))
            """
        ),
        says=("`skyline_iteration_provider` returned a bare Tensor", "not a function"),
    ),
)
def test_provider_returns_the_wrong_thing(tmp_path, case):
    check(case, tmp_path)


# --- exceptions in the user's code ----------------------------------------------------------


@cases(
    Case(
        "shape-mismatch-in-forward",
        with_model(
            "return self.linear(x).pow(2).mean()  # <- HERE",
            input_provider="""
            def skyline_input_provider(batch_size=8):
                return (torch.randn(batch_size, 5),)
            """,
        ),
        path="model.py",
        says=("RuntimeError", "mat1 and mat2 shapes cannot be multiplied", "batch size 8", "in forward"),
    ),
    Case(
        "exception-in-model-constructor",
        {**valid_files(), "model.py": model_source().replace("nn.Linear(4, 2)", "nn.Linear(4, -2)  # <- HERE")},
        path="model.py",
        says=("RuntimeError", "negative dimension -2", "skyline_model_provider"),
    ),
    Case(
        "exception-in-model-provider",
        with_entry(
            model_provider="""
            def skyline_model_provider():
                model = TinyModel()
                model.load_state_dict(torch.load("weights_that_are_not_there.pt"))  # <- HERE
                return model
            """
        ),
        says=("FileNotFoundError", "weights_that_are_not_there.pt", "skyline_model_provider"),
    ),
    Case(
        "exception-in-input-provider",
        with_entry(
            input_provider="""
            def skyline_input_provider(batch_size=8):
                data = torch.load("batches_that_are_not_there.pt")  # <- HERE
                return (data[:batch_size],)
            """
        ),
        says=("FileNotFoundError", "batches_that_are_not_there.pt", "skyline_input_provider"),
    ),
    Case(
        "exception-in-iteration-provider",
        with_entry(
            iteration_provider="""
            def skyline_iteration_provider(model):
                optimizer = torch.optim.SGD(model.parameters(), lr=-0.01)  # <- HERE
                return lambda x: None
            """
        ),
        says=("ValueError: Invalid learning rate: -0.01", "skyline_iteration_provider"),
    ),
    Case(
        "exception-in-iteration",
        with_entry(
            iteration_provider=iteration_provider_with(
                "        loss.backward()\n", "        loss.backward()\n        loss.backward()  # <- HERE\n"
            )
        ),
        says=("RuntimeError", "backward through the graph a second time", "training iteration at batch size 8"),
    ),
    Case(
        # Calling it fails before any line of the user's runs: the location is its def line.
        "iteration-takes-other-inputs",
        with_entry(
            iteration_provider=iteration_provider_with("def iteration(x):", "def iteration(x, labels):  # <- HERE")
        ),
        says=("TypeError", "missing 1 required positional argument: 'labels'", "at batch size 8", "iteration(*inputs)"),
    ),
    Case(
        "sys-exit-in-iteration",
        with_entry(
            iteration_provider=iteration_provider_with(
                "        loss.backward()\n", "        loss.backward()\n        raise SystemExit(3)  # <- HERE\n"
            )
        ),
        says=("sys.exit(3)", "training iteration at batch size 8"),
    ),
    Case(
        # Batches read inside the iteration from a loader of a few: it runs out in the warm-up.
        "iterator-runs-out-in-iteration",
        with_entry(
            iteration_provider="""
            def skyline_iteration_provider(model):
                batches = iter([torch.randn(8, 4) for _ in range(3)])

                def iteration(x):
                    model.zero_grad()
                    model(next(batches)).backward()  # <- HERE

                return iteration
            """
        ),
        says=("StopIteration", "ran out, at its call number 4", "`skyline_input_provider`", "itertools.cycle"),
    ),
)
def test_exception_in_user_code(tmp_path, case):
    paragraph = check(case, tmp_path)
    assert ENGINE_DIR not in paragraph and "skyline_engine" + os.sep not in paragraph


@pytest.mark.skipif(torch.cuda.is_available(), reason="the advice is for a machine without CUDA")
def test_code_that_names_cuda_on_a_machine_without_it_is_told_to_name_no_device(tmp_path):
    # GPU code profiled on a laptop: `.cuda()` in the model provider.
    case = Case(
        "cuda-without-a-gpu",
        with_entry(
            model_provider="""
            def skyline_model_provider():
                return TinyModel().cuda()  # <- HERE
            """
        ),
        says=("skyline_model_provider", "no CUDA device for your code's `.cuda()`", "Name no device"),
    )
    check(case, tmp_path)


def analysis_of(files: dict[str, str | bytes], tmp_path: Path, *args: str) -> dict:
    """The JSON document of a command-line analysis that must complete."""
    project = write_project(tmp_path, files)
    result = run_skyline(project, "--json", "out.json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads((project / "out.json").read_text(encoding="utf-8"))


def test_iteration_that_fails_only_at_a_larger_batch_size_is_analysed_below_it(tmp_path):
    """The default 8 works; the probe at 16 fails: a warning at the forward's line names 16 (and 15
    where the confirming step timed it) and the error, nothing from 16 on is tried, and 4 and 8 are
    analysed."""
    forward = """
    if x.shape[0] > 8:
        raise ValueError(f"cannot handle {x.shape[0]} samples")  # <- HERE
    return self.linear(x).pow(2).mean()
    """
    files = with_model(forward)
    document = analysis_of(files, tmp_path)
    line = Case("", files, (), path="model.py").expected_line()
    models = document["models"]
    # 15, where the time line has the models suggest a batch size, fails too when timed to confirm
    # it (on a busy machine): one warning for the line then names both, led by the nearer, 15.
    failing = models["failing_batch_sizes"]
    assert failing in ([16], [15, 16])
    (warning,) = [w for w in document["warnings"] if "cannot handle" in w]
    nearest = failing[0]
    assert warning.startswith(
        f"model.py:{line}: ValueError: cannot handle {nearest} samples (raised while running the "
    )
    left_out = (
        "batch size 16 out and are no guide from it on"
        if failing == [16]
        else "batch sizes 15, 16 out and are no guide from 15 on"
    )
    assert f"The models leave {left_out}." in warning
    measured = [s["batch_size"] for s in models["samples"]] + [s["batch_size"] for s in models["memory_samples"]]
    assert 8 in measured and 4 in measured and max(measured) < 16
    assert models["trusted_range"][1] == min(models["failing_batch_sizes"]) - 1
    assert max(p["batch_size"] for p in document["predictions"]) < 16  # no prediction where it fails


def test_iteration_that_fails_at_a_larger_batch_size_only_after_a_few_calls_is_analysed_below_it(tmp_path):
    """A failure that depends on the iteration's state (a buffer of samples that fills up, say):
    the probe at 16 runs its one call, then timing fails there. A warning, not the end of the
    analysis: 16 is left out, 4 and 8 are timed and fitted."""
    forward = """
    self.calls[x.shape[0]] = self.calls.get(x.shape[0], 0) + 1
    if x.shape[0] > 8 and self.calls[x.shape[0]] > 3:
        raise RuntimeError(f"the buffer is full after {self.calls[x.shape[0]] - 1} calls")  # <- HERE
    return self.linear(x).pow(2).mean()
    """
    files = with_model(forward)
    files["model.py"] = files["model.py"].replace(
        "self.linear = nn.Linear(4, 2)", "self.linear = nn.Linear(4, 2)\n        self.calls = {}"
    )
    document = analysis_of(files, tmp_path)
    line = Case("", files, (), path="model.py").expected_line()
    warning = next(w for w in document["warnings"] if "the buffer is full" in w)
    assert warning.startswith(f"model.py:{line}: RuntimeError: the buffer is full after 3 calls (raised while ")
    models = document["models"]
    assert [s["batch_size"] for s in models["samples"]] == [4, 8]
    assert models["failing_batch_sizes"] in ([16], [15, 16])  # 15 too, where it was timed to confirm it
    left_out = (
        "batch size 16 out and are no guide from it on"
        if models["failing_batch_sizes"] == [16]
        else "batch sizes 15, 16 out and are no guide from 15 on"
    )
    assert f"The models leave {left_out}." in warning
    assert max(p["batch_size"] for p in document["predictions"]) < 16


def test_iteration_that_fails_at_one_sample_is_analysed_above_it(tmp_path):
    """BatchNorm refuses a batch of one sample in training; the user's 2 works: the probe at 1
    fails with a warning at the line, and larger batch sizes are measured instead."""
    files = {
        **with_entry(input_provider=INPUT_PROVIDER.replace("batch_size=8", "batch_size=2")),
        "model.py": model_source("return self.linear(self.norm(x)).pow(2).mean()  # <- HERE").replace(
            "self.linear = nn.Linear(4, 2)", "self.linear = nn.Linear(4, 2)\n        self.norm = nn.BatchNorm1d(4)"
        ),
    }
    document = analysis_of(files, tmp_path)
    line = Case("", files, (), path="model.py").expected_line()
    warning = next(w for w in document["warnings"] if "batch size 1 " in w)
    assert warning.startswith(f"model.py:{line}: ValueError: Expected more than 1 value per channel")
    assert warning.endswith("The models leave batch size 1 out and are no guide at it and below.")
    assert [s["batch_size"] for s in document["models"]["samples"]][:2] == [2, 4]
    assert document["models"]["failing_batch_sizes"] == [1] and document["models"]["trusted_range"][0] == 2


NOT_FINITE = "the loss the model returned at batch size 8 is "


@cases(
    Case(
        "loss-times-nan",
        with_model("return (self.linear(x) * float('nan')).sum()"),
        path="model.py",
        marker="def forward",
        says=(NOT_FINITE + "NaN",),
    ),
    Case(
        "log-of-negative",
        with_model("return torch.log(self.linear(x) - 100).mean()"),
        path="model.py",
        marker="def forward",
        says=(NOT_FINITE + "NaN",),
    ),
    Case(
        "loss-plus-infinity",
        with_model("return self.linear(x).pow(2).mean() + float('inf')"),
        path="model.py",
        marker="def forward",
        says=(NOT_FINITE + "infinite (inf)",),
    ),
    Case(
        # The model returns logits, so Skyline never sees the loss; the parameters it poisons show.
        "nan-loss-computed-outside-the-model",
        with_model(
            "return self.linear(x)",
            iteration_provider=iteration_provider_with("loss = model(x)", "loss = (model(x) * float('nan')).sum()"),
        ),
        path="model.py",
        marker="def forward",
        says=("parameter `linear.weight` holds NaN", "batch size 8"),
    ),
)
def test_loss_that_is_not_finite(tmp_path, case):
    check(case, tmp_path)


# --- --json and a failing analysis ----------------------------------------------------------

FAILING_PROJECTS = {
    "fails-loading": with_entry(iteration_provider=None),
    # The loss turns NaN from 16 samples on: found when the batch sizes are timed, late.
    "fails-timing": with_model("return self.linear(x).pow(2).mean() * (float('nan') if x.shape[0] > 8 else 1.0)"),
}


@pytest.mark.parametrize("which", list(FAILING_PROJECTS))
def test_failing_analysis_does_not_create_json(tmp_path, which):
    project = write_project(tmp_path, FAILING_PROJECTS[which])
    result = run_skyline(project, "--json", "out.json")
    assert_error(result)
    assert_no_json(project)


@pytest.mark.parametrize("which", list(FAILING_PROJECTS))
def test_failing_analysis_leaves_existing_json_unchanged(tmp_path, which):
    project = write_project(tmp_path, FAILING_PROJECTS[which])
    previous = '{"schema": "skyline.analysis/1", "batch_size": 123}\n'
    (project / "out.json").write_text(previous, encoding="utf-8")
    os.chmod(project / "out.json", 0o640)
    result = run_skyline(project, "--json", "out.json")
    assert_error(result)
    assert (project / "out.json").read_text(encoding="utf-8") == previous
    assert (project / "out.json").stat().st_mode & 0o777 == 0o640
    assert [p.name for p in project.iterdir() if p.name.startswith(".out.json.")] == []
