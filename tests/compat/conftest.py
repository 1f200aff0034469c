"""The compatibility cells (``-m compat``): real frameworks, unmodified, with and without
``meshprof run``. Every test under this folder gets the ``compat`` mark, which the default run
deselects (pyproject's addopts); ``python -m pytest -q -m compat`` runs them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "jobs"))  # the jobs' helpers (titan_launch.write_assets)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.compat)


@pytest.fixture(scope="session")
def compat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the whole session's jobs (their outputs, caches, run directories)."""
    return tmp_path_factory.mktemp("compat")


@pytest.fixture(scope="session")
def tiny_llama(compat_dir: Path) -> Path:
    """A tiny random Llama saved with ``save_pretrained`` (no hub access): 2 layers, hidden 64,
    4 heads (2 key/value heads), vocabulary 128."""
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = compat_dir / "tiny-llama"
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path
