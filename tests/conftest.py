"""Shared fixtures: a miniature protocol that runs end to end in seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# 16 test sequences span 11 documents: enough resampling units for intervals
# (anistat.stats.MIN_RESAMPLING_UNITS)
MINI_PROTOCOL = """\
anistat_protocol: 1
name: mini
description: miniature end-to-end protocol for the tests
seed: 7
data: {seq_len: 24, n_fit_sequences: 12, n_test_sequences: 16, vocab_size: 300, batch_size: 5}
models:
  - name: dec
    architecture: gpt2
    hidden_size: 16
    num_layers: 2
    num_heads: 2
    train: {steps: 6, batch_size: 4, warmup_steps: 1, checkpoints: [0, 3, 6]}
  - name: enc
    architecture: bert
    hidden_size: 16
    num_layers: 1
    num_heads: 2
    train: {steps: 4, batch_size: 4, warmup_steps: 1, checkpoints: [0, 4]}
proxies: {methods: [pca], ranks: [2, 4], max_fit_tokens: 400, concept_card_tokens: 3}
controls: {kinds: [normal, haar], n: 9}
stats: {n_bootstrap: 100, n_permutations: 100, multiplicity: fdr_bh}
report: {compile_pdf: false}
"""


@pytest.fixture(scope="session")
def mini_bundle(tmp_path_factory) -> Path:
    """One bundle of MINI_PROTOCOL for the whole session, written by the real command line
    (`python -m anistat run`, figures included). Read it, never write into it: a test that
    changes a bundle copies it first."""
    root = tmp_path_factory.mktemp("mini-session")
    protocol = root / "mini.yaml"
    protocol.write_text(MINI_PROTOCOL)
    done = subprocess.run(
        [sys.executable, "-m", "anistat", "run", str(protocol), "--out", str(root / "bundle")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return root / "bundle"


@pytest.fixture
def mini_protocol_path(tmp_path: Path) -> Path:
    path = tmp_path / "mini.yaml"
    path.write_text(MINI_PROTOCOL)
    return path


def pytest_configure(config):
    # The suite is many small linear-algebra ops; on a 2-core CI box intra-op threads mostly
    # fight each other (measured: the geometry tests take 8 s single-threaded, 30-40 s with 2).
    import torch

    torch.set_num_threads(1)
