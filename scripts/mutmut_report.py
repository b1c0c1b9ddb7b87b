"""Mutation testing of the core's Python with mutmut: every mutation mutmut can make in the modules
named in pyproject.toml's [tool.mutmut], not a chosen list; then a report of what survived.

    .venv/bin/pip install mutmut==3.8.1     # a developer's tool, not a dependency
    .venv/bin/python scripts/mutmut_report.py [--output bench/mutmut.md] [--max-children 2]
    .venv/bin/python scripts/mutmut_report.py --only-mutate skyline_engine/attribute/recorder.py \
        --tests tests/test_breakdown.py --output bench/mutmut-recorder.md

`--only-mutate` and `--tests` replace the lists of [tool.mutmut] for one run: the recorder's tests
run real analyses, seconds a mutant, so it gets a pass of its own with the fastest of them.

mutmut writes a `mutants/` copy of the project and its results beside the code, so this runs it in
a scratch copy of the working tree (tracked and untracked files, not ignored ones), reads
`mutmut results --all true` and `mutmut show` of each survivor, and writes the survival per module
and each surviving mutant's changed lines. A mutant counts as caught when a test failed on it or
it ran past mutmut's time limit (an endless loop is caught too); it survives when the tests
passed, or when no test reached its function.

mutmut runs each mutant against the tests that reached its function; survivors then run again,
with the tests of the same files that only read a shared analysis (`credit_fixture_readers`: it is
made during a file's first test only). `--work-dir` keeps the copy, so a stopped pass can go on.

mutmut learns which tests reach a function by running them in this process, so code reached only
in a subprocess (the service's workers, the CLI) has "no tests" and counts as surviving here:
that is why pyproject.toml lists the modules whose tests call them in process. The Lua formatters
and the named mutations of issue 16 are scripts/mutations.py's (hand-listed).
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
MUTMUT = Path(sys.executable).with_name("mutmut")
# `skyline_engine.service.params.x_validate__mutmut_6`, or with a class:
# `skyline_engine.predict.batch_models.xǁBatchSizeModelsǁwarnings__mutmut_9`
MUTANT = re.compile(r"^\s*(?P<module>[\w.]+?)\.x(?:_|ǁ)(?P<function>[\wǁ]+)__mutmut_\d+: (?P<status>.+)$")
CAUGHT = {"killed", "timeout"}
SURVIVING = {"survived", "no tests"}
# Mutants that change nothing a program can observe, recognised by their changed lines: they are
# listed with the reason and left out of the survival rate. Each was read before it was put here.
EQUIVALENT = [
    (re.compile(r'(encode|encoding=)\(?"(ASCII|UTF-8)"'), "codec names are case-insensitive"),
    (re.compile(r"token_urlsafe\(None\)"), "None is token_urlsafe's default: 32 bytes"),
    (re.compile(r"O_EXCL, 385\)"), "385 is 0o600"),
    (re.compile(r"O_EXCL, \)"), "the fchmod that follows sets 0o600; only an instant between the two tells"),
    (
        re.compile(r"folder\.mkdir\(mode=0o700, parents=True, (exist_ok=(None|False))?\s*\)"),
        "the folder was just found missing: only a race tells",
    ),
    (
        re.compile(r"read_text\(encoding=None\)\.strip\(\) == token"),
        "a token is ASCII: every locale's codec reads it alike",
    ),
    (re.compile(r"range\(1, ATTEMPTS \+ 2\)"), "the loop raises at attempt ATTEMPTS: there is no attempt after it"),
    (re.compile(r"st_mtime <= QUIET_S"), "a float clock never lands on the boundary itself"),
    (
        re.compile(r"_write_in_place\(fd, data, rewritten, start, None, relative\)"),
        "at the same length the bytes after the literal are the file's own: writing them too changes nothing",
    ),
    (re.compile(r"if len\(rewritten\) <= len\(expected\):"), "equal lengths took the branch before"),
    (re.compile(r"os\.pread\(fd, (2 << 20|1 << 21), offset\)"), "the size of the chunks read changes no result"),
    (
        re.compile(r"decode_source\(rewritten, None\)"),
        "the path names a failure that cannot come: the bytes decoded before the digits changed",
    ),
    (
        re.compile(
            r"cannot find the batch size's digits|CANNOT FIND THE BATCH"
            r"|raise SkylineError\((None, path=relative|None|path=relative)\)"
        ),
        "a safety net that cannot fire: digits are ASCII bytes in every encoding Python reads source in",
    ),
    (
        re.compile(r"self\.max_batch_size\(\) or 1, self\.memory_batch_sizes"),
        "an extrapolated largest batch size is above 0",
    ),
    (
        re.compile(r"upper = min\(largest, batch_size \* 16\) if \(largest\) and False"),
        "sizes above the largest that fits are dropped afterwards",
    ),
    (re.compile(r"^\+\s*step = 2$|if step > smallest:"), "1, and the smallest measured, are in the ladder anyway"),
    (re.compile(r"^\+\s*start = None$"), "source[None:] is source[0:]"),
    (re.compile(r"if start <= len\(source\):"), "an empty last line holds no literal and moves none"),
    # The recorder's.
    (re.compile(r"return k if k >= 1 and backward_passes == k"), "k = 1 gives 1 either way"),
    (re.compile(r"id\(model\) if \(model is not None\) or True"), "id(None) is no module's id"),
    (
        re.compile(r'self\.memory: MemoryMeter \| None = ""'),
        "IterationRecording sets the meter, or None, before every recorded iteration",
    ),
    (
        # Its first value, and steps that keep the ids apart (not `= 1`: every call the same id).
        re.compile(r"^\+ {4}self\._module_call_count = 1$|^\+ {8}self\._module_call_count (-= 1|\+= 2)$"),
        "invocation ids need only differ from 0 (no module) and from each other",
    ),
    (
        # The lookup and the store, not the answer.
        re.compile(r"^\+ {4}known = None$|_users_module_types\.get\(None\)|_users_module_types\[kind\] = None$"),
        "a cache missed: the answer is worked out again, the same",
    ),
    (re.compile(r"self\._saved\[storage\] = (None|False)$"), "only membership in `_saved` is read"),
    (
        re.compile(r"self\.call_sites\.innermost\(skip=2\)"),
        "the frame skipped is torch's Module._call_impl, never the user's",
    ),
    (
        re.compile(r"return self\.call_sites\.stack\(skip=4\)\[0\]"),
        "the frame skipped is torch's backward(), never the user's",
    ),
    (
        re.compile(r"stack, frame_id = self\.call_sites\.stack\(skip=3\)|runs_within\(_SCALER_CODES, (skip=3)?\)"),
        "torch (2.13, tested) calls every __torch_dispatch__ through two frames of its own (dynamo's "
        "disable wrapper): one frame more or less skipped is still torch's",
    ),
    (re.compile(r"/ 1000001\.0$"), "a millionth of a time changes no figure shown"),
    (re.compile(r'getattr\(kind, "forward", \)'), "every module class has a forward (nn.Module's stub)"),
    (
        re.compile(r"return func\(\*args, \)$"),
        "what is not work is torch.profiler's record_function markers, called without keywords",
    ),
    (
        re.compile(r"if \(sequence != _NO_SEQUENCE\) or True"),
        "no forward operation is kept under the number of nodes that have none",
    ),
]

# Code only a GPU runs: on a machine without one no test can reach it, so its mutants are counted
# apart ("GPU only"), neither caught nor surviving; the GPU tests (tests/test_gpu.py) reach it.
# The backward callers' stack read from another thread: only autograd's device threads (CUDA) run
# backward off the iteration's thread; on the CPU both branches read the same thread's frames.
GPU_ONLY_FUNCTIONS = re.compile(r"^_CudaTimer\.")
GPU_ONLY_LINES = re.compile(
    r"self\.timer = _CudaTimer\(\) if |threading\.get_ident\(\) != self\._iteration_thread"
    r"|return self\.call_sites\.stack_from\("
)


def copy_tree(destination: Path) -> None:
    """The working tree's files that git would carry (tracked, and untracked but not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / name.decode()
        if source.is_file():
            target = destination / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def override_config(folder: Path, only_mutate: list[str], tests: list[str]) -> None:
    """Replace, in the scratch copy, the modules mutated and the tests run (mutmut reads
    pyproject.toml's [tool.mutmut] before setup.cfg, so the table moves to setup.cfg)."""
    pyproject = folder / "pyproject.toml"
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["mutmut"]
    if only_mutate:
        config["only_mutate"] = only_mutate
    if tests:
        config["pytest_add_cli_args_test_selection"] = tests
    text = pyproject.read_text(encoding="utf-8")
    start = text.index("[tool.mutmut]")
    end = text.find("\n[", start + 1)
    pyproject.write_text(text[:start] + (text[end + 1 :] if end >= 0 else ""), encoding="utf-8")
    lines = ["[mutmut]"]
    for key, value in config.items():
        lines.append(
            f"{key}=" + ("".join(f"\n    {item}" for item in value) if isinstance(value, list) else f"{value}")
        )
    (folder / "setup.cfg").write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_mutmut(folder: Path, max_children: int, mutants: list[str] | None = None) -> float:
    """`mutmut run`: every mutant not yet run, or `mutants` again."""
    started = time.perf_counter()
    command = [str(MUTMUT), "run", "--max-children", str(max_children), *(mutants or [])]
    subprocess.run(command, cwd=folder, check=True)
    return time.perf_counter() - started


def credit_fixture_readers(folder: Path) -> None:
    """mutmut runs a mutant against the tests during which its function ran. A module-scoped
    fixture (one analysis that a file's tests all check) runs during the first of them only, so the
    file's other tests, which only read its result, reach nothing and were never run on the mutants
    of the code the fixture reached: `path = None` in the recorder's module hook survived, and
    tests/test_breakdown.py's module-tree test fails on it. So the tests of a file that reached no
    mutated function are credited with what the file's other tests reached."""
    path = folder / "mutants" / "mutmut-stats.json"
    stats = json.loads(path.read_text(encoding="utf-8"))
    reached = stats["tests_by_mangled_function_name"]
    credited = set().union(*reached.values())
    readers: dict[str, set[str]] = defaultdict(set)
    for test in stats["duration_by_test"]:
        if test not in credited:
            readers[test.split("::")[0]].add(test)
    for function, tests in reached.items():
        reached[function] = sorted(set().union(*(readers[test.split("::")[0]] for test in tests), tests))
    path.write_text(json.dumps(stats), encoding="utf-8")


def results(folder: Path) -> list[tuple[str, str, str, str]]:
    """(mutant, module, function, status) of every mutant."""
    listing = subprocess.run(
        [str(MUTMUT), "results", "--all", "true"], cwd=folder, check=True, capture_output=True, text=True
    ).stdout
    found = []
    for line in listing.splitlines():
        match = MUTANT.match(line)
        if match:
            name = line.split(":")[0].strip()
            found.append((name, match["module"], match["function"].replace("ǁ", "."), match["status"].strip()))
    return found


def recheck_survivors(folder: Path, max_children: int) -> float:
    """Run the survivors again, with the tests that read what their function's tests made (once
    each; known equivalent and GPU-only mutants survive any test, so they are not run again)."""
    rechecked_list = folder / "rechecked-mutants.txt"
    rechecked = set(rechecked_list.read_text(encoding="utf-8").split()) if rechecked_list.exists() else set()
    again = [
        name
        for name, _, function, status in results(folder)
        if status == "survived"
        and name not in rechecked
        and not needs_gpu(function, lines := changed_lines(folder, name))
        and not equivalence(lines)
    ]
    if not again:
        return 0.0
    credit_fixture_readers(folder)
    seconds = run_mutmut(folder, max_children, again)
    rechecked_list.write_text("\n".join(sorted(rechecked | set(again))) + "\n", encoding="utf-8")
    return seconds


@functools.cache  # a mutant's lines do not change; the recheck and the report both read them
def changed_lines(folder: Path, mutant: str) -> list[str]:
    diff = subprocess.run([str(MUTMUT), "show", mutant], cwd=folder, check=True, capture_output=True, text=True)
    return [
        line.rstrip() for line in diff.stdout.splitlines() if line[:1] in "-+" and not line.startswith(("---", "+++"))
    ]


def equivalence(mutated: list[str]) -> str | None:
    """Why the mutant changes nothing observable, when it is a known kind; else None."""
    added = [line for line in mutated if line.startswith("+")]
    for pattern, reason in EQUIVALENT:
        if added and all(pattern.search(line) for line in added):
            return reason
    return None


def needs_gpu(function: str, mutated: list[str]) -> bool:
    """A surviving mutant of code only a GPU runs: a function of the CUDA timer, or the choice of it."""
    added = [line for line in mutated if line.startswith("+")]
    if GPU_ONLY_FUNCTIONS.match(function):
        return True
    return bool(added) and all(GPU_ONLY_LINES.search(line) for line in added)


def run_config(folder: Path) -> tuple[list[str], list[str]]:
    """The modules mutated and the tests run in `folder`: its setup.cfg's [mutmut] (an override),
    else its pyproject.toml's [tool.mutmut]."""
    override = folder / "setup.cfg"
    if override.exists():
        parser = configparser.ConfigParser()
        parser.read(override, encoding="utf-8")
        table = parser["mutmut"]
        return table["only_mutate"].split(), table["pytest_add_cli_args_test_selection"].split()
    config = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    return config["only_mutate"], config["pytest_add_cli_args_test_selection"]


def markdown(
    found: list[tuple[str, str, str, str]],
    survivors: dict[str, list[str]],
    seconds: float,
    config: tuple[list[str], list[str]],
    resumed: bool,
) -> str:
    gpu_only = {name for name, _, function, _ in found if name in survivors and needs_gpu(function, survivors[name])}
    equivalent = {
        name: reason for name, lines in survivors.items() if name not in gpu_only and (reason := equivalence(lines))
    }
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    for name, module, _, status in found:
        by_module[module]["GPU only" if name in gpu_only else "equivalent" if name in equivalent else status] += 1
    modules, tests = config
    took = f"{seconds / 60:.0f} min on this machine"
    about = (
        f"Every mutant mutmut 3 makes in {', '.join(f'`{m}`' for m in modules)}, run against the tests of "
        f"{', '.join(f'`{t}`' for t in tests)} that reach its function ({len(found)} mutants; {took}"
        + (", resumed in a kept copy: the earlier runs' time is not counted). " if resumed else "). ")
        + "Caught: a test failed, or the mutant ran past mutmut's time limit. Surviving: the tests passed, "
        "or no test reached the function in process. Equivalent: the mutant changes nothing observable "
        "(the reasons are listed below). GPU only: code only a GPU runs, which no test can reach on a "
        "machine without one (the GPU tests do). Neither is counted in the survival rate."
    )
    lines = [
        "# Mutation testing with mutmut (python scripts/mutmut_report.py)",
        "",
        *textwrap.wrap(about, 100, break_on_hyphens=False),
        "",
        "| module | mutants | caught | survived | no tests | equivalent | GPU only | survival |",
        "|---|---|---|---|---|---|---|---|",
    ]
    total: Counter[str] = Counter()
    for module in sorted(by_module):
        counts = by_module[module]
        total.update(counts)
        lines.append(_row(f"`{module}`", counts))
    lines.append(_row("all", total))
    lines += ["", "## The surviving mutants", ""]
    surviving = {
        name: mutated for name, mutated in survivors.items() if name not in equivalent and name not in gpu_only
    }
    if not surviving:
        lines.append("None.")
    status_of = {name: status for name, _, _, status in found}
    for mutant, mutated in surviving.items():
        diff = ["  ```diff", *(f"  {line}" for line in mutated), "  ```"]
        lines += [f"- `{mutant}` ({status_of[mutant]})", "", *diff, ""]
    lines += ["", "## Equivalent mutants", ""]
    for mutant, reason in equivalent.items():
        lines.append(f"- `{mutant}`: {reason} (`{_first_added(survivors[mutant])}`)")
    if gpu_only:
        lines += ["", "## GPU only", ""]
        lines += [f"- `{mutant}` (`{_first_added(survivors[mutant])}`)" for mutant in sorted(gpu_only)]
    return "\n".join(lines).rstrip() + "\n"


def _first_added(mutated: list[str]) -> str:
    return next((line[1:].strip() for line in mutated if line.startswith("+")), "(a line removed)")


def _row(name: str, counts: Counter[str]) -> str:
    mutants = sum(counts.values())
    caught = sum(counts[s] for s in CAUGHT)
    surviving = sum(counts[s] for s in SURVIVING)
    counted = mutants - counts["equivalent"] - counts["GPU only"]
    share = surviving / counted if counted else 0.0
    return (
        f"| {name} | {mutants} | {caught} | {counts['survived']} | {counts['no tests']} | {counts['equivalent']} "
        f"| {counts['GPU only']} | {share:.0%} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "mutmut.md")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--only-mutate", nargs="+", default=[], help="modules to mutate instead of [tool.mutmut]'s")
    parser.add_argument("--tests", nargs="+", default=[], help="tests to run instead of [tool.mutmut]'s")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep mutmut's copy here (a folder it has run in before: the mutants not yet run, then the survivors)",
    )
    args = parser.parse_args()
    if not MUTMUT.exists():
        print(f"mutmut is not installed beside {sys.executable}: .venv/bin/pip install mutmut==3.8.1", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        folder = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="skyline-mutmut-")))
        resumed = (folder / "mutants").exists()
        if not resumed:
            copy_tree(folder)
            if args.only_mutate or args.tests:
                override_config(folder, args.only_mutate, args.tests)
        seconds = run_mutmut(folder, args.max_children)
        seconds += recheck_survivors(folder, args.max_children)
        found = results(folder)
        survivors = {name: changed_lines(folder, name) for name, _, _, status in found if status in SURVIVING}
        config = run_config(folder)
    report = markdown(found, survivors, seconds, config, resumed)
    args.output.write_text(report, encoding="utf-8")
    print(report.split("## The surviving mutants")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
