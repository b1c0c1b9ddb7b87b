"""CPU timing that does not depend on which batch sizes ran before: glibc malloc's thresholds, pinned.

glibc adapts two thresholds while a process runs. A block above the mmap threshold gets fresh pages
from the kernel on every allocation (and faults them in); free memory above the trim threshold at
the top of the heap is handed back to the kernel, to be faulted in again by the next iteration.
Both thresholds grow with the largest block freed so far, so an iteration's time depends on what
the process ran before. Measured on the CNN example (2 cores): batch size 32 took 7.1 ms in a fresh
process, 8.8 ms after batch size 16 and 6.6 ms after 96; batch size 48 took 12.6 ms fresh against
9 ms on the line through its neighbours. A probe order therefore bent the batch-size models by up
to 30 %. Pinned (mmap threshold 32 MiB, the most glibc allows; trim threshold 256 MiB), every order
and a fresh process agree within noise, and the times are linear in the batch size.

The pinned allocator is also the faster one (the CNN at batch size 48: 8.9 ms against 12.6 ms), so
a training process on default glibc can run slower than measured; PyTorch's CPU performance guide
recommends jemalloc or tcmalloc for the same reason. Tensor memory figures are unaffected: they
count tensor storage, not the process's pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt parameters, from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 256 << 20
# The same two thresholds set for a whole process from its environment, which glibc reads as it
# starts: what a user's training can run with (the warning of two malloc states proposes it).
SETTLED_ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES),
}


@functools.cache
def pin_malloc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (once); False where the C library is
    not glibc (macOS, musl), whose allocators have no such thresholds to pin."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        if not hasattr(libc, "gnu_get_libc_version"):  # only glibc has it
            return None
    except (OSError, AttributeError):
        return None
    return libc
