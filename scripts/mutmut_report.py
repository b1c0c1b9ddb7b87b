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

mutmut learns which tests reach a function by running them in this process, so code reached only
in a subprocess (the service's workers, the CLI) has "no tests" and counts as surviving here:
that is why pyproject.toml lists the modules whose tests call them in process. The Lua formatters
and the named mutations of issue 16 are scripts/mutations.py's (hand-listed).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
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
]

# Code only a GPU runs: on a machine without one no test can reach it, so its mutants are counted
# apart ("GPU only"), neither caught nor surviving; the GPU tests (tests/test_gpu.py) reach it.
GPU_ONLY_FUNCTIONS = re.compile(r"^_CudaTimer\.")
GPU_ONLY_LINES = re.compile(r'device\.type == "(CUDA|XXcudaXX)"')


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


def run_mutmut(folder: Path, max_children: int) -> float:
    started = time.perf_counter()
    subprocess.run([str(MUTMUT), "run", "--max-children", str(max_children)], cwd=folder, check=True)
    return time.perf_counter() - started


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


def markdown(found: list[tuple[str, str, str, str]], survivors: dict[str, list[str]], seconds: float) -> str:
    gpu_only = {name for name, _, function, _ in found if name in survivors and needs_gpu(function, survivors[name])}
    equivalent = {
        name: reason for name, lines in survivors.items() if name not in gpu_only and (reason := equivalence(lines))
    }
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    for name, module, _, status in found:
        by_module[module]["GPU only" if name in gpu_only else "equivalent" if name in equivalent else status] += 1
    lines = [
        "# Mutation testing with mutmut (python scripts/mutmut_report.py)",
        "",
        "Every mutant mutmut 3 makes in the modules of pyproject.toml's `[tool.mutmut]`, run against",
        f"the tests it lists ({len(found)} mutants, {seconds / 60:.0f} min on this machine). Caught: a test",
        "failed, or the mutant ran past mutmut's time limit. Surviving: the tests passed, or no test",
        "reached the function in process. Equivalent: the mutant changes nothing observable (the",
        "reasons are listed below). GPU only: code only a GPU runs, which no test can reach on a",
        "machine without one (the GPU tests do). Neither is counted in the survival rate.",
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
    surviving = {name: mutated for name, mutated in survivors.items() if name not in equivalent | gpu_only}
    if not surviving:
        lines.append("None.")
    status_of = {name: status for name, _, _, status in found}
    for mutant, mutated in surviving.items():
        diff = ["  ```diff", *(f"  {line}" for line in mutated), "  ```"]
        lines += [f"- `{mutant}` ({status_of[mutant]})", "", *diff, ""]
    lines += ["", "## Equivalent mutants", ""]
    for mutant, reason in equivalent.items():
        changed = next(line for line in survivors[mutant] if line.startswith("+"))
        lines.append(f"- `{mutant}`: {reason} (`{changed[1:].strip()}`)")
    return "\n".join(lines).rstrip() + "\n"


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
    args = parser.parse_args()
    if not MUTMUT.exists():
        print(f"mutmut is not installed beside {sys.executable}: .venv/bin/pip install mutmut==3.8.1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="skyline-mutmut-") as scratch:
        folder = Path(scratch)
        copy_tree(folder)
        if args.only_mutate or args.tests:
            override_config(folder, args.only_mutate, args.tests)
        seconds = run_mutmut(folder, args.max_children)
        found = results(folder)
        survivors = {name: changed_lines(folder, name) for name, _, _, status in found if status in SURVIVING}
    report = markdown(found, survivors, seconds)
    args.output.write_text(report, encoding="utf-8")
    print(report.split("## The surviving mutants")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
