"""A seeded mutator of run-directory files, for the fuzz harness (``tests/test_fuzz_files.py``):
``mutate(path, rng, outside)`` damages one file the way a crash, a bad disk, a careless script or
someone hostile would, and says how in a few words (the case's name when it fails).

Byte-level: bit flips, truncation, garbage over a region, zeroed runs, appended garbage, an
empty file, deletion, the file replaced by a symbolic link (to a file outside the run
directory, or to ``/dev/zero``). JSON-level (JSON, JSON lines, gzipped JSON): a value anywhere
replaced by a hostile one (huge or negative numbers, 1e308, NaN, paths, long strings, wrong
types, deep nesting, a progression of 2**70 ranks), a key removed, two values swapped."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

HOSTILE: tuple[Any, ...] = (
    None,
    True,
    -1,
    0,
    1,
    2**31,
    2**63,
    2**70,
    10**8,
    16_000_000,
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    0.5,
    "",
    "../../escaped",
    "/tmp/escaped",
    "x" * 100_000,
    "\u0000",
    "rank00000",
    [],
    {},
    [0] * 10_000,
    {"start": 0, "stop": 2**70, "step": 1},
    {"start": 0, "stop": 16_000_000, "step": 1},
    [[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]],
)
"""Values put where a file had another."""

BYTE_OPS = ("flip", "truncate", "garbage", "zero", "append", "empty", "delete", "link", "devzero")
JSON_OPS = ("value", "value", "value", "drop", "swap", "deep")


def mutate(path: Path, rng: random.Random, outside: Path) -> str:
    """Damage ``path`` (see the module docstring); what was done, in words."""
    data = path.read_bytes()
    is_json = path.name.endswith((".json", ".jsonl", ".json.gz"))
    if is_json and rng.random() < 0.6:
        try:
            return _mutate_json(path, data, rng)
        except (ValueError, UnicodeDecodeError, OSError):
            pass
    op = rng.choice(BYTE_OPS)
    n = len(data)
    if op == "flip" and n:
        buf = bytearray(data)
        # half the time in the first 256 bytes: headers, lengths and counts live there
        span = min(n, 256) if rng.random() < 0.5 else n
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(span)
            buf[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(buf))
        return "flip bits"
    if op == "truncate" and n:
        cut = rng.randrange(n)
        path.write_bytes(data[:cut])
        return f"truncate at {cut}"
    if op == "garbage" and n:
        i = rng.randrange(n)
        k = rng.randint(1, 64)
        path.write_bytes(data[:i] + rng.randbytes(k) + data[i + k :])
        return f"garbage at {i}"
    if op == "zero" and n:
        i = rng.randrange(n)
        k = rng.randint(1, 512)
        path.write_bytes(data[:i] + b"\0" * min(k, n - i) + data[i + k :])
        return f"zero at {i}"
    if op == "append":
        path.write_bytes(data + rng.randbytes(rng.randint(1, 4096)))
        return "append garbage"
    if op == "delete":
        path.unlink()
        return "delete"
    if op == "link":
        path.unlink()
        path.symlink_to(outside / "sentinel.json")
        return "link outside"
    if op == "devzero":
        path.unlink()
        path.symlink_to("/dev/zero")
        return "link to /dev/zero"
    path.write_bytes(b"")
    return "empty"


def _load(path: Path, data: bytes) -> tuple[Any, str]:
    """The JSON value of ``path`` and its shape: "json", "jsonl" or "gz"."""
    if path.name.endswith(".gz"):
        return json.loads(gzip.decompress(data)), "gz"
    if path.name.endswith(".jsonl"):
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()], "jsonl"
    return json.loads(data), "json"


def _dump(path: Path, value: Any, shape: str) -> None:
    if shape == "gz":
        path.write_bytes(gzip.compress(json.dumps(value).encode()))
    elif shape == "jsonl":
        path.write_text("".join(json.dumps(v) + "\n" for v in value))
    else:
        path.write_text(json.dumps(value))


def _slots(value: Any, where: str = "") -> list[tuple[Any, Any, str]]:
    """Every (container, key, path) in ``value`` (a sample of long lists)."""
    out: list[tuple[Any, Any, str]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((value, k, f"{where}.{k}"))
            out += _slots(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in list(enumerate(value))[:50]:
            out.append((value, i, f"{where}[{i}]"))
            out += _slots(v, f"{where}[{i}]")
    return out


def _mutate_json(path: Path, data: bytes, rng: random.Random) -> str:
    value, shape = _load(path, data)
    slots = _slots(value)
    if not slots:
        raise ValueError("nothing to change")
    op = rng.choice(JSON_OPS)
    box, key, where = rng.choice(slots)
    if op == "drop" and isinstance(box, dict):
        del box[key]
        what = f"drop {where}"
    elif op == "swap":
        box2, key2, where2 = rng.choice(slots)
        box[key], box2[key2] = box2[key2], box[key]
        what = f"swap {where} and {where2}"
    elif op == "deep":
        deep: Any = 0
        for _ in range(rng.choice((200, 5000))):
            deep = [deep]
        box[key] = deep
        what = f"nest {where} deep"
    else:
        new = rng.choice(HOSTILE)
        box[key] = new
        what = f"{where} = {_short(new)}"
    try:
        _dump(path, value, shape)
    except RecursionError:
        path.write_text("[" * 100_000)
        what += " (written as 100,000 brackets)"
    return what


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 30 else text[:27] + "..."


__all__ = ["BYTE_OPS", "HOSTILE", "JSON_OPS", "mutate"]
