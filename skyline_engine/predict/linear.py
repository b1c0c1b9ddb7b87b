"""Least-squares straight lines, with their goodness of fit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LinearModel:
    """y = slope * x + bias, fitted to `points` samples.

    `r2` is the coefficient of determination; it is None when there are too few points to judge
    the fit (a line through two points always fits them exactly).
    `max_relative_residual` is the largest |measured - fitted| / measured over the samples.
    """

    slope: float
    bias: float
    r2: float | None
    max_relative_residual: float
    points: int

    def __call__(self, x: float) -> float:
        return self.slope * x + self.bias

    def inverse(self, y: float) -> float | None:
        """The x where the line reaches y, or None for a flat line."""
        if self.slope == 0:
            return None
        return (y - self.bias) / self.slope

    def to_dict(self) -> dict[str, Any]:
        return {
            "slope": self.slope,
            "bias": self.bias,
            "r2": self.r2,
            "max_relative_residual": self.max_relative_residual,
            "points": self.points,
        }


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> LinearModel:
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if len(x) < 2 or len(np.unique(x)) < 2:
        raise ValueError("a line needs at least two distinct x values")
    if np.all(y == y[0]):
        # Identical measurements: exactly flat. Least squares leaves float dust there (see
        # predict/peak_memory.py: a largest batch size that fits of 3.7e19).
        slope, bias = 0.0, float(y[0])
    else:
        design = np.stack([x, np.ones_like(x)], axis=1)
        (slope, bias), *_ = np.linalg.lstsq(design, y, rcond=None)
    fitted = slope * x + bias
    residual = y - fitted
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.where(y != 0, np.abs(residual) / np.abs(y), 0.0)
    return LinearModel(
        slope=float(slope),
        bias=float(bias),
        r2=_r2(y, residual) if len(x) >= 3 else None,
        max_relative_residual=float(relative.max()),
        points=len(x),
    )


def _r2(y: np.ndarray, residual: np.ndarray) -> float:
    total = float(np.sum((y - y.mean()) ** 2))
    unexplained = float(np.sum(residual**2))
    if total == 0.0:
        # Every sample measured the same value: a flat line explains it fully when it fits.
        return 1.0 if unexplained == 0.0 else 0.0
    return 1.0 - unexplained / total
