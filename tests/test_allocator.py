"""glibc's malloc thresholds are pinned for measuring: a block glibc would otherwise map from the
kernel on every allocation comes from the heap. Checked in a fresh process (the thresholds are
process state) through glibc's own accounting (mallinfo2: bytes in mmapped blocks)."""

import subprocess
import sys

import pytest

from skyline_engine.measure.allocator import _glibc

pytestmark = pytest.mark.slow  # a subprocess with glibc's malloc settled

SCRIPT = r"""
import ctypes
import torch
from skyline_engine.measure.allocator import pin_malloc_thresholds

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

# Freeing the 8 MiB block raises glibc's own threshold to 8 MiB; a 24 MiB block stays above it
# unless the thresholds are pinned (at 32 MiB).
print(mapped_while_alive(8 << 20), pin_malloc_thresholds(), mapped_while_alive(24 << 20))
"""


@pytest.mark.skipif(_glibc() is None, reason="the C library is not glibc")
def test_a_block_glibc_would_map_comes_from_the_heap_once_pinned():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    # Fresh process: glibc maps an 8 MiB block (its threshold starts at 128 KiB and grows to the
    # largest block freed); pinned, a larger one comes from the heap.
    assert out.split() == ["True", "True", "False"], out
