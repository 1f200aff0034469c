"""An unmodified Hugging Face ``generate()`` with tensor-parallel weights (DTensor, 2 gloo ranks),
under ``meshprof run``, recognized as serving: each batch row a request, the first forward a
prefill step giving the first token, each later forward a decode step giving one token.

The truth is the script's own (tests/scripts/hf_generate_tp.py, which imports nothing of
meshprof): when it called ``generate`` and when it returned, and when each forward ended (its
own forward hook), by its own clock, and when each token was chosen (its own stopping criterion); its prompt lengths and the tokens ``generate`` returned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "hf_generate_tp.py"
PROMPTS, NEW = 4, 16


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    import subprocess
    import sys

    # the script runs transformers in the ranks: without it (the compat extra) there is no job
    pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[compat]')")
    base = tmp_path_factory.mktemp("hf")
    run = base / "run"
    cmd = [sys.executable, "-m", "meshprof.cli", "run", "-o", str(run), "--nproc-per-node", "2",
           "--layout", "tp=2", str(SCRIPT), str(base), str(PROMPTS), str(NEW)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    truth = json.loads((base / "truth0.json").read_text())
    return run, truth


def _serving(cli: Any, run: Path) -> dict[str, Any]:
    r = cli("report", run, "--json", "--steps", "all")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout)["serving"])


def test_each_row_is_a_request_with_a_token_per_forward(
    generated: tuple[Path, dict[str, Any]], cli: Any
) -> None:
    run, truth = generated
    s = _serving(cli, run)
    lat = s["latencies"]
    assert truth["new_tokens"] == NEW
    assert lat["requests"] == PROMPTS and lat["successful"] == PROMPTS
    assert lat["ranks_with_requests"] == [0, 1]  # every TP rank runs generate()
    assert lat["reasons"]["length"] == PROMPTS
    assert lat["output_tokens"]["min"] == lat["output_tokens"]["max"] == NEW
    assert sorted([lat["prompt_tokens"]["min"], lat["prompt_tokens"]["max"]]) == [
        min(truth["prompt_tokens"]),
        max(truth["prompt_tokens"]),
    ]
    kinds = {k["kind"]: k for k in s["kinds"]}
    assert kinds["prefill"]["steps"] == 1 and kinds["decode"]["steps"] == NEW - 1
    assert kinds["prefill"]["prompt_tokens"] == sum(truth["prompt_tokens"])
    assert kinds["decode"]["output_tokens"] == PROMPTS * (NEW - 1)
    assert lat["itl"]["count"] == PROMPTS * (NEW - 1)
    # both ranks' forwards explained, tensor-parallel collectives in each
    ranks = {(r["rank"], r["kind"]) for r in s["ranks"]}
    assert ranks == {(0, "prefill"), (1, "prefill"), (0, "decode"), (1, "decode")}
    assert any(d["dim"] == "tp" for _, dims in s["dims"] for d in dims)


def test_the_latencies_are_the_scripts_own(
    generated: tuple[Path, dict[str, Any]], cli: Any
) -> None:
    run, truth = generated
    lat = _serving(cli, run)["latencies"]
    assert len(truth["forward_end_ns"]) == NEW  # one prefill forward, NEW - 1 decode forwards
    # when the script saw each token chosen (its own stopping criterion; the forward's end is
    # earlier by the step's sampling, milliseconds on a loaded machine)
    tokens = np.asarray(truth["token_ns"], dtype=np.float64)
    assert len(tokens) == NEW
    want = {
        "ttft": tokens[0] - truth["called_ns"],
        "e2e": truth["returned_ns"] - truth["called_ns"],
        "itl": float(np.median(np.diff(tokens))),
    }
    for fig, w in want.items():
        got = lat[fig]["p50"]
        assert abs(got - w) <= max(1e6, 0.05 * w), (fig, got / 1e6, w / 1e6)


def test_a_plain_forward_script_keeps_forward_steps(tmp_path: Path, cli: Any) -> None:
    """No generate(): no request, the report has no serving section (today's behaviour)."""
    script = tmp_path / "fwd.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(4, 4)\n"
        "with torch.no_grad():\n    for _ in range(5):\n        m(torch.ones(1, 4))\n"
    )
    r = cli.process("run", "-o", tmp_path / "run", "--nproc-per-node", "1", script, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = cli("report", tmp_path / "run", "--json")
    doc = json.loads(rep.stdout)
    assert "serving" not in doc
