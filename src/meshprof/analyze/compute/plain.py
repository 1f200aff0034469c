"""Dataclass results as plain dicts, fast: what ``clean(dataclasses.asdict(x))`` gives (NaN
floats in dicts and lists become None), without ``asdict``'s deep copy of every leaf (at 4,096
ranks the per-rank step analyses' ``to_dict`` took longer than the analyses' cross-rank part)."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

_ATOMS = (int, float, str, bool, type(None))
_EXACT_ATOMS = frozenset(_ATOMS)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _names(t: type) -> tuple[str, ...]:
    got = _FIELDS.get(t)
    if got is None:
        got = _FIELDS[t] = tuple(f.name for f in dataclasses.fields(t))
    return got


def _asdict(o: Any) -> Any:
    """``dataclasses.asdict`` for a dataclass instance (and what it recurses into)."""
    t = type(o)
    if t in _EXACT_ATOMS or isinstance(o, _ATOMS):
        return o
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {n: _asdict(getattr(o, n)) for n in _names(t)}
    if isinstance(o, list):
        return [_asdict(v) for v in o]
    if isinstance(o, tuple):
        if hasattr(o, "_fields"):  # namedtuple
            return t(*[_asdict(v) for v in o])
        return t(_asdict(v) for v in o)
    if isinstance(o, dict):
        return t((_asdict(k), _asdict(v)) for k, v in o.items())
    return copy.deepcopy(o)


def _clean(x: Any) -> Any:
    t = type(x)
    if t is float:
        return None if math.isnan(x) else x
    if t is int or t is str or t is bool or x is None:
        return x
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def plain_dict(o: Any) -> dict[str, Any]:
    """``clean(dataclasses.asdict(o))`` (the step analysis's ``to_dict``), faster."""
    out: dict[str, Any] = _clean(_asdict(o))
    return out
