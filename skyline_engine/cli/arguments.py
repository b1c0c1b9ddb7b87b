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

MAX_SIZE = 2**60  # 1 EiB: more than any device or machine has
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])(iB|B)?|B)?\s*$", re.IGNORECASE)


def positive_int(what: str, at_most: int = 2**31 - 1) -> Callable[[str], int]:
    """An argument type: an integer from 1 to `at_most`, `what` naming it in the message."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be positive, not {value}")
        if value > at_most:
            raise argparse.ArgumentTypeError(f"{what} must be at most {at_most:,}, not {text}")
        return value

    return parse


def positive_float(what: str, at_least: float = 0.0, at_most: float = 1e6) -> Callable[[str], float]:
    """An argument type: a finite number above 0, from `at_least` to `at_most` (an infinite or a
    300-digit value is refused here, not after a whole analysis), `what` naming it."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{what} must be positive, not {text}")
        if not at_least <= value <= at_most:
            raise argparse.ArgumentTypeError(f"{what} must be from {at_least:g} to {at_most:g}, not {text}")
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
    scaled = number * base ** " KMGT".index(prefix or " ")
    if scaled > MAX_SIZE:  # also a 400-digit number, which float() reads as infinity
        raise argparse.ArgumentTypeError(f"{text!r} is more than 1 EiB")
    size = int(scaled)
    if size <= 0:
        raise argparse.ArgumentTypeError("the size must be positive")
    return size
