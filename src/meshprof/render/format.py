"""Number formatting for people, shared by every renderer (terminal, HTML, text reports).

Inputs are in the project's internal units: durations in nanoseconds, sizes in bytes, shares as
fractions (0.25 = 25 %), bandwidth in GB/s (1e9 bytes per second). A missing value (``None`` or
NaN) prints as ``"-"``. Nothing here computes a statistic; it only turns a number into text.
"""

from __future__ import annotations

import json
import math

__all__ = [
    "MISSING",
    "fmt_bytes",
    "fmt_delta_bytes",
    "fmt_delta_ns",
    "fmt_epoch_ns",
    "fmt_field",
    "fmt_gbps",
    "fmt_ms",
    "fmt_nested",
    "fmt_ns",
    "fmt_pct",
    "fmt_signed_pct",
    "is_missing",
    "ratio_color",
    "sort_value",
]

MISSING = "-"
"""What a missing value (None or NaN) prints as."""


def is_missing(x: float | int | None) -> bool:
    """True for None and NaN."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_ns(ns: float | int | None) -> str:
    """A duration in ns for people: ns, µs, ms or s, negative ones with a leading ``-``
    (``"-"`` when missing)."""
    if ns is None or is_missing(ns):
        return MISSING
    if ns < 0:
        return "-" + fmt_ns(-ns)
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_delta_ns(ns: float | int | None) -> str:
    """A signed duration in ns for people (a difference: ``+2.00 ms``, ``-15.0 µs``, ``+0 ns``;
    ``"-"`` when missing)."""
    if ns is None or is_missing(ns):
        return MISSING
    return ("-" if ns < 0 else "+") + fmt_ns(abs(ns))


def fmt_delta_bytes(n: float | int | None) -> str:
    """A signed size in bytes with binary units (``+512.0 MiB``; ``"-"`` when missing)."""
    if n is None or is_missing(n):
        return MISSING
    return ("-" if n < 0 else "+") + fmt_bytes(abs(n))


def fmt_ms(ns: float | int, digits: int = 2, signed: bool = False) -> str:
    """A duration in ns shown in milliseconds with fixed decimals, e.g. ``+0.064 ms``."""
    sign = "+" if signed else ""
    return f"{ns / 1e6:{sign}.{digits}f} ms"


def fmt_bytes(n: float | int) -> str:
    """A size in bytes with binary units (KiB, MiB, GiB), negative ones with a leading ``-``."""
    if n < 0:
        return "-" + fmt_bytes(-n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


#: A value of a ``*_ns`` field at or above this is a point in time (ns since the epoch: 1e17 ns
#: is 1973), not a duration (3.2 years).
EPOCH_NS_FROM = 10**17


def fmt_epoch_ns(ns: int | float) -> str:
    """A wall-clock time in ns since the epoch as UTC, to the millisecond
    (``2026-11-28 05:08:50.123 UTC``)."""
    import datetime as _dt

    t = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"


def fmt_field(key: str, value: object) -> str | None:
    """A value of a record field named ``key`` for people, from the project's naming
    conventions: ``*_ns`` a duration (a point in time from :data:`EPOCH_NS_FROM` on),
    ``*_bytes`` a size, ``share``/``score``/``imbalance``/``pct`` a fraction. None when the
    name says nothing about the unit (the caller prints the value as it is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if key.endswith("_ns"):
        return fmt_epoch_ns(value) if value >= EPOCH_NS_FROM else fmt_ns(value)
    if key.endswith("_bytes"):
        return MISSING if is_missing(value) else fmt_bytes(value)
    if any(w in key for w in ("share", "score", "imbalance", "pct")) and isinstance(value, float):
        return fmt_pct(value)
    return None


def fmt_nested(value: object, key: str = "", limit: int = 300) -> str:
    """A value of metadata (numbers, strings, lists, dicts, nested) as one line for people:
    each number by its field's name (:func:`fmt_field`), at most ``limit`` characters."""

    def one(k: str, v: object) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{kk}: {one(str(kk), vv)}" for kk, vv in v.items()) + "}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(one(k, vv) for vv in v) + "]"
        txt = fmt_field(k, v)
        if txt is not None:
            return txt
        return json.dumps(v, default=str)

    out = one(key, value)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def fmt_pct(x: float | int | None, digits: int = 1) -> str:
    """A fraction as a percentage (0.253 → ``25.3%``; ``"-"`` when missing)."""
    if x is None or is_missing(x):
        return MISSING
    return f"{x:.{digits}%}"


def fmt_signed_pct(x: float, digits: int = 1) -> str:
    """A fraction as a signed percentage (0.06 → ``+6.0%``)."""
    return f"{x:+.{digits}%}"


def fmt_rate(x: float | int | None) -> str:
    """A rate per second, three significant digits (``"-"`` when missing)."""
    if x is None or is_missing(x):
        return MISSING
    return f"{x:.3g}/s"


def fmt_gbps(x: float) -> str:
    """A bandwidth in GB/s (1e9 bytes per second), three decimals."""
    return f"{x:.3f}"


def sort_value(x: float | int | None) -> str:
    """A number as a short machine-readable string (for sort keys); empty when not finite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return f"{x:.6g}"


def ratio_color(ratio: float) -> str:
    """A CSS colour for a ratio: white at 0, red at 1 (clipped to [0, 1]; grey for NaN)."""
    if math.isnan(ratio):
        return "#eeeeee"
    r = min(max(ratio, 0.0), 1.0)
    return f"rgb(255,{int(255 - 175 * r)},{int(255 - 200 * r)})"
