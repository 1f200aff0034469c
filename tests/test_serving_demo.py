"""``meshprof demo --serve``: the user's path, end to end (the ranks, the frontend and the client
started by the command; the report printed and written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshprof.demo.serving_run import CLIENT_FILE

pytestmark = pytest.mark.slow


def test_demo_serve_serves_every_request_and_reports_them(tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "serve"
    r = cli.process(
        "demo", "--serve", "-o", out, "--requests", "8", "--rate", "20", "--device-ms", "5",
        "--slo", "ttft=10s", timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Serving: 8 requests on rank 0" in r.stdout
    assert "goodput (ttft=10000ms)" in r.stdout
    assert (out / "report.html").is_file()
    client = json.loads((out / CLIENT_FILE).read_text())["requests"]
    assert len(client) == 8 and all(c["reason"] in ("stop", "length") for c in client)
    doc = json.loads(cli("report", out, "--json", "--steps", "all").stdout)["serving"]
    assert doc["latencies"]["successful"] == 8
    assert {k["kind"] for k in doc["kinds"]} == {"prefill", "decode"}


@pytest.mark.parametrize(
    "args",
    [["--dp", "2"], ["--slow-rank", "5"], ["--requests", "0"], ["--slo", "nope=3"]],
)
def test_demo_serve_bad_options_are_one_line(args: list[str], cli: Any, tmp_path: Path) -> None:
    r = cli("demo", "--serve", "-o", tmp_path / "x", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
