"""Argument types and options shared by the commands, with messages that say what is wrong."""

from __future__ import annotations

import argparse
import re
from typing import Callable

DEVICE_HELP = "auto (default: CUDA when available), cpu, cuda or cuda:N"
SETTLE_RUNTIME_HELP = (
    "measure with OpenMP's spin shortened (GOMP_SPINCOUNT=10000) and glibc's malloc thresholds pinned: steadier "
    "times on a busy machine, but not your training's (the report says so); default: your program as it runs"
)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])(iB|B)?|B)?\s*$", re.IGNORECASE)


def positive_int(what: str) -> Callable[[str], int]:
    """An argument type: an integer above 0, `what` naming it in the message."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be positive, not {value}")
        return value

    return parse


def positive_float(what: str) -> Callable[[str], float]:
    """An argument type: a number above 0, `what` naming it in the message."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{what} must be positive, not {text}")
        return value

    return parse


def parse_size(text: str) -> int:
    """A size in bytes: `1073741824`, binary `512MiB`, `24GiB` (also `8G`, `512M`), or decimal
    `80GB`, `500MB` (powers of 1000, as disks and some GPU data sheets count)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 24GiB, 80GB or 512M")
    number, prefix, suffix = float(match.group(1)), (match.group(2) or "").upper(), (match.group(3) or "").lower()
    base = 1000 if suffix == "b" else 1024
    size = int(number * base ** " KMGT".index(prefix or " "))
    if size <= 0:
        raise argparse.ArgumentTypeError("the size must be positive")
    return size
