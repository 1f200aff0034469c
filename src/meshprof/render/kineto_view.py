"""The torch.profiler trace breakdown (:class:`meshprof.analyze.traces.kineto.KinetoReport`) in the terminal
and in HTML: HTA's figures per rank side by side, the kernel-level straggler, the host split of
CPU-only traces, unreadable files. Formatting only."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

from meshprof.render.format import fmt_ns, fmt_pct

if TYPE_CHECKING:
    from meshprof.analyze.traces.kineto import KinetoBreakdown, KinetoReport

GPU_COLUMNS = (
    "rank",
    "span",
    "idle",
    "compute",
    "non-comp",
    "overlap",
    "exposed",
    "memcpy",
    "iters",
)
HOST_COLUMNS = ("rank", "traces", "window", "computation", "communication", "other")


def _p(pct: float | None) -> str:
    """A figure already in percent (HTA's unit), e.g. 25.3 → ``25.3%``."""
    return fmt_pct(None if pct is None else pct / 100)


def _gpu_row(b: KinetoBreakdown) -> list[str]:
    assert b.gpu is not None
    t = b.gpu.total
    return [
        str(b.rank),
        fmt_ns(t.span_ns),
        _p(t.idle_pct),
        _p(t.compute_pct),
        _p(t.non_compute_pct),
        _p(t.comm_comp_overlap_pct),
        fmt_ns(t.exposed_comm_ns),
        fmt_ns(t.memcpy_ns),
        str(len(b.gpu.iterations)),
    ]


def _host_row(b: KinetoBreakdown) -> list[str]:
    return [
        str(b.rank),
        str(len(b.paths)),
        fmt_ns(b.window_ns),
        f"{fmt_ns(b.compute_ns)} ({fmt_pct(b.compute_share, 0)})",
        f"{fmt_ns(b.comm_ns)} ({fmt_pct(b.comm_share, 0)})",
        f"{fmt_ns(b.other_ns)} ({fmt_pct(b.other_share, 0)})",
    ]


def straggler_line(k: KinetoReport) -> str:
    """One sentence on the kernel-level straggler, "" without one."""
    s = k.stragglers
    if s is None or s.straggler is None:
        return ""
    return (
        f"kernel-level straggler: rank {s.straggler}'s computation kernels take longest in "
        f"{s.straggler_steps} of {len(s.steps)} iterations, {s.mean_excess_pct:.1f}% above the "
        "median rank there"
    )


def print_kineto(k: KinetoReport, console: Console) -> None:
    """Problems, notes, the per-rank GPU table (HTA's definitions), the straggler, the host split."""
    for p in k.problems:
        console.print(f"torch.profiler trace not read: {p}", highlight=False, markup=False)
    for n in k.notes:
        console.print(f"note: {n}", highlight=False, markup=False)
    gpu = [b for b in k.ranks if b.gpu is not None]
    host = [b for b in k.ranks if b.gpu is None]
    if gpu:
        t = Table(
            title="torch.profiler traces: GPU time per rank (HTA's definitions over the kernel "
            "span; overlap = communication under computation; exposed = communication alone)",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            padding=(0, 1),
            collapse_padding=True,
        )
        for c in GPU_COLUMNS:
            t.add_column(c, justify="left" if c == "rank" else "right", no_wrap=True)
        for b in gpu:
            t.add_row(*_gpu_row(b))
        console.print(t)
        line = straggler_line(k)
        if line:
            console.print(line, highlight=False, markup=False)
    if host:
        t = Table(
            title="torch.profiler traces (CPU only): host time split per rank", title_justify="left"
        )
        for c in HOST_COLUMNS:
            t.add_column(c, justify="left" if c == "rank" else "right")
        for b in host:
            t.add_row(*_host_row(b))
        console.print(t)


def _html_table(cols: tuple[str, ...], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{escape(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def kineto_html(k: KinetoReport) -> str:
    """The same as :func:`print_kineto`, as an HTML fragment ("" when there is nothing)."""
    out = [f'<p class="muted">torch.profiler trace not read: {escape(p)}</p>' for p in k.problems]
    out += [f'<p class="muted">note: {escape(n)}</p>' for n in k.notes]
    gpu = [b for b in k.ranks if b.gpu is not None]
    host = [b for b in k.ranks if b.gpu is None]
    if gpu:
        out.append(
            "<p>torch.profiler traces: GPU time per rank on Holistic Trace Analysis' definitions "
            "(over the GPU kernel span; overlap = share of communication-kernel time that "
            "overlaps computation kernels).</p>"
        )
        out.append(_html_table(GPU_COLUMNS, [_gpu_row(b) for b in gpu]))
        line = straggler_line(k)
        if line:
            out.append(f"<p>{escape(line)}.</p>")
    if host:
        out.append("<p>torch.profiler traces (CPU only): host time split per rank.</p>")
        out.append(_html_table(HOST_COLUMNS, [_host_row(b) for b in host]))
    return "".join(out)


__all__ = ["kineto_html", "print_kineto", "straggler_line"]
