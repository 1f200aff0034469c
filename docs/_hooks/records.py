"""MkDocs hook: the file-format tables of docs/formats.md, generated from the typed records'
source (``src/meshprof/records/``), so the page says what the code reads and writes.

A line ``<!-- records: meshprof.records.rank_meta RankMeta Handover ... -->`` in a page becomes,
for each class named, a heading and a table of its JSON keys: the key (a field's name, or the
name its ``json_key`` metadata gives), its type annotation and its docstring (the string literal
after the field). Read with :mod:`ast`, without importing meshprof.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!-- records: (\S+) ([^>]*?) -->$", re.M)
_BASE = {"extra", "key_order"}


def _doc_of(node: ast.AST) -> str:
    return " ".join((ast.get_docstring(node) or "").split())  # type: ignore[arg-type]


def _json_key(value: ast.expr | None) -> str | None:
    """The name of ``json_key("...")`` inside a field's default, if any."""
    if value is None:
        return None
    for n in ast.walk(value):
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "json_key" and n.args:
            arg = n.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return arg.value
    return None


def record_fields(module: str) -> dict[str, tuple[str, list[tuple[str, str, str]]]]:
    """class name -> (class docstring, [(JSON key, type, docstring)]) of a records module."""
    path = ROOT / "src" / Path(*module.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text())
    out: dict[str, tuple[str, list[tuple[str, str, str]]]] = {}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        rows: list[tuple[str, str, str]] = []
        body = cls.body
        for i, node in enumerate(body):
            if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
                continue
            name = node.target.id
            if name in _BASE or name.isupper():
                continue
            nxt: Any = body[i + 1] if i + 1 < len(body) else None
            doc = ""
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                doc = " ".join(str(nxt.value.value).split())
            key = _json_key(node.value) or name
            rows.append((key, ast.unparse(node.annotation), doc))
        out[cls.name] = (_doc_of(cls), rows)
    return out


def _table(name: str, doc: str, rows: list[tuple[str, str, str]]) -> str:
    lines = [f"### `{name}`", "", doc, ""]
    if rows:
        lines += ["| key | type | meaning |", "|---|---|---|"]
        lines += [
            f"| `{k}` | `{t}` | {d.replace('|', chr(92) + '|')} |" for k, t, d in rows
        ]
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, **_: Any) -> str:
    def expand(m: re.Match[str]) -> str:
        fields = record_fields(m.group(1))
        parts = []
        for name in m.group(2).split():
            if name not in fields:
                raise KeyError(f"{m.group(1)} has no class {name}")
            parts.append(_table(name, *fields[name]))
        return "\n".join(parts)

    return MARK.sub(expand, markdown)
