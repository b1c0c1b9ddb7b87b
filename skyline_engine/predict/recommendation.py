"""The batch size to recommend: one answer, measured, or none and why.

The batch-size models suggest one batch size (`candidate`), for the reasons the report has always
given: the knee of the throughput curve (where it reaches 90 % of what the model approaches),
rounded up to the user's batch size times a power of two; or what stops short of it: the largest
predicted to fit, the largest below a batch size the user's code fails at, all the samples of an
optimizer step in one micro-batch, the end of the trusted range; with accumulation to a fixed
number of samples per step, one that divides them. Where the run-time line predicts nothing, or
throughput falls with the batch size, the fastest measured. A suggestion at or below the user's
batch size, or predicted less than NOISE_FLOOR faster than the user's measured throughput, is no
change worth making.

The analysis then times the suggestion beside the user's batch size (analysis/session.py), and
`recommend` recommends it only where its measured throughput beats the user's, timed in the same
rounds, by the noise: NOISE_FLOOR, or where more, the two measurements' spread (`noise`), and is
faster at all by more than DECIDED_BY standard errors of the ratio of their means; and
nothing where the models' own measurements spread too much to place the line (`too_noisy`). So a
recommendation is never slower than the user's batch size, never within the noise of it, and
always quotes a measurement. (Back-to-back analyses of one model on a busy 2-core machine had
advised 28, 19 and 6, and "use 4 for 4.7 samples/s (measured), 20 % slower than yours (8)": the
knee of a line through noisy times moves with every analysis, and nothing checked it.) Rounding
the knee up to the user's batch size times a power of two keeps such a knee's suggestion where
it was when the line moves a little (19 and 28 are both 32 for a user at 8).

Before the trusted range extends past the timed batch sizes, one probe there is timed beside the
user's batch size (`range_probe`); where its throughput misses the line's by more than the noise,
below it or above it (`line_miss`), the range ends at the largest timed batch size (the models'
`line_bends_at`), as it does where no probe there can be timed within the budget
(`range_unprobed`); where the probe held to the line short of the range's end (the largest the
budget could time, or the suggestion), the range ends at the probe (`range_probed_to`): nothing
further was checked. A probe that missed the line was still measured: where it ran faster than the
largest timed, each against the user's batch size beside it, it is the suggestion (`_past_the_bend`).

Where the user's batch size ran in another state of glibc's malloc alone than beside the others
(`malloc_states`: far more page faults alone), the recommendation must also hold in the state its
own training runs in (`in_your_trainings_state`): a batch size timed after a larger one ran is
faster than its own training, and a larger one not in proportion.

The rounds that time the suggestion and the probe stop once they decide these comparisons
(`comparisons_decided`): each estimate further than DECIDED_BY standard errors from the
threshold it is held against. The comparisons themselves are made as before, from the rounds'
final estimates.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyline_engine.measure.allocator import SETTLED_ENVIRONMENT
from skyline_engine.measure.iteration import Sample
from skyline_engine.predict.batch_models import MAX_SPREAD, BatchSizeModels, dividing_at_least, dividing_at_most
from skyline_engine.units import format_ms, format_rate

# A change of batch size must make training at least this much faster, measured, to clear the
# noise of timing on a shared machine (and the drift between processes): more where the two
# measurements compared spread more.
NOISE_FLOOR = 0.10
# The user's batch size ran in another state of glibc's malloc alone than beside the other batch
# sizes (`malloc_states`) where it took at least this many more minor page faults an iteration
# alone (the default example's 128 in bench/allocator_state.py: 128 alone, 64 after 1,024 ran, the
# same time)...
FAULTS_APART = 100
# ... and at least this many times as many.
FAULTS_RATIO = 2.0
# What one minor page fault can add to an iteration, at most: the examples' own training over the
# same batch size without the faults came to 1.2-2.5 µs a fault (bench/allocator_state.py: the
# CNN's 32 3.2 ms for 2,585 faults, the transformer's 16 2.5 ms for 1,000, the vision transformer's
# 32 17 ms for 12,449); four times the most. A difference beyond it is not the allocator's.
MAX_FAULT_MS = 0.01
# Where the run-time line predicts nothing, measured times that fall by more than this share as
# the batch size grows say the machine's speed changed while timing, not the model.
FALLING_TIMES = 0.05
# The confirming rounds stop once every comparison's estimate lies further than this many standard
# errors from its threshold (the standard error of a ratio of two means: their relative errors
# added in quadrature).
DECIDED_BY = 3.0
# How a recommended batch size and the user's were compared (`Recommendation.timed`): in the same
# interleaved rounds (an entry point's), or in runs one after another, in both orders (a training
# script's: analysis/script_sizes.py).
TIMED_BESIDE = "timed beside it"
TIMED_IN_TURN = "timed in runs before and after it"

NOTHING_FITS = (
    "not even batch size 1 is predicted to fit in the memory planned for; plan for a larger device "
    "(--memory-capacity) or make the model smaller"
)


@dataclass(frozen=True)
class Candidate:
    """What the models suggest: a batch size and why (`why`, said with a recommendation of it), or
    none (`batch_size` None) and why no change is worth making."""

    batch_size: int | None
    why: str
    # The probe past the largest measured batch size whose throughput missed the run-time line
    # (`line_bends_at`), where the suggestion fell back to the largest measured for it: a
    # measurement too, weighed against it (`recommend`, `_past_the_bend`).
    bent_at: int | None = None


@dataclass(frozen=True)
class Recommendation:
    """The analysis's one answer to "what batch size should I use" (the document's
    `models.recommendation`): a batch size, its measured throughput and the user's batch size's,
    timed in the same rounds, and why; or no batch size (None) and why no change is worth making."""

    batch_size: int | None
    samples_per_second: float | None  # measured at `batch_size`
    measured: bool  # `samples_per_second` is a measurement (always, with a batch size)
    reason: str
    users_samples_per_second: float | None = None  # the user's batch size, timed beside it
    # How the two were compared, as said after "yours (N)": TIMED_BESIDE, or TIMED_IN_TURN.
    timed: str = TIMED_BESIDE

    @classmethod
    def none(cls, reason: str) -> Recommendation:
        return cls(None, None, False, reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "samples_per_second": self.samples_per_second,
            "measured": self.measured,
            "reason": self.reason,
            "users_samples_per_second": self.users_samples_per_second,
            "timed": self.timed,
        }


def spread(sample: Sample) -> float:
    """How much a measurement's blocks spread: their interquartile range over the mean iteration."""
    return sample.timing.iqr_ms / sample.run_time_ms if sample.run_time_ms > 0 else 0.0


def noise(yours: Sample, theirs: Sample) -> float:
    """How much faster one batch size must run than another to be told apart: NOISE_FLOOR, or,
    where more, as much as would make their interquartile bands overlap (each spread half of it
    around its mean: half their spreads added)."""
    return max(NOISE_FLOOR, (spread(yours) + spread(theirs)) / 2)


def too_noisy(samples: Sequence[Sample]) -> str | None:
    """Why the timed `samples` cannot place the run-time line (MAX_SPREAD), or None."""
    worst = max(samples, key=spread)
    if spread(worst) <= MAX_SPREAD:
        return None
    return (
        f"the times of batch size {worst.batch_size:,} spread by {spread(worst):.0%} of their mean (IQR), too much "
        "to tell which batch size runs faster; re-run on a quiet machine"
    )


def candidate(models: BatchSizeModels, users: int) -> Candidate:
    """The batch size the models suggest instead of `users` (the user's, a timed one), or none and
    why (see the module's docstring)."""
    largest = models.max_batch_size()
    if largest == 0:
        return Candidate(None, NOTHING_FITS)
    if not models.time_predictable:
        return _fastest_measured(
            models, users, "the fastest measured: the run-time line predicts no other batch size (see the warnings)"
        )
    if models.run_time.bias <= 0:
        return _fastest_measured(models, users, "throughput falls at larger batch sizes: the fastest measured")
    knee = models.throughput_knee_batch_size()
    asymptote = models.asymptotic_samples_per_second()
    assert knee is not None and asymptote is not None  # time grows with the batch size, with fixed costs
    approached = f"the {format_rate(asymptote, ' samples/s')} this model approaches"
    high = models.trusted_range[1]
    ceiling = high if largest is None else min(largest, high)
    if knee <= users:
        return Candidate(
            None,
            f"yours is at or past the knee: throughput reaches 90% of {approached} at {knee:,}, and larger "
            "batch sizes buy little speed for their memory",
        )
    if knee <= ceiling:
        return _at_the_knee(models, users, knee, ceiling, approached)
    per_step = models.samples_per_step
    if largest is not None and largest <= high:
        why = "the largest predicted to fit: memory runs out before throughput levels off"
        return _worth_timing(models, users, *_dividing(per_step, largest, why), "the largest predicted to fit")
    if high + 1 in models.failing_batch_sizes:
        why = (
            f"the largest below {high + 1:,}, where your code fails (see the warnings); throughput would still rise "
            f"beyond it (90% of {approached} at {knee:,})"
        )
        what = f"the largest below {high + 1:,}, where your code fails"
        return _worth_timing(models, users, *_dividing(per_step, high, why), what)
    if high == per_step:  # the trusted range ends where a step would run less than one micro-batch
        why = f"all your {per_step:,} samples per optimizer step in one micro-batch: no accumulation"
        return _worth_timing(models, users, high, why, "all your samples per optimizer step in one micro-batch")
    measured = models.measured_batch_sizes[-1]
    if models.range_unprobed:
        why = (
            f"the largest measured: no batch size past {measured:,} was timed within the budget, precisely enough to "
            f"check the run-time line there; profile with --batch-size {measured} to measure further"
        )
        return _worth_timing(models, users, *_dividing(per_step, high, why), "the largest measured")
    if models.line_bends_at:
        why = f"the largest measured: {_bent_line(models.line_bends_at, measured)}"
        chosen = _worth_timing(models, users, *_dividing(per_step, high, why), "the largest measured")
        return dataclasses.replace(chosen, bent_at=models.line_bends_at)
    if high == models.range_probed_to:
        why = (
            f"the largest checked: the run-time line held at {high:,}, and nothing past it was timed to check it; "
            f"profile with --batch-size {high} to measure further"
        )
        return _worth_timing(models, users, *_dividing(per_step, high, why), "the largest checked")
    trusted = f"{high // measured}× {measured:,}, the largest measured" if high > measured else "the largest measured"
    why = (
        f"the largest of the trusted range (up to {trusted}); throughput still rises beyond it (90% of "
        f"{approached} at {knee:,}); profile with --batch-size {high} to measure further"
    )
    return _worth_timing(models, users, *_dividing(per_step, high, why), "the largest of the trusted range")


def _at_the_knee(models: BatchSizeModels, users: int, knee: int, ceiling: int, approached: str) -> Candidate:
    """The knee rounded up to the user's batch size times a power of two, within the ceiling (what
    fits, the trusted range); with samples per step, the smallest batch size from the knee on that
    divides them, else the largest up to the ceiling that does."""
    why = f"it reaches 90% of {approached}: larger batch sizes buy little speed for their memory"
    per_step = models.samples_per_step
    if not per_step:
        return _worth_timing(models, users, min(_doubling(users, knee), ceiling), why, "the knee")
    above = dividing_at_least(per_step, knee)
    if above is not None and above <= ceiling:  # at least the knee: what `why` says holds
        why = why if above == knee else f"{why}; {_divides(per_step, above, knee)}"
        return _worth_timing(models, users, above, why, "the knee")
    why = (
        f"the largest up to {ceiling:,} that divides your {per_step:,} samples per optimizer step; throughput "
        f"reaches 90% of {approached} at {knee:,}"
    )
    what = "the largest that divides your samples per optimizer step"
    return _worth_timing(models, users, dividing_at_most(per_step, ceiling), why, what)


def _doubling(users: int, at_least: int) -> int:
    """The smallest of `users` doubled one or more times that is at least `at_least`."""
    batch_size = 2 * users
    while batch_size < at_least:
        batch_size *= 2
    return batch_size


def _divides(per_step: int, batch_size: int, instead_of: int) -> str:
    """Why `batch_size` and not `instead_of`: an iteration that accumulates to a fixed number of
    samples per step (`256 // batch_size` micro-batches) takes them all only at a batch size that
    divides them; at 100 it would step after 200."""
    return f"{batch_size:,} divides your {per_step:,} samples per optimizer step, {instead_of:,} does not"


def _dividing(per_step: int | None, batch_size: int, why: str) -> tuple[int, str]:
    """`batch_size`, or the largest below it that divides the samples per step, and why."""
    if not per_step or per_step % batch_size == 0:
        return batch_size, why
    below = dividing_at_most(per_step, batch_size)
    return below, f"{_divides(per_step, below, batch_size)}; {why}"


def _worth_timing(models: BatchSizeModels, users: int, batch_size: int, why: str, what: str) -> Candidate:
    """`batch_size` (`what` it is, in a few words) where it is above the user's and, unless it was
    timed (then its measurement decides), predicted at least NOISE_FLOOR faster than the user's
    measured throughput."""
    if batch_size <= users:
        where = "yours" if batch_size == users else f"{batch_size:,}, below yours,"
        return Candidate(None, f"{where} is {what}: no larger batch size is predicted to run faster")
    if batch_size in models.measured_batch_sizes:
        return Candidate(batch_size, why)
    rate = models.predict(batch_size).samples_per_second
    yours = _measured_rate(models, users) or models.predict(users).samples_per_second
    if rate is None or not yours or rate < yours * (1 + NOISE_FLOOR):
        gain = compared(rate / yours) if rate and yours else "no faster than"
        return Candidate(
            None,
            f"{batch_size:,} ({what}) is predicted to run {gain} yours: a change must be at least {NOISE_FLOOR:.0%} "
            "faster to clear the noise",
        )
    return Candidate(batch_size, why)


def _measured_rate(models: BatchSizeModels, batch_size: int) -> float | None:
    rates = dict(zip(models.measured_batch_sizes, models.measured_samples_per_second))
    return rates.get(batch_size)


def _fastest_measured(models: BatchSizeModels, users: int, why: str) -> Candidate:
    """The timed batch size that ran fastest, where the times per micro-batch do not fall as the
    batch size grows (a machine's drift makes them fall). A small model's times grow too little,
    or too unevenly, for a straight line (0.70, 0.80 and 0.86 ms at 32, 64 and 128 samples: R²
    0.90), while its throughput tripled."""
    sizes, rates = models.measured_batch_sizes, models.measured_samples_per_second
    if not rates:
        return Candidate(None, "the document has no measured throughputs to compare")
    per_call = [b / rate for b, rate in zip(sizes, rates)]  # one micro-batch's time (seconds)
    if any(later < earlier * (1 - FALLING_TIMES) for earlier, later in zip(per_call, per_call[1:])):
        return Candidate(
            None,
            "the iteration time did not follow the batch size (see the warnings); re-run on a quiet machine",
        )
    largest = models.max_batch_size()
    fitting = [(rate, b) for b, rate in zip(sizes, rates) if largest is None or b <= largest]
    if not fitting:
        return Candidate(None, "none of the batch sizes measured is predicted to fit in the memory planned for")
    _, fastest = max(fitting)
    if fastest == users:
        return Candidate(None, "yours ran fastest of the batch sizes measured; the models predict no faster one")
    if fastest == sizes[-1] and not models.time_predictable and (largest is None or largest >= 2 * fastest):
        why += f"; profile with --batch-size {2 * fastest} to measure further"
    return Candidate(fastest, why)


def recommend(
    models: BatchSizeModels,
    users: int,
    samples: Sequence[Sample],
    checks: Sequence[Sample] = (),
    not_timed: Mapping[int, str] | None = None,
    timed: str = TIMED_BESIDE,
) -> Recommendation:
    """The recommendation of the `models` (fitted to `samples`, the user's batch size `users`
    among them), from the `candidate` and what was measured: `checks`, batch sizes timed after
    the models were fitted, in rounds with the user's (which `checks` holds again); `not_timed`,
    why a batch size could not be timed (it ran out of memory, the user's code failed there). The
    candidate's measurement is compared with the user's from the same rounds (`timed`: how they
    were timed, as the reasons say it)."""
    chosen = _past_the_bend(candidate(models, users), models, users, samples, checks)
    batch_size = chosen.batch_size
    if batch_size is None:
        return Recommendation.none(chosen.why)
    noisy = too_noisy(samples)
    if noisy:
        return Recommendation.none(noisy)
    if not_timed and batch_size in not_timed:
        return Recommendation.none(f"{batch_size:,}, which the models suggest, was not timed: {not_timed[batch_size]}")
    pair = _timed_together(batch_size, users, samples, checks)
    if pair is None:
        others = "".join(f"; {b:,} was not timed either: {why}" for b, why in sorted((not_timed or {}).items()))
        return Recommendation.none(
            f"{batch_size:,}, which the models suggest, was not timed: profile with --batch-size {batch_size} to "
            f"measure it{others}"
        )
    theirs, yours = pair
    gain = theirs.samples_per_second / yours.samples_per_second
    needed = noise(yours, theirs)
    if gain < 1 + needed:
        return Recommendation.none(
            f"{batch_size:,}, which the models suggest, ran {compared(gain)} yours ({users:,}) {timed}: a "
            f"change must be at least {needed:.0%} faster to clear the noise"
        )
    error = gain * math.hypot(theirs.timing.relative_error, yours.timing.relative_error)
    if not _decided(gain, 1.0, error):  # gain clears the noise above: decided means faster at all
        # Three blocks of a small GPT's 16 and 32 under two busy processes, spreading 21 and 17 %,
        # put 32 27 % faster (the noise: 19 %) and advised it; the analyses before and after it
        # advised nothing, and on a quiet machine 8 is the faster. Asked to clear the noise by
        # three standard errors, a quiet analysis's 8, 15 % faster than 16 known to 4 %, was
        # withheld too, where plain loops run it 20 % faster: the noise is the point estimate's
        # to clear, and the standard errors say whether it is faster at all.
        return Recommendation.none(
            f"{batch_size:,}, which the models suggest, ran {gain - 1:.0%} faster than yours ({users:,}) {timed}, "
            f"but their times are known only to ±{error:.0%} (the standard error of the ratio): it may be no "
            "faster at all; re-run on a quieter machine"
        )
    return Recommendation(batch_size, theirs.samples_per_second, True, chosen.why, yours.samples_per_second, timed)


def _past_the_bend(
    chosen: Candidate, models: BatchSizeModels, users: int, samples: Sequence[Sample], checks: Sequence[Sample]
) -> Candidate:
    """Where the suggestion fell back to the largest measured because the probe past it missed the
    run-time line (`Candidate.bent_at`), the probe where it ran faster, relative to the user's
    batch size in its own rounds, than the fallback did in its rounds (the ratios cancel the drift
    between rounds): the probe was measured too, though the line predicts nothing there. Whether a
    probe near the line reads just below it or just within the noise must not change the advice: of
    five quiet analyses of the default example, four found the line holding at 1,024 and advised
    it; one read 1,024 14 % below the line and advised 256, 26 % faster than 128, where 1,024 had
    run 35 % faster than 128 beside it. Where the samples per step are fixed, only a probe that
    divides them."""
    bend = chosen.bent_at
    per_step = models.samples_per_step
    if bend is None or (per_step and per_step % bend):
        return chosen
    probe = _timed_together(bend, users, (), checks)
    fallback = None if chosen.batch_size is None else _timed_together(chosen.batch_size, users, samples, checks)
    if probe is None or (chosen.batch_size is not None and fallback is None):
        return chosen

    def gain(pair: tuple[Sample, Sample] | None) -> float:  # over yours in the same rounds; yours: 1
        return 1.0 if pair is None else pair[0].samples_per_second / pair[1].samples_per_second

    if gain(probe) <= gain(fallback):
        return chosen
    faster = (
        "than yours, timed beside it"
        if fallback is None
        else f"than {fallback[0].batch_size:,} did, each timed beside yours"
    )
    why = f"the fastest measured: {_bent_line(bend, models.measured_batch_sizes[-1])}, but {bend:,} itself ran faster"
    return Candidate(bend, f"{why} {faster}")


def _bent_line(bend: int, measured: int) -> str:
    """Why nothing past the largest `measured` batch size is predicted: the probe at `bend` missed the line."""
    return (
        f"throughput at {bend:,} did not follow the run-time line (see the warnings), so nothing past {measured:,} is "
        "predicted"
    )


def beside_your_headline(recommendation: Recommendation, headline: Sample) -> Recommendation:
    """The recommendation, where its measured throughput also clears the noise above the user's
    batch size's headline (`headline`: timed alone, as the user's training runs); none where not.
    Compared with the user's batch size from its own rounds, a batch size can read faster while
    those rounds slowed the user's: the default example's 256 read 26 % faster than 128 beside it,
    at 61,351 samples/s, under a headline of 61,502 at 128 that the report printed above it."""
    rate = recommendation.samples_per_second
    chosen = recommendation.batch_size
    if chosen is None or rate is None or rate >= headline.samples_per_second * (1 + NOISE_FLOOR):
        return recommendation
    than_yours = compared(rate / headline.samples_per_second)
    return Recommendation.none(
        f"{chosen:,}, which the models suggest, ran {rate:,.0f} samples/s, {than_yours} "
        f"yours ({headline.batch_size:,}) timed alone ({headline.samples_per_second:,.0f} samples/s, as your training "
        f"runs it), though faster than yours timed beside it: a change must be at least {NOISE_FLOOR:.0%} faster than "
        "both to clear the noise"
    )


@dataclass(frozen=True)
class MallocStates:
    """The user's batch size timed alone (`alone`, as its training runs) and beside the other batch
    sizes (`beside`), where the two ran in different states of glibc's malloc (`malloc_states`)."""

    alone: Sample
    beside: Sample

    @property
    def slowdown(self) -> float:
        """How much longer an iteration took alone than beside the others."""
        return self.alone.run_time_ms / self.beside.run_time_ms

    @property
    def faults_slowdown(self) -> float:
        """The most of `slowdown` that the extra page faults alone can account for (MAX_FAULT_MS)."""
        extra = (self.alone.timing.page_faults or 0) - (self.beside.timing.page_faults or 0)
        return 1 + extra * MAX_FAULT_MS / self.beside.run_time_ms

    @property
    def malloc_slowdown(self) -> float:
        """How much faster the state beside the others made the user's batch size, as far as its
        page faults can account for it."""
        return min(self.slowdown, self.faults_slowdown)

    @property
    def shows(self) -> bool:
        """Whether the time shows the states apart, beyond the noise (the machine's drift between
        the two can hide it, or make more of it), and no further than the page faults account for:
        the CNN example's 32 once took 205 ms an iteration alone with 711 faults, 12.1 ms beside the
        others with none, its threads waiting for a core all along (a warning said so), not the
        allocator."""
        return 1 + NOISE_FLOOR <= self.slowdown <= self.faults_slowdown

    def effect(self) -> str:
        """What the state beside the others did to the user's batch size, as a reason quotes it."""
        if self.slowdown <= self.faults_slowdown:
            return f"which alone made yours run {self.slowdown - 1:.0%} faster"
        return (
            f"which can make yours run up to {self.faults_slowdown - 1:.0%} faster (the rest of the "
            f"{self.slowdown - 1:.0%} between the two times is more than its page faults account for)"
        )

    def told(self) -> str:
        """The two measurements, as a warning and a reason quote them."""
        return (
            f"yours ({self.alone.batch_size:,}) took {format_ms(self.alone.run_time_ms)} an iteration timed alone, as "
            f"your training runs it, with {_faults(self.alone)} page faults an iteration, and "
            f"{format_ms(self.beside.run_time_ms)} beside the other batch sizes, with {_faults(self.beside)}: once a "
            "larger batch size ran, glibc's malloc stopped handing memory back to the kernel"
        )

    def warning(self) -> str:
        told = self.told()
        return (
            f"{told[0].upper()}{told[1:]}, {self.effect()}. The other batch "
            "sizes were timed in that state, which their own training does not reach on glibc's defaults: their "
            "measured and predicted times can read faster than their training would run (the CNN example's 64, "
            "timed there, 18 % below plain loops in fresh processes); profile with --batch-size at one to time it "
            f"alone, as its training runs. Your training can run in that state: start it with {_settled()} in its "
            "environment (glibc's own settings; jemalloc or tcmalloc keep memory alike), and this analysis too, "
            "to time every batch size so."
        )


def _settled() -> str:
    """The environment settings that keep glibc from handing memory back, as a user writes them."""
    return " ".join(f"{name}={value}" for name, value in SETTLED_ENVIRONMENT.items())


def _faults(sample: Sample) -> str:
    return f"{sample.timing.page_faults or 0:,.0f}"


def malloc_states(headline: Sample, beside: Sample) -> MallocStates | None:
    """The user's batch size alone (`headline`) and beside the others (`beside`), where it took
    FAULTS_APART more minor page faults an iteration alone, and at least FAULTS_RATIO times as
    many; None otherwise, or where the faults were not counted. Once a larger batch size's blocks
    were freed, glibc's malloc keeps memory it would hand back to the kernel (measure/allocator.py),
    and every batch size timed after that runs faster than its own training does, a larger one not
    in proportion: the CNN example's 32 took 12.2 ms an iteration alone with 2,585 faults, 9.0 ms
    beside 16 and 64 with none."""
    alone, there = headline.timing.page_faults, beside.timing.page_faults
    if alone is None or there is None or alone - there < FAULTS_APART or alone < FAULTS_RATIO * there:
        return None
    return MallocStates(headline, beside)


def in_your_trainings_state(
    recommendation: Recommendation, states: MallocStates | None, timed: Sequence[Sample] = ()
) -> Recommendation:
    """The recommendation, unless it was measured in a state of glibc's malloc that the user's
    training does not reach (`states`, `malloc_states`) and nothing shows it faster in the state
    its own training would run in. Among `timed` (every measurement of the analysis), one of the
    recommended batch size that took at least the page faults an iteration the user's took alone
    ran in such a state (it was the largest run so far): it must then be faster than the user's
    alone by the noise. Without one, its gain over the user's beside it must clear by the noise what
    that state alone made the user's faster, as far as the page faults account for it
    (`MallocStates.malloc_slowdown`). One of 5 quiet analyses of the CNN example advised 64,
    33 % faster than 32 beside it with no faults, where its own-state time in the models' rounds
    (19.6 ms, 2,944 faults an iteration) was 1 % faster than 32 alone (9.8 ms, 751), and plain
    loops in fresh processes ran 64 10 % slower a sample than 32. The default example's 128 took
    3.6 ms alone with 434 faults, 2.8 ms beside with none, and 1,024 ran 58 % faster beside it
    (plain loops: 512 46 % faster a sample than 128): its advice stands."""
    chosen, rate = recommendation.batch_size, recommendation.samples_per_second
    if chosen is None or rate is None or states is None:
        return recommendation
    alone = states.alone
    beside_gain = rate / (recommendation.users_samples_per_second or states.beside.samples_per_second)
    least = alone.timing.page_faults or 0
    own = [s for s in timed if s.batch_size == chosen and (s.timing.page_faults or 0) >= least]
    if own:
        theirs = max(own, key=lambda s: s.timing.page_faults or 0)
        gain = theirs.samples_per_second / alone.samples_per_second
        if gain >= 1 + NOISE_FLOOR:
            return recommendation
        return Recommendation.none(
            f"{chosen:,}, which the models suggest, ran {beside_gain - 1:.0%} faster than "
            f"yours ({alone.batch_size:,}) beside it, but {states.told()}; timed where it took its own training's page "
            f"faults ({format_ms(theirs.run_time_ms)} an iteration, with {_faults(theirs)}), {chosen:,} ran "
            f"{compared(gain)} yours alone: a change must be at least {NOISE_FLOOR:.0%} faster to clear the noise; "
            f"profile with --batch-size {chosen} to time {chosen:,} as its training runs"
        )
    if beside_gain >= max(1.0, states.malloc_slowdown) * (1 + NOISE_FLOOR):
        return recommendation
    return Recommendation.none(
        f"{chosen:,}, which the models suggest, ran {beside_gain - 1:.0%} faster than yours ({alone.batch_size:,}) "
        f"beside it, but {states.told()}, {states.effect()}, and a gain that does not clear that by "
        f"{NOISE_FLOOR:.0%} may not hold in training; profile with --batch-size {chosen} to time {chosen:,} as its "
        "training runs"
    )


def compared(gain: float) -> str:
    """`only 4% faster than`, `no faster than`, `20% slower than`: a gain too small to act on (or
    `only 2.2× as fast as`, where the noise is more)."""
    if gain >= 2:
        return f"only {gain:.1f}× as fast as"
    if round(gain - 1, 2) > 0:
        return f"only {gain - 1:.0%} faster than"
    return "no faster than" if round(gain - 1, 2) == 0 else f"{1 - gain:.0%} slower than"


def _timed_together(
    batch_size: int, users: int, samples: Sequence[Sample], checks: Sequence[Sample]
) -> tuple[Sample, Sample] | None:
    """The measurements of `batch_size` and of the user's batch size from the same rounds: the
    checks', else the models' samples."""
    for timed in (checks, samples):
        found = {s.batch_size: s for s in timed}
        if batch_size in found and users in found:
            return found[batch_size], found[users]
    return None


def range_probe(models: BatchSizeModels, suggested: int | None, affordable: Callable[[int], bool]) -> int | None:
    """The batch size to time past the timed ones before the trusted range extends there: the
    suggested one where it lies there, else the range's end, lowered to what is predicted to fit
    and to the largest `affordable` (a predicted iteration within the timing budget); None where
    the range does not extend past the timed batch sizes, or no time is predicted."""
    largest_timed = models.measured_batch_sizes[-1]
    high = models.trusted_range[1]
    checked = models.line_bends_at or models.range_unprobed or models.range_probed_to
    if not models.time_predictable or checked or high <= largest_timed:
        return None
    if suggested is not None and largest_timed < suggested <= high and affordable(suggested):
        return suggested
    fits = models.max_batch_size()
    low, probe = largest_timed, high if fits is None else min(high, fits)
    if affordable(probe):
        return probe if probe > largest_timed else None
    while probe - low > 1:  # the largest affordable: predicted times grow with the batch size
        middle = (low + probe) // 2
        low, probe = (middle, probe) if affordable(middle) else (low, middle)
    return low if low > largest_timed else None


def line_miss(models: BatchSizeModels, yours: Sample, probe: Sample) -> float | None:
    """How far the `probe`'s throughput, timed beside the user's batch size (`yours`, from the same
    rounds), missed what the run-time line predicts relative to the user's measured throughput (the
    drift between the rounds cancels), where by more than the noise; None where it did not.
    Negative below the line (the time grows faster than a straight line past the timed batch
    sizes), positive above it (the line rises faster than the time: under two busy processes, a
    line through the CNN example's 36, 81 and 252 ms at 16, 32 and 64 samples put 82 samples at 2.7
    times the user's 32, which beside it took 2.1, and said 1,135 ms at 256, where plain loops take
    319). Above the line only where the probe's own throughput is above the line's too: beside a
    much larger batch size the user's runs slower than in the models' rounds (the transformer
    example's 16 took 28-33 ms beside 128, 24-25 beside 8 and 32), which reads as the probe above
    the line relative to it (all three quiet analyses of the transformer, whose 128 took 203 ms
    against the line's 197). Nothing makes the user's run faster beside the probe: below the
    line, the relative miss decides alone."""
    predicted = models.predict(probe.batch_size).samples_per_second
    before = _measured_rate(models, yours.batch_size)
    if predicted is None or not before:
        return None
    needed = noise(yours, probe)
    relative = (probe.samples_per_second / yours.samples_per_second) / (predicted / before) - 1
    if relative < -needed:
        return relative
    own = probe.samples_per_second / predicted - 1
    return min(relative, own) if relative > needed and own > needed else None


def range_checked(
    models: BatchSizeModels, yours: Sample, probe: Sample, timed: str = ""
) -> tuple[BatchSizeModels, str | None]:
    """The models once the `probe` past the timed batch sizes was timed beside the user's batch
    size (`yours`, from the same rounds), and the warning to give, if any: where the probe missed
    the run-time line (`line_miss`), the trusted range ends at the largest timed batch size
    (`line_bends_at`), and the warning says which way (`timed`: how the probe was timed, as
    `line_miss_note` takes it); where their times spread too much to tell (the noise above
    MAX_SPREAD: under two busy processes the default example's probe at 831 took 105 ms, the line
    said 330, and the noise was 93 %), it ends there too (`range_unprobed`), and a warning says
    so; else, where the probe lies short of the range's end (the largest the budget could time, or
    the suggestion), the range ends at the probe (`range_probed_to`)."""
    miss = line_miss(models, yours, probe)
    if miss is not None:
        cut = dataclasses.replace(models, line_bends_at=probe.batch_size)
        return cut, line_miss_note(probe.batch_size, miss, cut.trusted_range[1], timed)
    needed = noise(yours, probe)
    if needed > MAX_SPREAD:
        unchecked = dataclasses.replace(models, range_unprobed=True)
        return unchecked, (
            f"Batch size {probe.batch_size:,}{timed} could not check the run-time line: its time and yours spread "
            f"{needed:.0%} of their means, more than the {MAX_SPREAD:.0%} that tells a bend in the line from the "
            f"machine's load, so the trusted range ends at {unchecked.trusted_range[1]:,}, the largest timed; "
            "profile again on a quieter machine to check it."
        )
    if probe.batch_size < models.trusted_range[1]:
        return dataclasses.replace(models, range_probed_to=probe.batch_size), None
    return models, None


def line_miss_note(probe: int, miss: float, largest_timed: int, timed: str = "") -> str:
    """The warning where the probe at `probe` missed the run-time line by `miss` (`line_miss`), so
    the trusted range ends at `largest_timed`; `timed` says how the probe was timed (", timed
    beside yours,")."""
    if miss < 0:
        what = (
            f"ran {-miss:.0%} below the throughput the run-time line predicts there: iteration time grows faster "
            "than a straight line past the timed batch sizes"
        )
    else:
        what = (
            f"ran {miss:.0%} above the throughput the run-time line predicts there: the line rises faster than the "
            "time past the timed batch sizes (their times met a busy machine, or the time grows slower than a "
            "straight line)"
        )
    return (
        f"Batch size {probe:,}{timed} {what}, so the trusted range ends at {largest_timed:,}, the largest timed; "
        f"profile with --batch-size {probe} to fit the models around it."
    )


def comparisons_decided(
    models: BatchSizeModels,
    headline: Sample,
    suggested: int | None,
    probe: int | None,
    samples: Mapping[int, Sample],
    errors: Mapping[int, float],
) -> bool:
    """Whether the confirming rounds so far (`samples`, by batch size, the user's among them;
    `errors`, the relative standard error of each one's mean) decide the comparisons `recommend`
    and `line_miss` will make: the `suggested` batch size's throughput against the user's
    beside it and, where it clears that, against the user's `headline` (timed alone, a fixed
    figure by now), and the `probe`'s miss of the run-time line, either way. One left out of the rounds
    (it ran out of memory) has nothing to decide."""
    yours = samples.get(headline.batch_size)
    if yours is None:
        return False
    error_of = {b: math.hypot(errors[b], errors[headline.batch_size]) for b in samples}
    if suggested is not None and suggested in samples:
        theirs = samples[suggested]
        gain, needed = theirs.samples_per_second / yours.samples_per_second, 1 + noise(yours, theirs)
        over_headline = theirs.samples_per_second / headline.samples_per_second
        if not _decided(gain, needed, gain * error_of[suggested]):
            return False
        if gain > needed and not _decided(over_headline, 1 + NOISE_FLOOR, over_headline * errors[suggested]):
            return False
    if probe is not None and probe in samples:
        predicted = models.predict(probe).samples_per_second
        before = _measured_rate(models, headline.batch_size)
        if predicted and before:
            ratio = (samples[probe].samples_per_second / yours.samples_per_second) / (predicted / before)
            needed, error = noise(yours, samples[probe]), ratio * error_of[probe]
            if not (_decided(ratio - 1, -needed, error) and _decided(ratio - 1, needed, error)):
                return False
    return True


def _decided(estimate: float, threshold: float, standard_error: float) -> bool:
    """Whether `estimate` lies further than DECIDED_BY standard errors from `threshold`."""
    return abs(estimate - threshold) > DECIDED_BY * standard_error
