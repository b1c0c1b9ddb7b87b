"""What the engine may change in the runtime of the program it measures: nothing, unless asked.

A number the user reads must be one their own training reproduces, so by default the user's
program is measured as it runs: OpenMP waits as it was told, glibc's malloc adapts its thresholds
as it does in a training run. Two settings make measuring steadier, and `--settle-runtime` turns
both on, each then stated in the document (`runtime_changes`) and in a warning:

- OpenMP's waiting. PyTorch's CPU kernels run on OpenMP threads (libgomp on Linux), which spin at
  every barrier before they sleep. With other processes on the cores, a spinning thread holds a
  core that the thread it waits for needs: on the CNN example under two busy processes on 2 cores,
  about half of the fresh processes settled into 490 ms an iteration instead of 25-85 ms. A shorter
  spin (GOMP_SPINCOUNT=10000) removed that state; on a quiet machine it was the same within noise
  for some models and up to 16 % slower for others (the transformer example: 40.1 against 46.6 ms,
  plain loops in fresh processes), and with one busy process a training step of Adam's took 36 ms
  with it against 1.9 ms without. libgomp reads its settings when it is loaded, so the environment
  changes before torch is imported; a setting of the user's own is left alone.
- glibc malloc's thresholds (measure/allocator.py): pinned, an iteration's time no longer depends
  on which batch sizes ran before in the process, and small CPU models run faster than on the
  default thresholds a training process has.

The request to settle travels in the environment (SETTLE_RUNTIME), so that the service's workers
and the ranks of data-parallel training settle as the process that asked.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from skyline_engine.measure.import_ahead import IMPORTED_AHEAD, imported_ahead

SETTLE_RUNTIME = "SKYLINE_SETTLE_RUNTIME"  # its value: the variables the engine set, comma-separated
SPINCOUNT = "10000"


def settle_runtime(environ: MutableMapping[str, str]) -> None:
    """Asked for (--settle-runtime): OpenMP's spin shortened where the user set no OpenMP waiting
    of their own, and the request marked for the analysis. Before torch is imported."""
    changed = []
    if "GOMP_SPINCOUNT" not in environ and "OMP_WAIT_POLICY" not in environ:
        environ["GOMP_SPINCOUNT"] = SPINCOUNT
        changed.append("GOMP_SPINCOUNT")
    environ.setdefault(SETTLE_RUNTIME, ",".join(changed))


def asked_to_settle(environ: Mapping[str, str]) -> bool:
    return SETTLE_RUNTIME in environ


def runtime_changes(environ: Mapping[str, str], malloc_pinned: bool) -> list[str]:
    """What the engine changed in this process's runtime: the document's `runtime_changes`."""
    changes = []
    if "GOMP_SPINCOUNT" in environ.get(SETTLE_RUNTIME, "").split(","):
        changes.append(f"GOMP_SPINCOUNT={environ.get('GOMP_SPINCOUNT', SPINCOUNT)}")
    if malloc_pinned:
        changes.append("glibc malloc thresholds pinned (M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 256 MiB)")
    ahead = imported_ahead()  # the service's warm worker (measure/import_ahead.py)
    if ahead is not None:
        changes.append(ahead)
    return changes


def runtime_note(changes: list[str]) -> str | None:
    """The warning that says what was changed, and what it does to the times; None when nothing."""
    settled = [change for change in changes if not change.startswith(IMPORTED_AHEAD)]
    ahead = [change for change in changes if change.startswith(IMPORTED_AHEAD)]
    notes = []
    if settled:
        notes.append(
            f"Measured with the runtime settled (--settle-runtime): {'; '.join(settled)}. Your training runs without "
            "these unless you set them: on a busy machine its iterations can take far longer than measured here, "
            "and small CPU models up to 30 % longer on the default malloc thresholds."
        )
    if ahead:
        notes.append(
            f"{ahead[0][0].upper()}{ahead[0][1:]}. The times are unchanged; a library that reads the environment "
            "when imported saw the service's (code that changes os.environ turns this off for the next analysis)."
        )
    return " ".join(notes) or None
