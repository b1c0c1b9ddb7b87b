"""The GPU check: what only an NVIDIA GPU can show, measured in one run of a few minutes.

    bash bench/gpu_check.sh                      # on the GPU machine, from the repository root

Runs with the machine's python3 as it is (torch, numpy, msgpack, nvidia-ml-py, pytest) and installs
nothing: the borrowed GPU machine has no network. Writes bench/results-gpu.md and .json, prints
the table, and exits 0 only when every check passed on CUDA: 2 without CUDA (a GPU check that
passes without a GPU proves nothing), 1 when a check failed (the others still ran), 3 after a
rehearsal (`--rehearse-on-cpu`: every step on the CPU, to catch mistakes here before GPU minutes
are spent; never a result). The results are written after every check, so a run cut short keeps
what it measured (its first line says so); `--only tests,oom` runs again just those checks, and
`--output DIR/name` writes them elsewhere (on a borrowed machine, into the folder that comes back).

The checks:
0. every torch API the engine names exists in this torch (`tests/test_torch_apis.py`; the GPU
   image has torch 2.11, this project's CI 2.13);
1. the GPU-marked tests (`pytest -m gpu -rs tests/test_gpu.py`): fails if any is skipped;
2. one recorded iteration of the CNN and the transformer examples: backward records, the share
   attributed to user lines, and each top operation's share of the engine's kernel time
   (`attribution.device_time: "kernels"`) against its share of torch.profiler's device time:
   within KERNEL_SHARE_POINTS, or the check fails (the spans beside them, for comparison);
3. peak memory: allocated (what the engine reports) against reserved, mem_get_info and NVML;
4. a real out-of-memory (torch.cuda.set_per_process_memory_fraction): probing backs off, the
   analysis completes, and allocated memory returns to where it was;
5. `skyline serve --stdio --device cuda` through one analysis, and the spare worker's GPU memory;
6. the benchmark's accuracy figures (held-out time and memory errors) on CUDA;
7. data-parallel training on 2 ranks over NCCL (`skyline profile --nproc 2`), with 2 GPUs or more;
8. a compiled model's reported peak against its own max_memory_allocated over a plain compiled
   iteration: within COMPILED_PEAK_SHARE.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

try:
    import torch
except ImportError as exc:  # the machine's python3 without torch: not the GPU machine
    print(f"gpu_check: {sys.executable} cannot import torch ({exc}): no GPU check here.", file=sys.stderr)
    sys.exit(2)

from skyline_engine.analysis.session import AnalysisRequest, analyze  # noqa: E402
from skyline_engine.measure import nvml  # noqa: E402
from skyline_engine.measure.timing import TimingBudget  # noqa: E402

EXAMPLES = {"cnn": "examples/cnn/entry_point.py", "transformer": "examples/transformer/entry_point.py"}
QUICK = TimingBudget(min_run_s=0.1, max_run_s=0.5)
MiB = 1 << 20


class Report:
    def __init__(self) -> None:
        self.sections: dict[str, dict[str, Any]] = {}

    def run(self, name: str, check: Callable[[], dict[str, Any]]) -> None:
        print(f"gpu_check: {name}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            figures = check()
            passed = bool(figures.pop("passed", True))
        except Exception as exc:  # noqa: BLE001 - one check's failure must not cost the others their GPU time
            figures = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            passed = False
        figures["seconds"] = round(time.perf_counter() - started, 1)
        self.sections[name] = {"passed": passed, **figures}

    @property
    def passed(self) -> bool:
        return all(section["passed"] for section in self.sections.values())


# --- 1. the GPU tests ---------------------------------------------------------------------------


def gpu_tests(device: str) -> dict[str, Any]:
    if device == "cpu":
        return {"skipped": "the GPU tests need CUDA (rehearsal)"}
    return _pytest("-m", "gpu", "-rs", "tests/test_gpu.py")


def torch_apis(device: str) -> dict[str, Any]:
    """The torch internals the engine names exist in this torch (the GPU image's may be older)."""
    return _pytest("tests/test_torch_apis.py")


def _pytest(*args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    summary = (result.stdout.strip().splitlines() or [""])[-1]
    skipped = "skipped" in summary
    return {
        "passed": result.returncode == 0 and not skipped,
        "summary": summary,
        "output_tail": result.stdout[-3000:] + result.stderr[-2000:],
    }


# --- 2. recorded iterations against torch.profiler ---------------------------------------------


# Each top operation's share of the engine's kernel time may differ from its share of
# torch.profiler's device time by this much (issue: "within 5 points").
KERNEL_SHARE_POINTS = 0.05


def recorded_iterations(device: str) -> dict[str, Any]:
    """Each example's first recorded iteration against torch.profiler's device time per aten
    operation (CPU rehearsal: self CPU time): on CUDA the engine's operation times are their
    kernels' (`attribution.device_time`), and each top operation's share must agree."""
    figures: dict[str, Any] = {}
    passed = True
    for name, entry in EXAMPLES.items():
        request = AnalysisRequest(entry, REPO, device=device, budget=QUICK, predict=False, timeline=True)
        doc = analyze(request).to_dict()
        timeline = doc["timeline"]
        engine_ops = _per_operation(timeline)
        profiler_ops = _profiler_device_time(entry, doc["batch_size"], device)
        shared = sorted(set(engine_ops) & set(profiler_ops), key=lambda op: -profiler_ops[op])[:8]
        engine_total, profiler_total = sum(engine_ops.values()), sum(profiler_ops.values())
        top = [
            {
                "operation": op,
                "engine_share": engine_ops[op] / engine_total if engine_total else None,
                "profiler_share": profiler_ops[op] / profiler_total if profiler_total else None,
            }
            for op in shared
        ]
        apart = [abs(t["engine_share"] - t["profiler_share"]) for t in top if None not in t.values()]
        figures[name] = {
            "device_time": doc["attribution"]["device_time"],
            "device_time_fallback": doc["attribution"]["device_time_fallback"],
            "backward_records": sum(1 for op in timeline if op["phase"] == "backward"),
            "forward_records": sum(1 for op in timeline if op["phase"] == "forward"),
            "attributed_to_user_lines": doc["attribution"]["user_lines_fraction"],
            "iteration_ms": doc["iteration"]["run_time_ms"],
            "engine_operations_ms": engine_total,
            "engine_spans_ms": sum(op["span_ms"] or 0.0 for op in timeline),
            "profiler_device_ms": profiler_total,
            "most_points_apart": max(apart, default=None),
            "top_operations": top,
        }
        assert figures[name]["backward_records"] > 0, f"{name}: no backward operation was recorded"
        if device != "cpu":
            passed &= doc["attribution"]["device_time"] == "kernels" and max(apart, default=1.0) <= KERNEL_SHARE_POINTS
    return {"passed": passed, **figures}


def _per_operation(timeline: list[dict[str, Any]]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for op in timeline:
        totals[op["name"]] += op["duration_ms"]
    return dict(totals)


def _profiler_device_time(entry: str, batch_size: int, device: str) -> dict[str, float]:
    """Device (CPU: self CPU) time per aten operation of one iteration, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    iteration, inputs = _load(entry, batch_size, device)
    for _ in range(2):
        iteration(*inputs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    with profile(activities=activities) as prof:
        iteration(*inputs)
        if device != "cpu":
            torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        # self_device_time_total from torch 2.4 on; self_cuda_time_total before
        device_micros = getattr(event, "self_device_time_total", None)
        if device_micros is None:
            device_micros = event.self_cuda_time_total
        micros = device_micros if device != "cpu" else event.self_cpu_time_total
        totals[event.key.removeprefix("aten::")] += micros / 1000.0
    return {op: ms for op, ms in totals.items() if ms > 0}


def _load(entry: str, batch_size: int, device: str) -> tuple[Any, Any]:
    import importlib.util

    path = REPO / entry
    # Every example has its own model.py: imported for this one, and forgotten afterwards, as the
    # engine forgets the modules of an analysis.
    sys.path.insert(0, str(path.parent))
    sys.modules.pop("model", None)
    try:
        spec = importlib.util.spec_from_file_location(f"gpu_check_{path.parent.name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with torch.device(device):
            model = module.skyline_model_provider()
            iteration = module.skyline_iteration_provider(model)
            inputs = module.skyline_input_provider(batch_size=batch_size)
    finally:
        sys.path.remove(str(path.parent))
        sys.modules.pop("model", None)
    return iteration, inputs


# --- 3. peak memory, four ways -------------------------------------------------------------------


def memory(device: str) -> dict[str, Any]:
    doc = analyze(AnalysisRequest(EXAMPLES["cnn"], REPO, device=device, budget=QUICK, predict=False)).to_dict()
    figures: dict[str, Any] = {
        "capacity_bytes": doc["device"]["memory_capacity_bytes"],
        "capacity_source": doc["device"]["memory_capacity_source"],
        "peak_allocated_bytes": doc["iteration"]["peak_memory_bytes"],
        "peak_reserved_bytes": doc["iteration"]["peak_memory_reserved_bytes"],
        # Where it peaked and the other tensors alive there (made by backward on autograd's device
        # thread on CUDA, whose frees the recorder follows too).
        "peak_memory_operation": doc["peak_memory_operation"],
    }
    if device == "cpu":
        return figures
    iteration, inputs = _load(EXAMPLES["cnn"], doc["batch_size"], device)
    iteration(*inputs)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    iteration(*inputs)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    figures.update(
        {
            "independent_max_allocated_bytes": torch.cuda.max_memory_allocated(),
            "max_reserved_bytes": torch.cuda.max_memory_reserved(),
            "mem_get_info_free_bytes": free,
            "mem_get_info_total_bytes": total,
            "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
            # The engine's own lookup: by UUID (GPU- or MIG-), never by index.
            "engine_nvml_total_bytes": nvml.total_memory_bytes(str(torch.cuda.get_device_properties(0).uuid)),
        }
    )
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        figures.update({"nvml_total_bytes": int(info.total), "nvml_used_bytes": int(info.used)})
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - NVML is one figure among several
        figures["nvml_error"] = f"{type(exc).__name__}: {exc}"
    independent = figures["independent_max_allocated_bytes"]
    figures["passed"] = abs(figures["peak_allocated_bytes"] - independent) <= 0.1 * independent
    return figures


# --- 4. a real out-of-memory ------------------------------------------------------------------


def out_of_memory(device: str) -> dict[str, Any]:
    """Limit this process's share of the GPU to halfway between what the allocator reserved at the
    user's batch size and at the next one measured (twice it): probing must back off, and the
    failed iterations' memory must be freed. (A limit of 1.6 times the user's peak let twice the
    batch size fit where fixed memory is most of the peak, as in the transformer example on an
    H200: 65 MiB of cuBLAS workspaces in a peak that grows 32 % from 16 samples to 32.)"""
    if device == "cpu":
        return {"skipped": "set_per_process_memory_fraction needs CUDA (rehearsal)"}
    entry = EXAMPLES["transformer"]
    first = analyze(AnalysisRequest(entry, REPO, device=device, budget=QUICK)).to_dict()
    reserved = {s["batch_size"]: s["peak_memory_reserved_bytes"] for s in first["models"]["samples"]}
    user = first["batch_size"]
    larger = min(b for b in reserved if b > user)
    allowed = (reserved[user] + reserved[larger]) // 2
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.set_per_process_memory_fraction(allowed / torch.cuda.get_device_properties(0).total_memory)
    try:
        doc = analyze(AnalysisRequest(entry, REPO, device=device, budget=QUICK)).to_dict()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()
    after = torch.cuda.memory_allocated()
    notes = [w for w in doc["warnings"] if "ran out of memory" in w]
    return {
        "reserved_bytes": reserved,
        "allowed_bytes": allowed,
        "measured_batch_sizes": [s["batch_size"] for s in (doc["models"] or {}).get("samples", [])],
        "out_of_memory_notes": notes,
        "allocated_before_bytes": baseline,
        "allocated_after_bytes": after,
        "passed": bool(notes) and after <= baseline + MiB,
    }


# --- 5. the service on CUDA --------------------------------------------------------------------


def service(device: str) -> dict[str, Any]:
    from rpc import Service

    svc = Service(REPO, device)
    try:
        svc.request("initialize", {"protocol_version": 1})
        analysis_id = svc.request("analyze", {"entry_point": EXAMPLES["cnn"]})["analysis_id"]

        def final(message: list[Any]) -> bool:
            return (
                message[0] == 2
                and message[1] in ("analysis", "analysis_error")
                and message[2][0].get("analysis_id") == analysis_id
                and not message[2][0].get("partial")
            )

        _, message = svc.wait(final, timeout=300)
        params = message[2][0]
        time.sleep(5)  # the spare worker starts once the analysis has ended
        status = svc.request("status", {})
        spare = status.get("spare_worker_pid")
        return {
            "final": message[1],
            "error": params.get("message") if message[1] == "analysis_error" else None,
            "samples_per_second": params["document"]["iteration"]["samples_per_second"]
            if message[1] == "analysis"
            else None,
            "spare_worker_pid": spare,
            "spare_worker_gpu_bytes": _gpu_memory_of(spare) if device != "cpu" else None,
            "passed": message[1] == "analysis",
        }
    finally:
        svc.close()


def _gpu_memory_of(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == pid:
                return int(process.usedGpuMemory or 0)
        return 0
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


# --- 6. accuracy on CUDA -----------------------------------------------------------------------


def accuracy(device: str) -> dict[str, Any]:
    import run

    return {name: run.accuracy_once(run.MODELS[name], device) for name in ("default", "cnn", "transformer")}


# --- 7. data-parallel training over NCCL (2 GPUs or more) ---------------------------------------


def data_parallel(device: str) -> dict[str, Any]:
    """`skyline profile --nproc 2` on the CNN example: NCCL with a GPU per rank (gloo when
    rehearsing on the CPU); every bucket timed by CUDA events. Skipped with fewer than 2 GPUs."""
    if device == "cuda" and torch.cuda.device_count() < 2:
        return {"passed": True, "skipped": f"{torch.cuda.device_count()} GPU: the NCCL path needs 2"}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "ddp.json"
        command = [sys.executable, "-m", "skyline_engine", "profile", "examples/cnn/entry_point.py", "--nproc", "2"]
        command += ["--device", device, "--quiet", "--json", str(out)]
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        if result.returncode != 0:
            return {"passed": False, "output_tail": result.stderr[-3000:]}
        dp = json.loads(out.read_text())["distributed"]
    buckets = dp["buckets"]
    return {
        "passed": dp["world_size"] == 2 and all(b["all_reduce_ms"] > 0 for b in buckets),
        "backend": dp["backend"],
        "ranks": dp["ranks"],
        "buckets": [{k: b[k] for k in ("size_bytes", "all_reduce_ms", "exposed_ms")} for b in buckets],
        "communication": dp["communication"],
        "link": dp["link"],
        "scaling": [(r["world_size"], round(r["samples_per_second"])) for r in dp["scaling"]],
    }


# --- 8. a compiled model's own peak -------------------------------------------------------------

COMPILED = "bench/models/compiled_transformer/entry_point.py"
# The reported peak of a compiled model may differ from its own max_memory_allocated by this share.
COMPILED_PEAK_SHARE = 0.02


def compiled_peak(device: str) -> dict[str, Any]:
    """The compiled transformer's reported peak (`compilation.peak_memory: "compiled_program"` on
    CUDA) against the allocator's peak over a plain iteration of the same compiled model, run here
    apart from the engine."""
    doc = analyze(AnalysisRequest(COMPILED, REPO, device=device, budget=QUICK, predict=False)).to_dict()
    reported = doc["iteration"]["peak_memory_bytes"]
    figures: dict[str, Any] = {
        "reported_peak_bytes": reported,
        "peak_memory": (doc["compilation"] or {}).get("peak_memory"),
        "peak_memory_parts": doc["peak_memory_parts"],
    }
    if device == "cpu":
        return figures
    iteration, inputs = _load(COMPILED, doc["batch_size"], device)
    for _ in range(3):  # compiled in the first, then the compiled code runs
        iteration(*inputs)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    iteration(*inputs)
    torch.cuda.synchronize()
    own = torch.cuda.max_memory_allocated()
    apart = abs(reported - own) / own
    figures.update({"own_max_allocated_bytes": own, "apart": apart})
    figures["passed"] = figures["peak_memory"] == "compiled_program" and apart <= COMPILED_PEAK_SHARE
    return figures


# --- the report ---------------------------------------------------------------------------------


def markdown(report: Report, facts: dict[str, Any]) -> str:
    lines = [
        "# GPU check",
        "",
        f"{facts['gpu']}; torch {facts['torch']} (CUDA {facts['cuda']}); Python {facts['python']}; "
        f"{'all passed' if report.passed else 'FAILED'}"
        f"{'' if facts.get('complete') else ' so far (the run did not finish)'}"
        f"{'; checks: ' + facts['checks'] if facts.get('checks') else ''}.",
        "",
        "| check | passed | seconds | figures |",
        "|---|---|---|---|",
    ]
    for name, section in report.sections.items():
        shown = {k: v for k, v in section.items() if k not in ("passed", "seconds", "traceback", "output_tail")}
        lines.append(f"| {name} | {'yes' if section['passed'] else '**no**'} | {section['seconds']} | "
                     f"`{json.dumps(shown, default=str)[:1500]}` |")  # fmt: skip
    return "\n".join(lines) + "\n"


CHECKS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    # key (for --only): (the report's name, the check)
    "apis": ("torch APIs the engine uses", torch_apis),
    "tests": ("GPU tests", gpu_tests),
    "recorded": ("kernel time per operation against torch.profiler", recorded_iterations),
    "memory": ("peak memory four ways", memory),
    "oom": ("a real out-of-memory", out_of_memory),
    "serve": ("skyline serve on the device", service),
    "accuracy": ("accuracy at held-out batch sizes", accuracy),
    "ddp": ("data-parallel training on 2 ranks", data_parallel),
    "compiled": ("a compiled model's own peak", compiled_peak),
}


def _checks(only: str | None) -> list[str]:
    if not only:
        return list(CHECKS)
    keys = [key.strip() for key in only.split(",") if key.strip()]
    unknown = [key for key in keys if key not in CHECKS]
    if unknown or not keys:
        named = f"unknown check {', '.join(unknown)}" if unknown else "--only names no check"
        raise SystemExit(f"gpu_check: {named}; the checks are {', '.join(CHECKS)}")
    return keys


def _write(output: Path, facts: dict[str, Any], report: Report, complete: bool) -> str:
    """The results so far, written after every check: a run cut short still leaves what it measured."""
    output.parent.mkdir(parents=True, exist_ok=True)
    facts = {**facts, "complete": complete}
    output.with_suffix(".json").write_text(json.dumps({"facts": facts, **report.sections}, indent=2, default=str))
    table = markdown(report, facts)
    output.with_suffix(".md").write_text(table)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rehearse-on-cpu", action="store_true", help="run every step on the CPU (never a result)")
    parser.add_argument(
        "--output", type=Path, default=REPO / "bench" / "results-gpu", help="where to write .md and .json (no suffix)"
    )
    parser.add_argument("--only", help=f"a comma-separated subset of the checks: {', '.join(CHECKS)}")
    args = parser.parse_args()
    keys = _checks(args.only)
    if not args.rehearse_on_cpu and not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA device is available (torch {torch.__version__}, "
            f"torch.cuda.is_available() is False): there is nothing to check here.",
            file=sys.stderr,
        )
        return 2
    device = "cpu" if args.rehearse_on_cpu else "cuda"
    facts = {
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "no GPU (rehearsal on the CPU)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    if keys != list(CHECKS):
        facts["checks"] = ", ".join(keys)
    output = args.output if device == "cuda" else Path(os.environ.get("TMPDIR", "/tmp")) / "gpu-check-rehearsal"
    report = Report()
    for key in keys:
        name, check = CHECKS[key]
        report.run(name, lambda check=check: check(device))
        section = report.sections[name]
        print(f"gpu_check: {name}: {'passed' if section['passed'] else 'FAILED'} in {section['seconds']} s",
              file=sys.stderr, flush=True)  # fmt: skip
        table = _write(output, facts, report, complete=len(report.sections) == len(keys))
    print(table)
    if device == "cpu":
        print(f"gpu_check: a rehearsal on the CPU, not a GPU check (written to {output}.md)", file=sys.stderr)
        return 3
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
