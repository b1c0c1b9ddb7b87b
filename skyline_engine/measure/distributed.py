"""DistributedDataParallel, measured: one rank's place in the process group, the model wrapped in
DDP, every gradient bucket's all-reduce timed through a DDP communication hook, and the link timed
by all-reduces of known sizes.

Every rank must run the same collectives in the same order, or one waits for the others until the
process group's timeout: whatever a rank runs here, every rank runs the same number of times,
with counts decided by rank 0 (`agree`), never by a rank's own clock.
"""

from __future__ import annotations

import datetime
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter  # bound now: user code may replace time's (freezegun)
from typing import Any, Callable, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from skyline_engine.errors import SkylineError
from skyline_engine.measure.timing import BlockTimes, Clock, TimingStats

Run = Callable[[], None]
T = TypeVar("T")

# Sizes of the all-reduces that time the link: latency-bound to bandwidth-bound.
LINK_PROBE_BYTES = (4 << 10, 256 << 10, 4 << 20)
LINK_PROBE_REPETITIONS = 7


@dataclass(frozen=True)
class Rank:
    """This process's place in distributed training."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


def join_process_group(device_request: str, timeout_s: float) -> Rank:
    """Joins the process group torchrun's variables describe: NCCL with one GPU per rank
    (`cuda:LOCAL_RANK`) when the analysis runs on CUDA, gloo on the CPU. A collective that waits
    longer than `timeout_s` (another rank crashed or hangs) raises instead of waiting for ever."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    on_cuda = device_request.startswith("cuda") or (device_request == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if on_cuda else torch.device("cpu")
    backend = "nccl" if on_cuda else "gloo"
    _check_backend(backend)
    if on_cuda:
        if local_rank >= torch.cuda.device_count():
            raise SkylineError(
                f"rank {rank} needs cuda:{local_rank}, but this machine has {torch.cuda.device_count()} GPU(s).",
                hint="Start at most one rank per GPU.",
            )
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as exc:
            raise _joining_error(exc) from None
    return Rank(rank, world_size, local_rank, backend, device)


def _check_backend(backend: str) -> None:
    if not dist.is_available():
        raise SkylineError("this PyTorch build has no torch.distributed: data-parallel training cannot be analysed.")
    available = dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()
    if not available:
        other = " (--device cpu uses gloo)" if backend == "nccl" else ""
        raise SkylineError(f"this PyTorch build has no {backend} backend{other}.")


def _joining_error(exc: BaseException) -> SkylineError:
    text = str(exc)
    port = os.environ.get("MASTER_PORT", "?")
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        return SkylineError(
            f"cannot start the process group: port {port} is already in use.", hint="Choose another port."
        )
    return SkylineError(f"cannot join the process group at {os.environ.get('MASTER_ADDR')}:{port}: {text}")


def agree(value: T) -> T:
    """Rank 0's `value`, on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_first(value: T) -> list[T] | None:
    """Every rank's `value`, by rank, on rank 0; None on the others."""
    values: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, values, dst=0)
    return values


def wrap_ddp(model: torch.nn.Module, rank: Rank) -> DistributedDataParallel:
    """The user's model in DDP, unless the model provider returned one already (its bucket size
    and options are the user's)."""
    if isinstance(model, DistributedDataParallel):
        return model
    device_ids = [rank.device.index] if rank.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


# DDP's error for parameters that got no gradient, and the line of it that numbers them.
_UNUSED_PARAMETERS = "Expected to have finished reduction in the prior iteration"
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


def unused_parameters_advice(exc: BaseException, model: torch.nn.Module) -> str | None:
    """For a model with parameters that get no gradient (a head used only in evaluation), which
    DDP as Skyline wraps it refuses: their names, and how to wrap the model so that it accepts them."""
    if not isinstance(model, DistributedDataParallel) or _UNUSED_PARAMETERS not in str(exc):
        return None
    trained = [name for name, parameter in model.module.named_parameters() if parameter.requires_grad]
    found = _UNUSED_INDICES.search(str(exc))
    indices = [int(i) for i in found.group(1).split()] if found else []
    names = [f"`{trained[i]}`" for i in indices if i < len(trained)]
    which = f" ({', '.join(names[:4])}{', …' if len(names) > 4 else ''})" if names else ""
    return (
        "Skyline wraps your model in DistributedDataParallel with its defaults, which expect a gradient for "
        f"every parameter in every iteration, and some parameters got none{which}. Return the model wrapped "
        "yourself from skyline_model_provider, `DistributedDataParallel(model, find_unused_parameters=True)` "
        "(Skyline keeps it as it is), or leave those parameters out of the model you train."
    )


# -- the buckets' all-reduces ---------------------------------------------------------------------


@dataclass
class BucketTrace:
    """One bucket in the traced iterations: its parameters (DDP rebuilds the buckets after the first
    iteration, in the order gradients became ready, so they are taken from the traced ones), and per
    iteration when backward made it ready and when its all-reduce finished, from the iteration's start."""

    index: int
    size_bytes: int = 0
    parameters: list[torch.Tensor] = field(default_factory=list)
    ready_ms: list[float] = field(default_factory=list)
    done_ms: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class BucketTiming:
    """One bucket, measured: the medians over the traced iterations."""

    index: int
    size_bytes: int
    parameters: tuple[torch.Tensor, ...]
    ready_ms: float
    all_reduce_ms: float
    exposed_ms: float  # the part of its all-reduce that ran after backward's end, past the previous bucket's


@dataclass(frozen=True)
class CommunicationTiming:
    buckets: list[BucketTiming]
    backward_end_ms: float  # when the last bucket was ready: backward's last gradient


class BucketTimer:
    """A DDP communication hook doing what DDP does without one (each bucket averaged by an
    all-reduce), that in `traced` iterations also notes when each bucket was ready and when its
    all-reduce ended: wall time on gloo; on CUDA, events on the stream DDP runs the hook on and on
    the one its future completes on."""

    def __init__(self, ddp: DistributedDataParallel, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.tracing = False
        self.traces: dict[int, BucketTrace] = {}
        self._start: Any = None
        self._marks: list[tuple[int, str, Any]] = []
        # DDP checks a hook's annotations against the real types; this module's are strings.
        ddp.register_comm_hook(None, lambda state, bucket: self._hook(state, bucket))  # noqa: PLW0108

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return perf_counter()

    def _hook(self, state: object, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size())
        if self.tracing:
            index = bucket.index()
            trace = self.traces.setdefault(index, BucketTrace(index))
            trace.size_bytes = tensor.numel() * tensor.element_size()
            trace.parameters = list(bucket.parameters())
            self._marks.append((index, "ready", self._now()))  # before: gloo may do much of it in the call
        work = dist.all_reduce(tensor, async_op=True)
        assert work is not None
        future: torch.futures.Future[list[torch.Tensor]] = work.get_future()
        if not self.tracing:
            averaged: torch.futures.Future[torch.Tensor] = future.then(lambda f: f.value()[0])
            return averaged

        def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            self._marks.append((index, "done", self._now()))
            return f.value()[0]

        traced: torch.futures.Future[torch.Tensor] = future.then(done)
        return traced

    def traced(self, run: Run) -> Run:
        """`run`, with its buckets' all-reduces timed."""

        def traced_run() -> None:
            self._marks = []
            self._start = self._now()
            self.tracing = True
            try:
                run()
            finally:
                self.tracing = False
            if self.cuda:
                torch.cuda.synchronize()
            for index, what, mark in self._marks:
                trace = self.traces[index]
                (trace.ready_ms if what == "ready" else trace.done_ms).append(self._since_start(mark))

        return traced_run

    def _since_start(self, mark: Any) -> float:
        if self.cuda:
            return float(self._start.elapsed_time(mark))
        return (float(mark) - float(self._start)) * 1000.0

    def timing(self) -> CommunicationTiming:
        return communication_timing([self.traces[i] for i in sorted(self.traces)])


def communication_timing(traces: Sequence[BucketTrace]) -> CommunicationTiming:
    """The medians over the traced iterations of `traces` (by bucket index) of each bucket's
    all-reduce and the part of it exposed.

    A bucket's all-reduce is counted from when its gradients were ready, or from the end of the
    all-reduces of the buckets before it when later: what it added to the communication. From its
    readiness alone, a bucket that waited for the ones before it (NCCL runs them one after
    another; gloo two at a time, sharing the link) counted their time again: two buckets measured
    5.9 and 5.7 ms in a 9.8 ms iteration, and the scaling predicted half the throughput measured at
    that very world size. Counted so, the simulation of the iteration (predict/scaling.py), which
    starts each all-reduce at that moment, reproduces the traced timeline. The exposed part is
    what ends after backward's end and after those all-reduces."""
    iterations = min((len(t.done_ms) for t in traces), default=0)
    own: dict[int, list[float]] = {t.index: [] for t in traces}
    exposed: dict[int, list[float]] = {t.index: [] for t in traces}
    ends: list[float] = []
    for n in range(iterations):
        backward_end = max(t.ready_ms[n] for t in traces)
        ends.append(backward_end)
        before = float("-inf")  # when the all-reduces of the buckets before this one had ended
        covered = backward_end  # communication after backward's end, already counted
        for t in traces:
            own[t.index].append(max(0.0, t.done_ms[n] - max(t.ready_ms[n], before)))
            exposed[t.index].append(max(0.0, t.done_ms[n] - covered))
            before = max(before, t.done_ms[n])
            covered = max(covered, t.done_ms[n])
    buckets = [
        BucketTiming(
            index=t.index,
            size_bytes=t.size_bytes,
            parameters=tuple(t.parameters),
            ready_ms=statistics.median(t.ready_ms[:iterations]),
            all_reduce_ms=statistics.median(own[t.index]),
            exposed_ms=statistics.median(exposed[t.index]),
        )
        for t in traces
        if iterations
    ]
    return CommunicationTiming(buckets, statistics.median(ends) if ends else 0.0)


# -- timing in lockstep ---------------------------------------------------------------------------


def lockstep_timing(runs: Mapping[str, Run], clock: Clock, block_size: int, rounds: int) -> dict[str, TimingStats]:
    """Each of `runs` timed in `rounds` interleaved rounds of one block of `block_size` iterations
    (each round starting with the next), the same counts on every rank."""
    times = {name: BlockTimes(run, clock, 0.0, block_size) for name, run in runs.items()}
    order = list(times)
    for n in range(rounds):
        shift = n % len(order)
        for name in order[shift:] + order[:shift]:
            times[name].time_block()
    return {name: t.stats() for name, t in times.items()}


def measure_link(rank: Rank) -> list[tuple[int, int, float]]:
    """All-reduces of LINK_PROBE_BYTES alone, between iterations: (world size, bytes, ms) each, the
    lower quartile of LINK_PROBE_REPETITIONS (the same every rank; the clocks are this rank's)."""
    measurements = []
    for size in LINK_PROBE_BYTES:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=rank.device)
        times = []
        for _ in range(LINK_PROBE_REPETITIONS):
            dist.barrier()
            if rank.device.type == "cuda":
                torch.cuda.synchronize()
            started = perf_counter()
            dist.all_reduce(tensor)
            if rank.device.type == "cuda":
                torch.cuda.synchronize()
            times.append((perf_counter() - started) * 1000.0)
        measurements.append((rank.world_size, size, float(np.percentile(times, 25))))
    return measurements


def link_description(rank: Rank) -> str:
    if rank.backend == "gloo":
        return "loopback (gloo on one machine)" if _one_machine(rank) else "network (gloo)"
    return "NVLink or PCIe (NCCL on one machine)" if _one_machine(rank) else "network (NCCL)"


def _one_machine(rank: Rank) -> bool:
    return int(os.environ.get("LOCAL_WORLD_SIZE", rank.world_size)) == rank.world_size
