"""A JSON object with typed known keys that loses nothing it does not know.

Files written by one meshprof version are read by others: a record keeps every key it does not
know in :attr:`JsonRecord.extra` and the order keys were read in, so
``R.from_dict(d).to_dict() == d`` key for key (a file rewritten by this version loses nothing
a newer one added). Known keys are decoded by their field's type through the codec
(:func:`meshprof.records.codec.decode`): a nested record, a list of records, ``int | None``...;
a value of the wrong type raises :class:`~meshprof.records.codec.RecordError` naming the key.
Every field is optional (None: the key is absent, unless it was read with a null value).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from meshprof.records.codec import as_is_types, decode, to_json, type_hints

R = TypeVar("R", bound="JsonRecord")

_BASE_FIELDS = frozenset({"extra", "key_order"})
_KNOWN: dict[type, dict[str, str]] = {}
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_SETTERS: dict[type, Callable[[Any, tuple[Any, ...]], None]] = {}
_GETTERS: dict[type, operator.attrgetter[Any]] = {}
_AS_IS_BY_CLASS: dict[type, dict[str, frozenset[type]]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """Every field's attribute name, in declaration order (computed once per class)."""
    got = _FIELD_NAMES.get(cls)
    if got is None:
        got = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return got


def _setter(cls: type) -> Callable[[Any, tuple[Any, ...]], None]:
    """A function that sets every field of a new ``cls`` from a tuple of values, one statement
    per field (made once per class, as :mod:`dataclasses` makes ``__init__``: a loop over the
    names costs twice as much)."""
    got = _SETTERS.get(cls)
    if got is None:
        names = _field_names(cls)
        body = "".join(f"    s(o, {n!r}, v[{i}])\n" for i, n in enumerate(names)) or "    pass\n"
        scope: dict[str, Any] = {"s": object.__setattr__}
        exec(f"def set_fields(o, v):\n{body}", scope)  # (the names: the class' fields)
        got = _SETTERS[cls] = scope["set_fields"]
    return got


def _as_is(cls: type) -> dict[str, frozenset[type]]:
    """Field name -> the exact JSON value types it takes unchanged (:func:`as_is_types`)."""
    got = _AS_IS_BY_CLASS.get(cls)
    if got is None:
        got = _AS_IS_BY_CLASS[cls] = {n: as_is_types(tp) for n, tp in type_hints(cls).items()}
    return got


def _rebuild(cls: type[R], values: tuple[Any, ...]) -> R:
    """A record from its field values (see :meth:`JsonRecord.__reduce__`)."""
    obj = object.__new__(cls)
    _setter(cls)(obj, values)
    return obj


@dataclass(frozen=True, slots=True, kw_only=True)
class JsonRecord:
    """A JSON object: the subclass' fields are its known keys (written under the name their
    metadata gives, :func:`~meshprof.records.codec.json_key`, else their own)."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know, kept as read (written back unchanged)."""
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """The keys as read, in file order (empty for a record built in code)."""

    @classmethod
    def known(cls) -> dict[str, str]:
        """JSON key -> field name of every known key (computed once per class; do not modify
        the dict returned)."""
        got = _KNOWN.get(cls)
        if got is None:
            got = _KNOWN[cls] = {
                str(f.metadata.get("meshprof_json_name", f.name)): f.name
                for f in dataclasses.fields(cls)
                if f.name not in _BASE_FIELDS
            }
        return got

    @classmethod
    def known_keys(cls) -> tuple[str, ...]:
        """The JSON keys this version knows."""
        return tuple(cls.known())

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any], where: str = "") -> R:
        """The record of a JSON object (unknown keys go to ``extra``, the order is kept)."""
        return cls.from_json_data(d, where or cls.__name__)

    @classmethod
    def from_json_data(cls: type[R], d: Any, where: str) -> R:
        """:meth:`from_dict`, as the codec calls it for a nested record."""
        if not isinstance(d, dict):
            return decode(dict, d, where)  # type: ignore[no-any-return]  # raises
        known = cls.known()
        hints = type_hints(cls)
        as_is = _as_is(cls)
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in d.items():
            name = known.get(k)
            if name is None:
                extra[k] = v
            elif type(v) in as_is[name]:
                kwargs[name] = v  # (what decode returns for it: most of a rank meta's keys)
            else:
                kwargs[name] = decode(hints[name], v, f"{where}.{k}")
        return cls(**kwargs, extra=extra, key_order=tuple(d))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its class and field values: a process that loads rank files sends
        100,000 rank metas back to the report, and the slots dataclass' own state methods
        (``dataclasses.fields`` on every call) made each cost ~0.2 ms to pickle and load."""
        cls = type(self)
        get = _GETTERS.get(cls)
        if get is None:
            get = _GETTERS[cls] = operator.attrgetter(*_field_names(cls))
        return (_rebuild, (cls, get(self)))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: keys as read (in their order), then set fields, then new extras."""
        known = self.known()
        order = list(self.key_order)
        seen = set(order)
        order += [k for k, n in known.items() if k not in seen and getattr(self, n) is not None]
        order += [k for k in self.extra if k not in seen]
        out: dict[str, Any] = {}
        for k in order:
            name = known.get(k)
            if name is not None:
                out[k] = _plain(getattr(self, name))
            elif k in self.extra:
                out[k] = self.extra[k]
        return out

    def updated(self: R, **changes: Any) -> R:
        """A copy with ``changes`` (by JSON key: known keys decoded into their field, others
        kept in ``extra``)."""
        known = self.known()
        hints = type_hints(type(self))
        fields_: dict[str, Any] = {}
        extra = dict(self.extra)
        for k, v in changes.items():
            name = known.get(k)
            if name is None:
                extra[k] = v
            else:
                fields_[name] = v if _is_typed(v) else decode(hints[name], to_json(v), k)
        order = self.key_order or tuple(self.to_dict())  # keep keys set to None from now on
        order = order + tuple(k for k in changes if k not in order)
        return dataclasses.replace(self, **fields_, extra=extra, key_order=order)

    def __getitem__(self, key: str) -> Any:
        """The JSON value under the on-disk ``key`` (KeyError when absent)."""
        return self.to_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()


def _is_typed(v: Any) -> bool:
    """A value already of a record type (given as such, not as JSON data)."""
    return isinstance(v, JsonRecord) or (
        isinstance(v, list | tuple) and bool(v) and all(isinstance(x, JsonRecord) for x in v)
    )


def _plain(v: Any) -> Any:
    """A field's value as JSON data (nested records by their own :meth:`to_dict`)."""
    if isinstance(v, JsonRecord):
        return v.to_dict()
    if isinstance(v, list | tuple) and any(isinstance(x, JsonRecord) for x in v):
        return [_plain(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return to_json(v)
    if hasattr(v, "to_json_data"):  # a value type that writes itself (``Members``)
        return to_json(v)
    return v


__all__ = ["JsonRecord"]
