"""OpenMP's waiting, settled for measuring on a shared machine.

PyTorch's CPU kernels run on OpenMP threads (libgomp on Linux), which spin at every barrier before
they sleep. With other processes on the cores, a spinning thread holds a core that the thread it
waits for needs: measured on the CNN example under two busy processes on 2 cores, about half of
the fresh processes settled into 490 ms an iteration instead of 25-85 ms, for as long as they ran.
A shorter spin (GOMP_SPINCOUNT=10000) removed that state in every run tried, and left a quiet
machine's times unchanged within noise (the default example: 6.4, 5.7, 6.1, 5.7 ms against 6.2,
7.5, 7.3, 5.0 ms with the default spin, processes interleaved). OMP_WAIT_POLICY=PASSIVE removes
it too, but made quiet iterations 10-20 % slower.

libgomp reads its settings when it is loaded: `settle_openmp` must change the environment before
torch is imported. A setting of the user's own is left alone.
"""

from __future__ import annotations

from collections.abc import MutableMapping

SPINCOUNT = "10000"


def settle_openmp(environ: MutableMapping[str, str]) -> None:
    if "GOMP_SPINCOUNT" not in environ and "OMP_WAIT_POLICY" not in environ:
        environ["GOMP_SPINCOUNT"] = SPINCOUNT
