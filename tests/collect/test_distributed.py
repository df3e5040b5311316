"""`torchrun --nproc_per_node 2 -m anistat run …` (gloo, CPU) gives the single-process numbers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from anistat.pipeline import run

PROTOCOL = """\
anistat_protocol: 1
name: dist
seed: 3
data: {seq_len: 16, n_fit_sequences: 6, n_test_sequences: 7, vocab_size: 260, batch_size: 2}
models:
  - name: dec
    architecture: gpt2
    hidden_size: 16
    num_layers: 2
    num_heads: 2
    train: {steps: 2, batch_size: 4, warmup_steps: 1, checkpoints: [0, 2]}
sites: {kind: [embed, mlp, residual], layers: [1]}
proxies: {methods: [pca], ranks: [2], max_fit_tokens: 50, concept_card_tokens: 0}
controls: {kinds: [normal], n: 5}
stats: {n_bootstrap: 50, n_permutations: 50}
report: {compile_pdf: false}
"""


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("torchrun") is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "torchrun")),
    reason="torchrun not installed",
)
def test_torchrun_two_cpu_processes_match_single_process(tmp_path: Path):
    protocol = tmp_path / "dist.yaml"
    protocol.write_text(PROTOCOL)
    single = run(protocol, tmp_path / "single", device="cpu").results

    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "ANISTAT_PROGRESS": "0",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    command = [
        torchrun,
        "--nproc_per_node",
        "2",
        "--master_port",
        "0",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "localhost:0",
        "-m",
        "anistat",
        "run",
        str(protocol),
        "--out",
        str(tmp_path / "multi"),
        "--device",
        "cpu",
        "--quiet",
    ]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    multi = pd.read_csv(tmp_path / "multi" / "results.csv")
    single_csv = pd.read_csv(tmp_path / "single" / "results.csv")
    assert len(multi) == len(single_csv) == len(single)
    assert set(single_csv["site"]) == {"embed", "mlp.1", "residual.1"}
    numeric = ["estimate", "control_mean", "control_sd", "ci_low", "ci_high", "p_value", "p_adjusted", "effect_size"]
    for column in numeric:
        np.testing.assert_allclose(
            multi[column].to_numpy(float),
            single_csv[column].to_numpy(float),
            rtol=1e-7,
            atol=1e-12,
            equal_nan=True,
            err_msg=column,
        )
    for column in ("model", "checkpoint", "site", "metric", "control", "n_sequences", "n_tokens"):
        assert multi[column].tolist() == single_csv[column].tolist(), column
    # the frequency analysis too: per-(sequence, type) sums gathered from both ranks give the
    # single-process correlations and their bootstrap CIs
    single_frequency = pd.read_csv(tmp_path / "single" / "frequency.csv")
    multi_frequency = pd.read_csv(tmp_path / "multi" / "frequency.csv")
    assert single_frequency.metric.eq("spearman_logfreq_distance").any()
    assert single_frequency[["metric", "site", "ci_method"]].equals(multi_frequency[["metric", "site", "ci_method"]])
    for column in ("estimate", "ci_low", "ci_high", "p_value"):
        np.testing.assert_allclose(
            multi_frequency[column].to_numpy(float),
            single_frequency[column].to_numpy(float),
            rtol=1e-7,
            atol=1e-12,
            equal_nan=True,
            err_msg=f"frequency {column}",
        )
