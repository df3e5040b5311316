"""benchmarks/gpu_check.py: the CPU-vs-device comparison of results.csv and its table (the
full `--dry-run` takes minutes — three quickstart runs — and is run by hand, see
benchmarks/README.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results(directory: Path, estimates, p_values) -> Path:
    directory.mkdir()
    frame = pd.DataFrame(
        {
            "model": "m",
            "checkpoint": "c",
            "site": [f"residual.{i}" for i in range(len(estimates))],
            "rank": 4,
            "proxy": "pca",
            "control": "haar",
            "metric": "energy_ratio",
            "estimate": estimates,
            "ci_low": np.asarray(estimates) * 0.9,
            "p_value": p_values,
        }
    )
    frame.to_csv(directory / "results.csv", index=False)
    return directory


def test_compare_reports_the_largest_relative_difference_and_nan_mismatches(gpu_check, tmp_path):
    cpu = _results(tmp_path / "cpu", [2.0, 4.0, np.nan], [0.01, 0.02, 0.5])
    close = _results(tmp_path / "close", [2.0 * (1 + 3e-5), 4.0, np.nan], [0.01, 0.03, 0.5])
    far = _results(tmp_path / "far", [2.0, 4.0 * (1 + 2e-3), 1.0], [0.01, 0.02, 0.5])
    near = gpu_check.compare(cpu, close)
    assert near["estimate"]["max_relative"] == pytest.approx(3e-5, rel=1e-6)
    assert near["p_value"]["max_relative"] == pytest.approx(0.5)  # reported, not part of the verdict
    assert near["worst_relative_excluding_p"] == pytest.approx(3e-5, rel=1e-6)
    assert near["worst_relative_excluding_p"] <= gpu_check.FP32_TOLERANCE
    off = gpu_check.compare(cpu, far)
    assert off["estimate"]["nan_mismatch"] == 1
    assert off["worst_relative_excluding_p"] == float("inf")
    assert off["unmatched_rows"] == 0


def test_table_is_markdown_with_the_verdicts(gpu_check):
    p2 = {
        "config": {"dim": 1024, "layers": 24},
        "speedup_vs_naive": 2.0,
        "ratio_to_floor": 1.1,
        "tokens_per_s": {"anistat": 9000.0, "naive": 4500.0, "floor": 9900.0},
    }
    comparison = {"worst_relative_excluding_p": 2e-6, "p_value": {"max_relative": 0.0}}
    report = {
        "device_name": "GPU",
        "dry_run": False,
        "seconds": 300.0,
        "quickstart": {"fp32": comparison, "bf16": {**comparison, "worst_relative_excluding_p": 3e-3}},
        "quickstart_seconds": {"cpu": 60.0, "fp32": 30.0, "bf16": 25.0},
        "p2": {"bf16": p2, "fp32": {**p2, "ratio_to_floor": 1.3}},
    }
    text = gpu_check.table(report)
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert lines[0] == "| what | measured | goal | met? |"
    assert all(line.count("|") == 5 for line in lines)
    assert "| 2.00e-06 | ≤ 0.0001 | yes |" in text
    assert "fp32: anistat ÷ floor (time) | 1.300 | ≤ 1.2 | **no** |" in text


def test_analysis_check_runs_the_paper_scale_analysis_on_cpu_in_dry_run(gpu_check):
    """The analysis step of the GPU check at its dry-run size: both runs on the CPU here, so every
    exact p-value must agree, and the table shows both."""
    check = gpu_check.analysis_check(True, "cpu")
    assert set(check) == {"planted", "random"}
    for kind, row in check.items():
        assert row["p_values"] > 0 and row["p_values_identical"] == row["p_values"], kind
    report = {
        "device_name": "CPU",
        "dry_run": True,
        "seconds": 1.0,
        "quickstart": {
            name: {"worst_relative_excluding_p": 0.0, "p_value": {"max_relative": 0.0}} for name in ("fp32", "bf16")
        },
        "quickstart_seconds": {"cpu": 1.0, "fp32": 1.0, "bf16": 1.0},
        "p2": {
            name: {
                "config": {"dim": 64, "layers": 2},
                "speedup_vs_naive": 2.0,
                "ratio_to_floor": 1.0,
                "tokens_per_s": {"anistat": 1.0, "naive": 1.0, "floor": 1.0},
            }
            for name in ("bf16", "fp32")
        },
        "analysis": check,
    }
    text = gpu_check.table(report)
    assert "analysis at the paper's settings (3 units, d = 64, ranks 4/16, planted proxies)" in text
    for kind, row in check.items():  # the device path of the analysis, run on the CPU here
        assert set(row["seconds"]) == {"cpu", "device"}
        assert row["estimates_max_relative"] <= 1e-9, kind
        assert f"| analysis on device ({kind}): eigendecompositions batched" in text


def test_analysis_over_collection_is_read_from_the_manifest_stages(gpu_check, tmp_path):
    bundle = tmp_path / "b"
    bundle.mkdir()
    stages = {"fit pass": {"wall_s": 2.0}, "test pass": {"wall_s": 6.0}, "exact tests": {"wall_s": 3.0}}
    stages["intervals and bootstraps"] = {"wall_s": 1.0}
    (bundle / "manifest.json").write_text(json.dumps({"stages": stages}))
    assert gpu_check.stage_split(bundle) == {"collection": 8.0, "analysis": 4.0}
