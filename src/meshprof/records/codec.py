"""The one codec between meshprof's typed values and JSON.

:func:`to_json` turns a value into JSON-ready data (what ``json.dumps`` takes), by its type:

* a dataclass: an object of its fields in declaration order, each under its name, except the
  fields whose metadata is :data:`NOT_IN_JSON` (left out) or :func:`json_key` (written under
  another key);
  a dataclass that defines ``to_dict()`` is written as what that returns (the type's own JSON
  form, e.g. a flattened view or a fast path for a type with thousands of instances);
* ``None``, ``bool``, ``int``, ``str`` as they are; a ``float`` as itself, NaN and ±inf as null;
* tuples and lists as arrays, dicts as objects with string keys, numpy arrays as (nested)
  arrays, numpy scalars as numbers, enums as their value, paths as strings, anything else as
  ``str(value)``.

:func:`from_json` builds a typed value back from JSON data by the type's annotations
(dataclasses with their fields' types, ``X | None``, tuples, lists, dicts, enums, numbers,
strings), so a record read from a file or another process is checked once, at the edge: a value
of the wrong type raises :class:`RecordError`, which names the place (``meta.writer.writes:
expected int, got "3"``). Unknown keys are ignored and missing keys take the field's default.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any, ClassVar, TypeVar

import numpy as np

from meshprof.errors import MeshprofError

T = TypeVar("T")

_SKIP = "meshprof_json_skip"
_NAME = "meshprof_json_name"


class RecordError(MeshprofError):
    """JSON data that does not fit the record type it is read as."""


NOT_IN_JSON: Mapping[str, Any] = types.MappingProxyType({_SKIP: True})
"""Field metadata: :func:`to_json` leaves the field out (large arrays the JSON does not carry,
say): ``x: np.ndarray = field(metadata=NOT_IN_JSON)``."""


def json_key(name: str) -> Mapping[str, Any]:
    """Field metadata: :func:`to_json` writes the field under the key ``name`` (and
    :func:`from_json` reads it from there): ``field(metadata=json_key("named"))``."""
    return types.MappingProxyType({_NAME: name})


_PLANS: dict[type, tuple[tuple[str, str], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, str], ...]:
    """(attribute, JSON key) of the fields :func:`to_json` writes, cached per type."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = tuple(
            (f.name, str(f.metadata.get(_NAME, f.name)))
            for f in dataclasses.fields(cls)
            if not f.metadata.get(_SKIP)
        )
        _PLANS[cls] = plan
    return plan


def to_json(value: Any) -> Any:
    """``value`` as JSON-ready data (see the module docstring)."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is float:
        return value if math.isfinite(value) else None
    if t is list or t is tuple:
        return [to_json(v) for v in value]
    if t is dict:
        return {k if type(k) is str else str(k): to_json(v) for k, v in value.items()}
    writer = _WRITERS.get(t)
    if writer is None:
        writer = _WRITERS[t] = _writer_for(t)
    return writer(value)


_WRITERS: dict[type, Callable[[Any], Any]] = {}


def _writer_for(t: type) -> Callable[[Any], Any]:
    """How :func:`to_json` writes a value of type ``t`` beyond the built-in containers and
    scalars (decided once per type: a report of 100,000 ranks writes millions of values)."""
    if dataclasses.is_dataclass(t) and not issubclass(t, type):
        if getattr(t, "to_dict", None) is not None:
            return lambda v: to_json(v.to_dict())
        plan = _plan(t)
        return lambda v: {key: to_json(getattr(v, attr)) for attr, key in plan}
    if issubclass(t, enum.Enum):
        return lambda v: to_json(v.value)
    if getattr(t, "to_json_data", None) is not None:  # a value type that writes itself (Members)
        return lambda v: to_json(v.to_json_data())
    return _to_json_other


def _to_json_other(value: Any) -> Any:
    """:func:`to_json` of a value that is no dataclass, enum or self-writing type."""
    if isinstance(value, np.ndarray):
        return to_json(value.tolist())
    if isinstance(value, np.floating | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    return str(value)


def dataclass_to_json(value: Any) -> dict[str, Any]:
    """A dataclass instance as the JSON object of its fields (the rule of :func:`to_json`, also
    for a type that defines ``to_dict`` and builds it from this)."""
    return {key: to_json(getattr(value, attr)) for attr, key in _plan(type(value))}


def from_json(cls: type[T], data: Any, where: str = "") -> T:
    """A ``cls`` built from JSON ``data``; :class:`RecordError` names what does not fit."""
    return typing.cast(T, _decode(cls, data, where or getattr(cls, "__name__", "value")))


_R = TypeVar("_R", bound="CodedRecord")


class CodedRecord:
    """A dataclass record's ``to_dict`` and ``from_dict`` by the codec's rule
    (:func:`dataclass_to_json`, :func:`from_json`), for a record that needs nothing else;
    ``JSON_WHAT`` names it in a :class:`RecordError`."""

    __slots__ = ()
    JSON_WHAT: ClassVar[str] = "record"

    def to_dict(self) -> dict[str, Any]:
        """The record as its JSON object."""
        return dataclass_to_json(self)

    @classmethod
    def from_dict(cls: type[_R], d: dict[str, Any]) -> _R:
        """The record read from its JSON object (:class:`RecordError` when it does not fit)."""
        return from_json(cls, d, cls.JSON_WHAT)


_HINTS: dict[type, dict[str, Any]] = {}


def type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, computed once per class."""
    got = _HINTS.get(cls)
    if got is None:
        got = _HINTS[cls] = typing.get_type_hints(cls)
    return got


def decode(tp: Any, data: Any, where: str) -> Any:
    """JSON ``data`` as a value of the type ``tp`` (an annotation: ``int``, ``list[str]``,
    ``X | None``, a dataclass, ...); :class:`RecordError` names ``where`` it does not fit."""
    return _decode(tp, data, where)


def _describe(data: Any) -> str:
    text = repr(data)
    return text if len(text) <= 40 else text[:37] + "..."


_SHAPES: dict[Any, tuple[Any, tuple[Any, ...]]] = {}


def _shape(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """``typing.get_origin(tp), typing.get_args(tp)``, cached per annotation (a run's 100,000
    rank metas decode the same few hundred annotations)."""
    try:
        got = _SHAPES.get(tp)
    except TypeError:  # (an unhashable annotation)
        return typing.get_origin(tp), typing.get_args(tp)
    if got is None:
        got = _SHAPES[tp] = (typing.get_origin(tp), typing.get_args(tp))
    return got


def _decode(tp: Any, data: Any, where: str) -> Any:
    if tp is Any or tp is object:
        return data
    origin, targs = _shape(tp)
    if origin is typing.Union or origin is types.UnionType:
        options = targs
        if data is None and type(None) in options:
            return None
        kind = type(data)
        if (kind is int or kind is str or kind is bool or kind is float) and kind in options:
            return data  # (``int | None`` and the like: most of a rank meta's keys)
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode(option, data, where)
            except RecordError as e:
                errors.append(str(e))
        raise RecordError(
            errors[0] if len(errors) == 1 else f"{where}: {_describe(data)} fits none of {tp}"
        )
    if origin is typing.Literal:
        if data in targs:
            return data
        raise RecordError(f"{where}: expected one of {targs}, got {_describe(data)}")
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple):
        if not isinstance(data, list | tuple):
            raise RecordError(f"{where}: expected an array, got {_describe(data)}")
        args = targs
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(data):
                raise RecordError(f"{where}: expected {len(args)} items, got {len(data)}")
            return tuple(
                _decode(a, v, f"{where}[{i}]")
                for i, (a, v) in enumerate(zip(args, data, strict=True))
            )
        item = args[0] if args else Any
        if (origin or tp) is list and isinstance(data, list) and _all_exactly(data, item):
            return data  # kept, not copied: the loader shares long member lists across ranks
        items = [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return (origin or tp)(items) if (origin or tp) is not list else items
    if origin is dict or tp is dict or origin is Mapping:
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object, got {_describe(data)}")
        args = targs
        kt, vt = args if args else (Any, Any)
        return {
            _decode(kt, k, f"{where}.{k}"): _decode(vt, v, f"{where}.{k}") for k, v in data.items()
        }
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            if isinstance(data, tp):  # already the value (built in code, not read)
                return data
            own = getattr(tp, "from_json_data", None)
            if own is not None:  # a record that reads itself (keeps unknown keys, say)
                return own(data, where)
            return _decode_dataclass(tp, data, where)
        if issubclass(tp, enum.Enum):
            try:
                return tp(data)
            except ValueError:
                names = ", ".join(str(m.value) for m in tp)
                raise RecordError(
                    f"{where}: expected one of {names}, got {_describe(data)}"
                ) from None
        if tp is float:
            if isinstance(data, int | float) and not isinstance(data, bool):
                return float(data)
            if data is None:
                return math.nan
        elif tp is int:
            if isinstance(data, int) and not isinstance(data, bool):
                return data
            if isinstance(data, float) and data.is_integer():  # 1e9 written as a float
                return int(data)
        elif tp is bool or tp is str:
            if isinstance(data, tp):
                return data
        elif isinstance(data, tp):
            return data
        elif hasattr(tp, "from_json_data"):  # a value type that reads itself (``Members``)
            return tp.from_json_data(data, where)
        raise RecordError(f"{where}: expected {tp.__name__}, got {_describe(data)}")
    return data


_AS_IS: dict[Any, frozenset[type]] = {}
_SCALARS = (int, str, bool, float, type(None))


def as_is_types(tp: Any) -> frozenset[type]:
    """The exact types of JSON data that :func:`decode` returns unchanged as a ``tp``: ``int``,
    ``str``, ``bool`` for themselves, ``float`` for ``float`` (an int is converted, a null made
    NaN), and a union's scalar members (``int | None``: int and NoneType); empty for anything
    else. A record reader can take such a value without a call (cached per annotation)."""
    got = _AS_IS.get(tp)
    if got is None:
        origin, targs = _shape(tp)
        if origin is typing.Union or origin is types.UnionType:
            opts = frozenset(targs)
            got = opts if opts <= frozenset(_SCALARS) else frozenset()
        elif tp in _SCALARS[:4]:
            got = frozenset((tp,))
        else:
            got = frozenset()
        _AS_IS[tp] = got
    return got


def _all_exactly(data: list[Any], item: Any) -> bool:
    """Every element of ``data`` is already of the primitive type ``item`` (or ``item`` is Any)."""
    if item is Any:
        return True
    if item in (int, str, bool):
        return all(type(v) is item for v in data)
    return False


def _decode_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object, got {_describe(data)}")
    hints = type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = str(f.metadata.get(_NAME, f.name))
        if key in data:
            kwargs[f.name] = _decode(hints[f.name], data[key], f"{where}.{key}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"{where}: the key {key!r} is missing")
    return cls(**kwargs)


__all__ = [
    "NOT_IN_JSON",
    "CodedRecord",
    "RecordError",
    "dataclass_to_json",
    "decode",
    "from_json",
    "json_key",
    "to_json",
    "type_hints",
]
