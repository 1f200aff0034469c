"""The package's shape, checked: imports only look down the layers, no import circle, and no
two modules share a basename unless they are the same feature in different layers.

Every ``import`` statement of every module counts, wherever it is: at the top, inside a
function, under ``if TYPE_CHECKING:`` (a type named in a lower layer's signature is a
dependency on the layer that defines it). The layers and what each holds are described in
``docs/architecture.md``; this table is the rule that page explains.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "meshprof"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "core",
        (
            "meshprof._version",
            "meshprof.errors",
            "meshprof.config",
            "meshprof.events",
            "meshprof.event_log",
            "meshprof.stats",
            "meshprof.layout",
            "meshprof.process",
            "meshprof.forking",
            "meshprof.gc_pause",
            "meshprof.lazy",
            "meshprof.native_build",
            "meshprof.records",
        ),
    ),
    ("collect", ("meshprof.comm", "meshprof.monitor", "meshprof.parallel", "meshprof.tools")),
    ("store", ("meshprof.rundir",)),
    ("analyze", ("meshprof.analyze",)),
    ("report", ("meshprof.report",)),
    ("render", ("meshprof.render",)),
    (
        "apps",
        (
            "meshprof.api",
            "meshprof.session",
            "meshprof.perfmon",
            "meshprof.demo",
            "meshprof.live",
            "meshprof.launch",
            "meshprof.commands",
            "meshprof.cli",
            "meshprof",
        ),
    ),
)
"""Bottom to top. A module may import its own layer and the layers below, never above."""

SAME_FEATURE = frozenset(
    {
        "__init__",
        "types",
        "bench",
        "doctor",
        "hang",
        "plan",
        "failures",
        "what_if",
        "diff",
        "live",
        "manifest",
        "ledger",
        "verdict",
        "changes",
        "captures",
        "stacks",
        "serving",
    }
)
"""Basenames that may repeat: ``__init__``, ``types`` (a room's result types), and the names
of features that have a module in several layers with the same meaning (``analyze/run/
what_if.py`` computes the what-if, ``render/what_if.py`` formats it)."""


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The meshprof modules ``name`` imports (a ``from X import y`` of a submodule y counts
    as importing X.y), wherever the import statement is."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            targets = [
                f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names
            ]
        for t in targets:
            while t and t not in modules and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in modules and t != name:
                out.add(t)
    return out


def layer_of(name: str) -> int:
    best, layer = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, layer = len(p), i
    assert layer >= 0, f"{name} is in no layer: add it to LAYERS"
    return layer


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {n: imports_of(n, p, modules) for n, p in modules.items()}


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    for name in graph:
        layer_of(name)


def test_imports_only_look_down(graph: dict[str, set[str]]) -> None:
    upward = sorted(
        f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, targets in graph.items()
        for b in targets
        if layer_of(b) > layer_of(a)
    )
    assert not upward, "imports that look up a layer:\n" + "\n".join(upward)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


RUN_ROOMS: tuple[str, ...] = ("types", "events", "replay", "stragglers", "what_if", "conclusions")
"""The rooms of ``analyze/run/``, bottom to top (``types`` a module): the event table; the replay
engine on it; the straggler measures (a rank's own compute is the replay's chain model); the
what-if (the replay with a straggler as fast as its peers); the conclusions drawn from them all.
``overview`` and ``failures`` sit beside them and may use any."""


def test_rooms_of_the_run_analysis_look_down(graph: dict[str, set[str]]) -> None:
    prefix = "meshprof.analyze.run."

    def room(name: str) -> str | None:
        head = name[len(prefix) :].split(".")[0] if name.startswith(prefix) else None
        return head if head in RUN_ROOMS else None

    upward = []
    for name, deps in graph.items():
        here = room(name)
        if here is None:
            continue
        for d in deps:
            there = room(d)
            if there is not None and RUN_ROOMS.index(there) > RUN_ROOMS.index(here):
                upward.append(f"{name} -> {d}")
    assert not upward, "analyze/run rooms importing upward:\n" + "\n".join(sorted(upward))
    folders = {p.name for p in (PACKAGE / "analyze" / "run").iterdir() if p.is_dir()} - {
        "__pycache__"
    }
    assert folders == set(RUN_ROOMS) - {"types"}, folders


def test_no_import_circles(graph: dict[str, set[str]]) -> None:
    circles = strongly_connected(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_circles() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(g) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_basenames_mean_one_thing() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for p in PACKAGE.rglob("*.py"):
        where[p.stem].append(str(p.relative_to(PACKAGE)))
    # a report stage module is named after the analysis it runs (report/stages/stragglers.py
    # runs analyze/run/stragglers/stragglers.py)
    for k, v in where.items():
        stages = [p for p in v if p.startswith("report/stages/")]
        if stages and all(p.startswith(("report/stages/", "analyze/")) for p in v):
            where[k] = stages
    repeated = {k: sorted(v) for k, v in where.items() if len(v) > 1 and k not in SAME_FEATURE}
    assert not repeated, f"modules sharing a basename: {repeated}"
