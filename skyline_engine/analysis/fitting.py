"""What an entry point's analysis and a script's share once their batch sizes are measured: the
batch-size models fitted to the samples, the notes on the measurements, and what the confirming
step found."""

from __future__ import annotations

from dataclasses import dataclass, field

from skyline_engine.measure.contention import CpuContention
from skyline_engine.measure.device import DeviceInfo
from skyline_engine.measure.iteration import Sample
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.measure.thread_waits import ThreadWaits
from skyline_engine.predict.batch_models import BatchSizeModels
from skyline_engine.predict.recommendation import Recommendation

ONE_SAMPLE = (
    "Only one batch size could be measured, so nothing is predicted: lower the batch size (--batch-size) so "
    "that half and twice it can be measured too."
)
NOT_ASKED = "The analysis was asked for the breakdown alone, without predictions."
# Why no batch size is recommended where the CPU threads waited for a core at every parallel
# region (measure/thread_waits.py): the iteration is then mostly waits, the same at any batch size.
# The default example's own loop with its threads held on one core: 312 ms an iteration at 128
# and at 1,024 samples (8.0 times the samples a second), against 4.2-4.8 and 16.2-16.3 ms
# otherwise (2.1-2.4 times); the CNN example's 128 against 32: 3.9 times, against 0.97.
THREADS_WAITED = (
    "your CPU threads waited for a core at every parallel operation (see the warnings): the iteration was then "
    "mostly waits, about the same at any batch size, so larger batch sizes ran faster per sample than they do in "
    "a process whose threads do not wait"
)
# Why no batch size is recommended on a CPU that other processes kept busy while the batch sizes
# were compared (measure/contention.py): waits for a core, about the same at any batch size, make
# larger batch sizes read faster than they run on a quiet machine. A small GPT beside two busy
# processes: 32 read 21 and 22 % faster than 16 in two analyses' rounds (a third advised it),
# where its own loops ran 32 10 % faster then, and on a quiet machine 16 was the faster.
BUSY_WHILE_COMPARED = (
    "other processes kept {share:.0%} of the CPUs busy while the batch sizes were compared: waits for a core, "
    "about the same at any batch size, make larger ones read faster than they run on a quiet machine; re-run on a "
    "quiet machine for advice"
)


def fit_models(
    samples: list[Sample], memory: dict[int, MemoryProfile], device: DeviceInfo, failing: list[int], users: int
) -> BatchSizeModels | None:
    """The batch-size models of the timed `samples` (`users`: the user's batch size). Where their
    micro-batches differ (accumulation to a fixed number of samples per step), the run-time line is
    one micro-batch's, and an iteration runs as many samples as the user's does."""
    if len(samples) < 2:
        return None
    sizes = [s.batch_size for s in samples]
    if len({s.micro_batches for s in samples}) > 1:
        user = next((s for s in samples if s.batch_size == users), samples[0])
        per_step = user.micro_batches * user.batch_size
        one_micro_batch = [s.run_time_ms / s.micro_batches for s in samples]
        capacity = device.memory_capacity_bytes
        return BatchSizeModels.fit(sizes, one_micro_batch, memory, capacity, failing=failing, samples_per_step=per_step)
    times = [s.run_time_ms for s in samples]
    return BatchSizeModels.fit(
        sizes, times, memory, device.memory_capacity_bytes, micro_batches=samples[0].micro_batches, failing=failing
    )


def busy_machine_note(contention: CpuContention, compared: str) -> str | None:
    """The warning that other processes kept the CPUs busy while the batch sizes were timed
    (`compared`: how they were timed, and how far their comparison holds), or None."""
    if not contention.busy:
        return None
    return (
        f"Other processes kept {contention.others_share:.0%} of the CPUs busy while the batch sizes were timed: "
        f"iterations ran slower than on a quiet machine and vary more. The batch sizes were timed {compared} the "
        "times themselves; re-run on a quiet machine for times to quote."
    )


@dataclass(frozen=True)
class Confirmed:
    """What the confirming step found (an entry point's in analysis/session.py, a script's in
    analysis/script_sizes.py): the models (their trusted range cut where the line bends, the
    batch sizes the user's code failed at), the batch sizes it timed against the user's (the
    user's again among them), the recommendation, and what to warn of."""

    models: BatchSizeModels | None
    checks: list[Sample] = field(default_factory=list)
    recommendation: Recommendation | None = None
    notes: list[str] = field(default_factory=list)


def withheld_where_threads_waited(
    recommendation: Recommendation | None, waits: ThreadWaits | None
) -> Recommendation | None:
    """`recommendation`, or none where the threads waited (`waits`) and it advised a batch size."""
    if waits is None or recommendation is None or recommendation.batch_size is None:
        return recommendation
    return Recommendation.none(THREADS_WAITED)


def withheld_where_busy(
    recommendation: Recommendation | None, compared: CpuContention | None, device: DeviceInfo
) -> Recommendation | None:
    """`recommendation`, or none where it advised a batch size that was compared on the CPU device
    while other processes kept the CPUs busy (`compared`: the busiest of the rounds that timed it
    and the user's). The CPU device's alone: there the model's own threads wait for the cores
    (measured there; a GPU's iteration waits for them only where launching its work does)."""
    if recommendation is None or recommendation.batch_size is None or device.type != "cpu":
        return recommendation
    if compared is None or not compared.busy:
        return recommendation
    return Recommendation.none(BUSY_WHILE_COMPARED.format(share=compared.others_share))
