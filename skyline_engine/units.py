"""Human-readable numbers, for reports and for the warnings the analysis writes."""

from __future__ import annotations


def format_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.2f} ms"


def format_rate(samples_per_second: float | None, unit: str = "/s") -> str:
    if samples_per_second is None:
        return "—"
    if samples_per_second >= 100:
        return f"{samples_per_second:,.0f}{unit}"
    return f"{samples_per_second:.1f}{unit}"


def bar(fraction: float, width: int = 30) -> str:
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    if fraction > 0 and filled == 0:
        filled = 1
    return "█" * filled + "░" * (width - filled)
