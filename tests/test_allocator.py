"""glibc's malloc thresholds are pinned for measuring: a block glibc would otherwise map from the
kernel on every allocation comes from the heap. Checked in a fresh process (the thresholds are
process state) through glibc's own accounting (mallinfo2: bytes in mmapped blocks). The settings
the engine's warning of two malloc states proposes for a user's training (SETTLED_ENVIRONMENT) do
the same from a process's start, and keep freed memory: touching it again takes no page faults."""

import os
import subprocess
import sys

import pytest

from skyline_engine.measure.allocator import SETTLED_ENVIRONMENT, _glibc

pytestmark = pytest.mark.slow  # a subprocess with glibc's malloc settled

MALLINFO = r"""
import ctypes
import resource
import torch

class MallInfo2(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 - ctypes reads the class attribute
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
        + ("uordblks", "fordblks", "keepcost")
    ]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def mapped_while_alive(size):
    before = libc.mallinfo2().hblkhd
    block = torch.empty(size, dtype=torch.uint8)
    return libc.mallinfo2().hblkhd - before >= size

libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def faults_to_touch(size, count):
    # glibc's malloc itself: a tensor's aligned allocation may not fit the block its last one freed.
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(count)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""

SCRIPT = (
    MALLINFO
    + r"""
from skyline_engine.measure.allocator import pin_malloc_thresholds

# Freeing the 8 MiB block raises glibc's own threshold to 8 MiB; a 24 MiB block stays above it
# unless the thresholds are pinned (at 32 MiB).
print(mapped_while_alive(8 << 20), pin_malloc_thresholds(), mapped_while_alive(24 << 20))
"""
)


@pytest.mark.skipif(_glibc() is None, reason="the C library is not glibc")
def test_a_block_glibc_would_map_comes_from_the_heap_once_pinned():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    # Fresh process: glibc maps an 8 MiB block (its threshold starts at 128 KiB and grows to the
    # largest block freed); pinned, a larger one comes from the heap.
    assert out.split() == ["True", "True", "False"], out


KEPT_SCRIPT = (
    MALLINFO
    + r"""
mapped = mapped_while_alive(8 << 20)
faults_to_touch(24 << 20, 1)  # on the defaults: mapped, and freed, glibc's thresholds rise to it
first = faults_to_touch(24 << 20, 3)
print(mapped, faults_to_touch(24 << 20, 3) < first // 10)
"""
)


@pytest.mark.skipif(_glibc() is None, reason="the C library is not glibc")
def test_the_settings_proposed_for_your_training_keep_memory_from_its_start():
    def kept(environment: dict[str, str]) -> list[str]:
        run = subprocess.run(
            [sys.executable, "-c", KEPT_SCRIPT], env=environment, capture_output=True, text=True, check=False
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.split()

    # On glibc's defaults, a fresh process maps an 8 MiB block from the kernel, and 72 MiB freed at
    # the top of the heap go back to it (above twice the largest block freed so far, its trim
    # threshold): touching as much again faults every page in again. Started with the settings,
    # the block comes from the heap, and the freed memory stays in the process (a tenth of the
    # faults or fewer the second time).
    assert kept(dict(os.environ)) == ["True", "False"]
    assert kept({**os.environ, **SETTLED_ENVIRONMENT}) == ["False", "True"]
