"""glibc's malloc thresholds are pinned for measuring: a block glibc would otherwise map from the
kernel on every allocation comes from the heap. Checked in a fresh process (the thresholds are
process state) through glibc's own accounting (mallinfo2: bytes in mmapped blocks)."""

import subprocess
import sys

import pytest

from skyline_engine.measure.allocator import _glibc

SCRIPT = r"""
import ctypes
import torch
from skyline_engine.measure.allocator import pin_malloc_thresholds

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def mapped_while_alive():
    before = libc.mallinfo2().hblkhd
    block = torch.empty(4 << 20, dtype=torch.uint8)
    return libc.mallinfo2().hblkhd - before

print(mapped_while_alive() >= 4 << 20, pin_malloc_thresholds(), mapped_while_alive() >= 4 << 20)
"""


@pytest.mark.skipif(_glibc() is None, reason="the C library is not glibc")
def test_a_4_mib_block_comes_from_the_heap_once_pinned():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    # Fresh process: glibc maps a 4 MiB block (default threshold 128 KiB); pinned: it does not.
    assert out.split() == ["True", "True", "False"], out
