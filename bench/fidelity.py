"""Fidelity: does the time Skyline reports match the time the user's own training loop takes?

    python bench/fidelity.py [--models default,cnn,transformer,gpt,vit] [--rounds 3] [--busy N]
                             [--output bench/fidelity.json]

For each model, in R interleaved rounds (the models' order rotated each round), three fresh
processes: `skyline profile ENTRY --device cpu --json` (its document and report kept), then the
user's own loop (bench/baselines/plain_loop.py) at the user's batch size and at one larger batch
size the first analysis predicted inside its trusted range (`models.trusted_range`: the largest
ladder batch size of `predictions` there, preferring one that was not measured). The plain loops
run in the default environment, a copy of this process's as it started: no OpenMP settings, no
allocator settings, exactly what a training script gets; the analyses get the same copy.

The table, per model: Skyline's iteration time (median over the analyses) against the plain loop's
mean (median over the rounds) at the user's batch size, and the predicted time against it at the
larger one, each with its error; the spread (max - min, percentage points) over the analyses of
the top three lines' shares of the iteration (own forward + backward + step time over
`iteration.run_time_ms`); the batch size each analysis advises (`models.recommendation` where the
document has one, else the report's "Batch size" line); each analysis's wall time.

`--busy N` keeps N busy processes (`while True: pass`) running for the whole run, to measure the
same table under load. Writes the JSON (with the machine: nproc, torch, date) and a markdown table
beside it (same name, .md), prints the table, and keeps every analysis's document and report in a
folder beside them (`<output stem>-documents/`). Every subprocess runs under a timeout; a failed
analysis or loop ends the run with a non-zero status and a message saying which.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The environment every measured process gets: this process's as it started (the standard library
# imported above changes none of it; bench/run.py settles OpenMP, this bench must not).
BASE_ENV = dict(os.environ)

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
PLAIN_LOOP = HERE / "baselines" / "plain_loop.py"
MODELS = {
    "default": "examples/default/entry_point.py",
    "cnn": "examples/cnn/entry_point.py",
    "transformer": "examples/transformer/entry_point.py",
    "gpt": "bench/models/gpt/entry_point.py",
    "vit": "bench/models/vit/entry_point.py",
}
TOP_LINES = 3
# The terminal report's summary label for the advice, padded as its labels are (LABEL in
# skyline_engine/render/terminal.py); continuation lines are indented by the same width.
ADVICE_LABEL = re.compile(r"^Batch size {3}(.*)$")
CONTINUATION = " " * 13
ADVISED = re.compile(r"^(?:keep|use) ([\d,]+)")


class Failure(Exception):
    """A measured process that failed or ran out of time: ends the run with this message."""


def run_bounded(command: list[str], timeout: float, env: dict[str, str], what: str) -> tuple[str, str, float]:
    """Run `command` in its own process group with a time limit; (stdout, stderr, seconds).
    On a timeout, the whole group it started (workers of an analysis too) is killed."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException as stopped:  # a timeout, or ^C: end what this process started, then say so
        _kill_group(process)
        out, err = process.communicate()
        if isinstance(stopped, subprocess.TimeoutExpired):
            raise Failure(f"{what} did not finish within {timeout:.0f} s (killed).\n{_tail(err)}") from None
        raise
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise Failure(f"{what} failed with exit status {process.returncode}.\n{_tail(err or out)}")
    return out, err, seconds


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)  # the group this script started for it, by its id


def _tail(text: str, lines: int = 20) -> str:
    kept = (text or "").rstrip().splitlines()[-lines:]
    return "  " + "\n  ".join(kept) if kept else "  (no output)"


# --- one analysis -------------------------------------------------------------------------------


def analyse(name: str, round_: int, documents: Path, timeout: float) -> dict[str, Any]:
    """`skyline profile ENTRY --device cpu --json` in a fresh process; the document and the report
    are kept in `documents`. Returns what the table needs of it."""
    json_path = documents / f"{name}-r{round_ + 1}.json"
    report_path = documents / f"{name}-r{round_ + 1}.txt"
    json_path.unlink(missing_ok=True)
    env = dict(BASE_ENV)
    env.pop("COLUMNS", None)  # the report unwrapped, as for a pipe: one line per summary line
    command = [sys.executable, "-m", "skyline_engine", "profile", MODELS[name], "--device", "cpu"]
    command += ["--json", str(json_path), "--quiet"]
    report, _, seconds = run_bounded(command, timeout, env, f"The analysis of {name} (round {round_ + 1})")
    report_path.write_text(report)
    if not json_path.exists():
        raise Failure(f"The analysis of {name} (round {round_ + 1}) exited normally but wrote no {json_path}.")
    doc = json.loads(json_path.read_text())
    return {
        "round": round_ + 1,
        "wall_seconds": seconds,
        "document": _relative(json_path),
        "report": _relative(report_path),
        "batch_size": doc["batch_size"],
        "run_time_ms": doc["iteration"]["run_time_ms"],
        "run_time_iqr_ms": doc["iteration"]["run_time_iqr_ms"],
        "engine_version": doc.get("engine_version"),
        "torch_version": doc.get("torch_version"),
        "device_name": doc["device"]["name"],
        "trusted_range": (doc.get("models") or {}).get("trusted_range"),
        "line_shares": line_shares(doc),
        "recommendation": recommendation(doc, report),
        "warnings": doc.get("warnings", []),
        "_doc": doc,  # dropped before writing: the document itself is kept in its file
    }


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def line_shares(doc: dict[str, Any]) -> dict[str, float]:
    """Each line's own time (forward + backward + step) as a share of the iteration, in percent,
    by `path:line`; lines that only call (no time of their own) are left out."""
    total = doc["iteration"]["run_time_ms"]
    shares = {}
    for line in doc.get("lines", []):
        own = line["forward_ms"] + line["backward_ms"] + (line.get("step_ms") or 0.0)
        if own > 0 and total:
            shares[f"{line['path']}:{line['line']}"] = 100.0 * own / total
    return shares


def recommendation(doc: dict[str, Any], report: str) -> dict[str, Any]:
    """The batch size the analysis advises: `models.recommendation` where the document has one,
    else the report's "Batch size" summary line (with its continuation lines)."""
    models = doc.get("models") or {}
    if models.get("recommendation") is not None:
        advice = models["recommendation"]
        batch_size = advice.get("batch_size") if isinstance(advice, dict) else None
        return {"source": "models.recommendation", "batch_size": batch_size, "text": advice}
    text: list[str] = []
    for line in report.splitlines():
        if not text:
            found = ADVICE_LABEL.match(line)
            if found:
                text.append(found.group(1).strip())
        elif line.startswith(CONTINUATION) and line.strip():
            text.append(line.strip())
        else:
            break
    advised = ADVISED.match(text[0]) if text else None
    return {
        "source": "report",
        "batch_size": int(advised.group(1).replace(",", "")) if advised else None,
        "text": "\n".join(text) if text else None,
    }


def larger_batch_size(doc: dict[str, Any]) -> int | None:
    """The largest ladder batch size of `predictions` above the user's, inside
    `models.trusted_range`, that fits, preferring one that was not measured; None without models.
    Whether this analysis predicted a time there does not matter: the range and the ladder come
    from the batch sizes measured, not from the fit, so a poor fit under load (no time predicted)
    does not leave the batch size unmeasured for the analyses that do predict one."""
    models = doc.get("models")
    if not models:
        return None
    low, high = models["trusted_range"]
    candidates = [
        p
        for p in doc.get("predictions", [])
        if p["batch_size"] > doc["batch_size"]
        and low <= p["batch_size"] <= high
        and p.get("fits", True)
        and not p.get("extrapolated", False)
    ]
    unmeasured = [p for p in candidates if p.get("measured") is None]
    chosen = unmeasured or candidates
    return max(p["batch_size"] for p in chosen) if chosen else None


def predicted_ms(doc: dict[str, Any], batch_size: int) -> tuple[float | None, bool]:
    """The predicted iteration time at `batch_size` and whether that batch size was measured: the
    `predictions` row when there is one, else the run-time line with the document's own rules
    (no time where it fits poorly, does not grow, or is not positive)."""
    for p in doc.get("predictions", []):
        if p["batch_size"] == batch_size:
            return p.get("run_time_ms"), p.get("measured") is not None
    models = doc.get("models")
    if not models:
        return None, False
    line = models["run_time_ms"]
    poor = line.get("r2") is not None and line["r2"] < 0.95 and line["max_relative_residual"] > 0.01
    value = line["slope"] * batch_size + line["bias"]
    per_step = models.get("samples_per_step")
    if per_step:
        value *= per_step / batch_size
    if poor or line["slope"] <= 0 or value <= 0:
        return None, False
    return value, False


# --- one plain loop -----------------------------------------------------------------------------


def plain_loop(name: str, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """The user's own loop at `batch_size`, in a fresh process with the default environment."""
    command = [sys.executable, str(PLAIN_LOOP), MODELS[name], "--batch-size", str(batch_size)]
    command += ["--min-iterations", str(args.plain_iterations), "--min-seconds", str(args.plain_seconds)]
    command += ["--max-seconds", str(args.plain_max_seconds)]
    what = f"The plain loop of {name} at batch size {batch_size}"
    out, _, seconds = run_bounded(command, args.plain_timeout, dict(BASE_ENV), what)
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise Failure(f"{what} printed no result.\n{_tail(out)}") from None
    result["wall_seconds"] = seconds
    return result


# --- the run ------------------------------------------------------------------------------------


def start_busy(count: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(count)
    ]


def stop_busy(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure(names: list[str], args: argparse.Namespace, documents: Path) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {
        name: {"entry_point": MODELS[name], "analyses": [], "plain": {}, "larger_batch_size": None} for name in names
    }
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            model = results[name]
            analysis = analyse(name, round_, documents, args.analysis_timeout)
            model["analyses"].append(analysis)
            say(
                f"round {round_ + 1} {name}: analysis {analysis['wall_seconds']:.1f} s, "
                f"iteration {analysis['run_time_ms']:.3g} ms at batch size {analysis['batch_size']}"
            )
            user = analysis["batch_size"]
            if round_ == 0:
                model["batch_size"] = user
            elif user != model["batch_size"]:
                seen = f"{model['batch_size']} and {user}"
                raise Failure(f"The analyses of {name} disagree on the user's batch size: {seen}.")
            if model["larger_batch_size"] is None:  # chosen once, by the first analysis that can
                model["larger_batch_size"] = larger_batch_size(analysis["_doc"])
            larger = model["larger_batch_size"]
            for batch_size in [user] + ([larger] if larger is not None else []):
                run = plain_loop(name, batch_size, args)
                run["round"] = round_ + 1
                model["plain"].setdefault(str(batch_size), []).append(run)
                say(
                    f"round {round_ + 1} {name}: plain loop at {batch_size}: mean {run['mean_ms']:.3g} ms, "
                    f"median {run['median_ms']:.3g} ms over {run['iterations']} iterations"
                )
    for model in results.values():
        for analysis in model["analyses"]:  # each analysis's prediction there, those before the choice too
            if model["larger_batch_size"] is not None:
                predicted, was_measured = predicted_ms(analysis["_doc"], model["larger_batch_size"])
                analysis["predicted_larger_ms"], analysis["larger_was_measured"] = predicted, was_measured
            del analysis["_doc"]
    return results


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _error(measured: float | None, truth: float | None) -> float | None:
    """Signed relative error in percent: positive when Skyline says slower than the loop ran."""
    if measured is None or not truth:
        return None
    return 100.0 * (measured / truth - 1.0)


def _spread(values: list[float]) -> float | None:
    """max − min over the median, in percent: how far fresh processes of one program differ."""
    return 100.0 * (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else None


def summarise(name: str, model: dict[str, Any]) -> dict[str, Any]:
    analyses = model["analyses"]
    user, larger = model["batch_size"], model["larger_batch_size"]
    plain_user = model["plain"].get(str(user), [])
    reported = _median([a["run_time_ms"] for a in analyses])
    plain_mean = _median([p["mean_ms"] for p in plain_user])
    plain_median = _median([p["median_ms"] for p in plain_user])
    summary: dict[str, Any] = {
        "batch_size": user,
        "reported_ms": reported,
        "plain_mean_ms": plain_mean,
        "plain_median_ms": plain_median,
        "error_percent": _error(reported, plain_mean),
        "error_vs_plain_median_percent": _error(reported, plain_median),
        "plain_spread_percent": _spread([p["mean_ms"] for p in plain_user]),
        "larger_batch_size": larger,
    }
    if larger is not None:
        plain_larger = model["plain"].get(str(larger), [])
        predictions = [a.get("predicted_larger_ms") for a in analyses]
        predicted = _median(predictions)
        larger_mean = _median([p["mean_ms"] for p in plain_larger])
        summary.update(
            predicted_ms=predicted,
            analyses_predicting=sum(value is not None for value in predictions),
            larger_was_measured=any(a.get("larger_was_measured") for a in analyses),
            larger_plain_mean_ms=larger_mean,
            larger_plain_median_ms=_median([p["median_ms"] for p in plain_larger]),
            larger_error_percent=_error(predicted, larger_mean),
            larger_plain_spread_percent=_spread([p["mean_ms"] for p in plain_larger]),
        )
    # Each analysis against the plain loop of its own round, minutes apart at most: the machine's
    # slow and fast phases, which move both alike, drop out of the ratio.
    summary["paired_errors_percent"] = _paired(analyses, plain_user, "run_time_ms")
    summary["paired_error_percent"] = _median(summary["paired_errors_percent"])
    if larger is not None:
        paired = _paired(analyses, model["plain"].get(str(larger), []), "predicted_larger_ms")
        summary["larger_paired_errors_percent"] = paired
        summary["larger_paired_error_percent"] = _median(paired)
    # The top lines: by their median share over the analyses (a line an analysis did not report
    # counts as 0 there).
    places = {place for a in analyses for place in a["line_shares"]}
    shares = {place: [a["line_shares"].get(place, 0.0) for a in analyses] for place in places}
    top = sorted(shares, key=lambda place: (-statistics.median(shares[place]), place))[:TOP_LINES]
    summary["top_lines"] = [
        {
            "line": place,
            "median_share_percent": statistics.median(shares[place]),
            "spread_points": max(shares[place]) - min(shares[place]),
            "shares_percent": shares[place],
        }
        for place in top
    ]
    summary["analyses_warning_of_load"] = sum(
        any(warning.startswith("Other processes kept") for warning in a["warnings"]) for a in analyses
    )
    # Processes whose CPU threads waited for a core at every parallel region (measure/thread_waits.py):
    # the analyses that warned of it, the plain loops whose probe found it; and the top lines' spread
    # over the other analyses, the state of the processes that did not wait.
    waited = [_threads_waited(a) for a in analyses]
    summary["analyses_threads_waited"] = sum(waited)
    plains = [p for runs in model["plain"].values() for p in runs]  # at both batch sizes
    summary["plain_threads_waited"] = sum(p.get("threads_waited_ms") is not None for p in plains)
    summary["plain_runs"] = len(plains)
    for line in summary["top_lines"]:
        unwaited = [share for share, w in zip(line["shares_percent"], waited) if not w]
        line["spread_points_unwaited"] = max(unwaited) - min(unwaited) if len(unwaited) > 1 else None
    summary["advised_batch_sizes"] = [a["recommendation"]["batch_size"] for a in analyses]
    summary["analysis_wall_seconds"] = [a["wall_seconds"] for a in analyses]
    return summary


def _paired(analyses: list[dict[str, Any]], plains: list[dict[str, Any]], figure: str) -> list[float]:
    """Each analysis's `figure` against the plain loop's mean of the same round, in percent (rounds
    without either left out)."""
    plain_of = {p["round"]: p["mean_ms"] for p in plains}
    errors = [_error(a.get(figure), plain_of.get(a["round"])) for a in analyses]
    return [e for e in errors if e is not None]


def _threads_waited(analysis: dict[str, Any]) -> bool:
    return any(warning.startswith("Your ") and "waited for a core" in warning for warning in analysis["warnings"])


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}%"


def _percents(values: list[float]) -> str:
    """Errors by round, and their median."""
    if not values:
        return "—"
    return ", ".join(f"{v:+.1f}" for v in values) + f" % (median {statistics.median(values):+.1f} %)"


def _paired_line(name: str, summary: dict[str, Any]) -> str:
    """A model's errors paired by round, at the user's batch size and the larger one."""
    line = f"{name} {_percents(summary['paired_errors_percent'])}"
    larger = summary.get("larger_paired_errors_percent")
    return line + (f", at {summary['larger_batch_size']:,} {_percents(larger)}" if larger else "")


def _plain_spread(value: float | None) -> str:
    return "" if value is None else f" (±{value / 2:.0f}%)"


def markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    out = [
        "# Fidelity: Skyline's times against the user's own training loop",
        "",
        f"{machine['date']} · {machine['cpu']} · nproc {machine['nproc']} · torch {machine['torch_version']} · "
        f"{result['rounds']} round(s) · {result['busy']} busy process(es) · load average "
        f"{machine['load_average_start'][0]:.2f} at the start, {machine['load_average_end'][0]:.2f} at the end",
        "",
        "Skyline: `skyline profile ENTRY --device cpu` (iteration time, median over the analyses); plain: "
        "the entry point's iteration in a loop of its own in a fresh process, default environment "
        "(`bench/baselines/plain_loop.py`; mean ms per iteration, median over the rounds; ± its spread over "
        "the rounds, max − min over the median: how far fresh processes of the same loop differ, the "
        "floor under any error here). Error: Skyline / plain − 1. Spread: max − min over the analyses of "
        "each top line's share of the iteration, in percentage points. Advised: the batch size each analysis advises.",
        "",
        "| model | batch | Skyline ms | plain ms | error | larger batch | predicted ms | plain ms | error "
        "| top-3 lines' spread (pp) | advised | analysis s |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|---|",
    ]
    for name, s in result["summary"].items():
        larger = s["larger_batch_size"]
        measured = " (measured)" if s.get("larger_was_measured") else ""
        predicted = _ms(s.get("predicted_ms"))
        if larger is not None and s["analyses_predicting"] < len(s["analysis_wall_seconds"]):
            predicted += f" ({s['analyses_predicting']} of {len(s['analysis_wall_seconds'])} predicted)"
        spreads = " / ".join(f"{line['spread_points']:.1f}" for line in s["top_lines"]) or "—"
        advised = " / ".join("none" if b is None else f"{b:,}" for b in s["advised_batch_sizes"])
        walls = s["analysis_wall_seconds"]
        wall = f"{statistics.median(walls):.0f}" + (f" ({min(walls):.0f}–{max(walls):.0f})" if len(walls) > 1 else "")
        out.append(
            f"| {name} | {s['batch_size']:,} | {_ms(s['reported_ms'])} "
            f"| {_ms(s['plain_mean_ms'])}{_plain_spread(s.get('plain_spread_percent'))} "
            f"| {_percent(s['error_percent'])} | {'—' if larger is None else f'{larger:,}{measured}'} "
            f"| {predicted} | {_ms(s.get('larger_plain_mean_ms'))}"
            f"{_plain_spread(s.get('larger_plain_spread_percent'))} "
            f"| {_percent(s.get('larger_error_percent'))} | {spreads} | {advised} | {wall} |"
        )
    paired = [_paired_line(name, s) for name, s in result["summary"].items()]
    out += [
        "",
        "Paired by round (each analysis against the plain loops that ran right after it, in the same "
        "phase of the machine), at the user's batch size and the larger one: " + "; ".join(paired) + ".",
    ]
    loaded = {name: s["analyses_warning_of_load"] for name, s in result["summary"].items()}
    if any(loaded.values()):
        counts = ", ".join(f"{name} {count} of {result['rounds']}" for name, count in loaded.items() if count)
        out += ["", f"Analyses that warned of other processes busy while timing: {counts}."]
    waited = {
        name: s for name, s in result["summary"].items() if s["analyses_threads_waited"] or s["plain_threads_waited"]
    }
    if waited:
        counts = ", ".join(
            f"{name} {s['analyses_threads_waited']} of {result['rounds']} analyses, "
            f"{s['plain_threads_waited']} of {s['plain_runs']} plain loops"
            for name, s in waited.items()
        )
        out += [
            "",
            "Processes whose CPU threads waited for a core at every parallel region (the engine's probe, "
            f"measure/thread_waits.py; the analyses warn of it): {counts}. Spread without them: over the "
            "analyses whose threads did not wait.",
        ]
    out += ["", "Top lines (own forward + backward + step time over the iteration):", ""]
    out += [
        "| model | line | median share | spread (pp) | spread without waits (pp) | shares |",
        "|---|---|--:|--:|--:|---|",
    ]
    for name, s in result["summary"].items():
        for line in s["top_lines"]:
            shares = ", ".join(f"{v:.1f}" for v in line["shares_percent"])
            unwaited = line.get("spread_points_unwaited")
            out.append(
                f"| {name} | `{line['line']}` | {line['median_share_percent']:.1f}% "
                f"| {line['spread_points']:.1f} | {'—' if unwaited is None else f'{unwaited:.1f}'} | {shares} |"
            )
    return "\n".join(out) + "\n"


def machine(results: dict[str, Any], load_start: tuple[float, ...], started: datetime.datetime) -> dict[str, Any]:
    analyses = [a for model in results.values() for a in model["analyses"]]
    plains = [p for model in results.values() for runs in model["plain"].values() for p in runs]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = None
    return {
        "date": started.isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": analyses[0]["device_name"] if analyses else platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch_version": plains[0]["torch_version"] if plains else None,
        "torch_threads": plains[0]["torch_threads"] if plains else None,
        "engine_version": analyses[0]["engine_version"] if analyses else None,
        "commit": commit,
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="busy processes kept running for the whole run")
    parser.add_argument("--output", type=Path, default=HERE / "fidelity.json", help="the JSON; the .md beside it")
    parser.add_argument("--analysis-timeout", type=float, default=900.0, help="seconds for one analysis")
    parser.add_argument("--plain-timeout", type=float, default=300.0, help="seconds for one plain-loop process")
    parser.add_argument("--plain-iterations", type=int, default=10, help="at least this many timed iterations")
    parser.add_argument("--plain-seconds", type=float, default=2.0, help="and at least this many seconds timed")
    parser.add_argument("--plain-max-seconds", type=float, default=60.0, help="or stop here (3 iterations at least)")
    args = parser.parse_args()
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in names if name not in MODELS]
    if unknown or not names or args.rounds < 1 or args.busy < 0:
        parser.error(f"models must be some of {', '.join(MODELS)}; rounds >= 1; busy >= 0 (unknown: {unknown})")

    output = args.output.resolve()
    documents = output.parent / f"{output.stem}-documents"
    documents.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    wall = time.perf_counter()
    busy = start_busy(args.busy)
    try:
        results = measure(names, args, documents)
    except Failure as failure:
        print(f"fidelity: {failure}", file=sys.stderr)
        return 1
    finally:
        stop_busy(busy)
    result = {
        "rounds": args.rounds,
        "busy": args.busy,
        "wall_seconds": time.perf_counter() - wall,
        "settings": {
            "plain_iterations": args.plain_iterations,
            "plain_seconds": args.plain_seconds,
            "plain_max_seconds": args.plain_max_seconds,
        },
        "machine": machine(results, load_start, started),
        "summary": {name: summarise(name, model) for name, model in results.items()},
        "models": results,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    output.with_suffix(".md").write_text(table)
    print(table)
    say(f"wrote {output}, {output.with_suffix('.md')} and the documents in {documents}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
