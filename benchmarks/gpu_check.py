"""The GPU check: one command, ≤ 8 minutes on one GPU (see gpu_check.sh).

1. The quickstart protocol three times — `--device cpu`, `--device cuda` in fp32 (TF32 off),
   `--device cuda` in bf16 — and every numeric column of results.csv compared with the CPU run:
   the fp32 run must agree to 1e-4 relative; the bf16 differences are reported.
   (The built-in models are trained on the CPU in every run, so all three measure the same
   weights; only the collection runs on the device.)
2. P2 at the Pythia-410m shape (GPT-NeoX, d = 1024, 24 blocks, vocabulary 50 304) on the GPU
   in bf16 and in fp32: anistat vs the naive loop vs the floor (`bench_collect.py p2`).
3. The paper-scale analysis (issue #21): `analyze_units` on 12 synthetic units at d = 768, PCA
   ranks 8/32/128, 20 normal controls, default statistics (9,999 Haar draws at most, shared by
   the units), planted (significant: every draw used) and random proxies, on the CPU and on the
   GPU: time of each and the share of p-values that agree exactly. The device side runs the
   analysis' device path (eigendecompositions batched on the device, Haar streams there); the
   table's "analysis on device" row is its largest relative difference from the CPU path, and
   "analysis ÷ collection" reads each quickstart run's manifest stages.
4. A markdown table on stdout, ready for benchmarks/README.md; everything also as JSON.

`--dry-run` runs the same steps on the CPU at a tiny shape (a shortened quickstart, d = 64), so
the script itself is tested without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
KEYS = ["model", "checkpoint", "site", "rank", "proxy", "control", "metric"]
VALUES = ["estimate", "control_mean", "control_sd", "ci_low", "ci_high", "p_value"]
FP32_TOLERANCE = 1e-4


def fail(message: str) -> None:
    """A setup error: one line on stderr, exit status 2."""
    print(f"gpu_check: {message}", file=sys.stderr)
    raise SystemExit(2)


def protocol_variant(source: Path, target: Path, precision: str, dry_run: bool) -> Path:
    """The quickstart with every model's precision set (and, for a dry run, shortened)."""
    protocol = yaml.safe_load(source.read_text())
    for model in protocol["models"]:
        model["precision"] = precision
        if dry_run:
            model["train"].update(steps=20, checkpoints=[0, 10, 20])
            model["num_layers"] = 2
    if dry_run:
        protocol["data"].update(n_fit_sequences=16, n_test_sequences=16)
        protocol["proxies"]["ranks"] = [4]
        protocol["controls"]["n"] = 19
        protocol["stats"]["n_bootstrap"] = 200
        protocol["data"]["seq_len"] = 32
    protocol.pop("claims", None)  # claims are the science's business; this compares numbers
    protocol.setdefault("report", {})["compile_pdf"] = False
    target.write_text(yaml.safe_dump(protocol, sort_keys=False))
    return target


def run_quickstart(protocol: Path, out: Path, device: str) -> float:
    env = dict(os.environ, NVIDIA_TF32_OVERRIDE="0", PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "anistat", "run", str(protocol), "--out", str(out), "--device", device, "--quiet"],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, 3):
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        fail(f"anistat run on {device} failed with exit code {done.returncode}")
    return time.perf_counter() - started


def compare(reference: Path, other: Path) -> dict:
    """Largest relative difference per numeric column (rows matched on the unit/basis keys;
    entries where both are nan agree, a nan on one side only is counted)."""
    a = pd.read_csv(reference / "results.csv")
    b = pd.read_csv(other / "results.csv")
    keys = [k for k in KEYS if k in a.columns]
    merged = a.merge(b, on=keys, suffixes=("_cpu", "_dev"), how="outer", indicator=True)
    out = {"rows": int(len(merged)), "unmatched_rows": int((merged["_merge"] != "both").sum())}
    worst = 0.0
    for column in VALUES:
        if f"{column}_cpu" not in merged:
            continue
        x = merged[f"{column}_cpu"].to_numpy(dtype=float)
        y = merged[f"{column}_dev"].to_numpy(dtype=float)
        one_nan = np.isnan(x) != np.isnan(y)
        both = ~np.isnan(x) & ~np.isnan(y)
        scale = np.maximum(np.abs(x[both]), 1e-12)
        relative = float(np.max(np.abs(x[both] - y[both]) / scale)) if both.any() else 0.0
        out[column] = {"max_relative": relative, "nan_mismatch": int(one_nan.sum())}
        if column != "p_value":  # p-values are discrete: a tie flips by one control
            worst = max(worst, relative, float("inf") if one_nan.any() else 0.0)
    out["worst_relative_excluding_p"] = worst
    return out


def bench_p2(dry_run: bool, device: str, precision: str, out: Path) -> dict:
    shape = (
        ["--dim", "64", "--layers", "2", "--vocab", "512", "--n-test", "8", "--batch-size", "4", "--repeats", "1"]
        if dry_run
        else [
            "--dim",
            "1024",
            "--layers",
            "24",
            "--vocab",
            "50304",
            "--n-test",
            "64",
            "--batch-size",
            "16",
            "--repeats",
            "3",
        ]
    )
    target = out / f"p2-{precision}.json"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_collect.py"),
        "p2",
        "--arch",
        "gpt-neox",
        "--device",
        device,
        "--precision",
        precision,
        "--skip-marginal",
        "--json",
        str(target),
        *shape,
    ]
    env = dict(os.environ, NVIDIA_TF32_OVERRIDE="0", PYTHONPATH=str(ROOT))
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        fail(f"P2 ({precision}) failed with exit code {done.returncode}")
    return json.loads(target.read_text())["P2"]


def analysis_check(dry_run: bool, device: str) -> dict:
    """`analyze_units` at the paper's settings on the CPU and on `device` (see the docstring)."""
    import torch
    import yaml as _yaml

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_stats import PROTOCOL, synthetic_unit

    from anistat.analyze import analyze_run
    from anistat.protocol import Protocol

    d, units, ranks = (64, 3, [4, 16]) if dry_run else (768, 12, [8, 32, 128])
    protocol = Protocol.model_validate(_yaml.safe_load(PROTOCOL) | {"proxies": {"methods": ["pca"], "ranks": ranks}})
    out = {}
    for kind in ("planted", "random"):
        rng = np.random.default_rng(d + (kind == "planted"))
        artifacts = [synthetic_unit(rng, d, ranks, planted=kind == "planted", layer=i) for i in range(units)]
        seconds, tables = {}, {}
        for name, dev in (("cpu", "cpu"), ("device", device)):
            if dev != "cpu":
                torch.cuda.synchronize()
            started = time.perf_counter()
            # the device side: eigendecompositions batched and Haar streams on the device (on the CPU
            # in a dry run: the same path, run there)
            tables[name] = analyze_run(artifacts, {}, protocol, dev, frequency=False, linalg_on_device=name == "device")
            seconds[name] = time.perf_counter() - started
        p = [
            t.results.loc[t.results["p_test"] == "haar_monte_carlo", "p_value"].to_numpy(dtype=float)
            for t in tables.values()
        ]
        same = int(np.sum(p[0] == p[-1]))
        estimates = [t.results["estimate"].to_numpy(dtype=float) for t in tables.values()]
        scale = np.maximum(np.abs(estimates[0]), 1e-12)
        finite = np.isfinite(estimates[0]) & np.isfinite(estimates[1])
        out[kind] = {
            "units": units,
            "d": d,
            "ranks": ranks,
            "seconds": seconds,
            "p_values": int(p[0].size),
            "p_values_identical": same,
            "estimates_max_relative": float(np.max(np.abs(estimates[1] - estimates[0])[finite] / scale[finite]))
            if finite.any()
            else 0.0,
            "draws_made": tables["cpu"].null_settings["draws_made"],
        }
    return out


#: The manifest stages (`anistat.timing`) of the collection and of the analysis.
COLLECTION_STAGES = ("fit pass", "proxy fits", "controls", "concept cards", "test pass")
ANALYSIS_STAGES = ("unit spectra", "exact tests", "intervals and bootstraps", "frequency rows")


def stage_split(bundle: Path) -> dict:
    """A run's collection and analysis seconds (wall) from its manifest's stages."""
    stages = json.loads((bundle / "manifest.json").read_text()).get("stages", {})

    def wall(names: tuple[str, ...]) -> float:
        return float(sum(stages.get(name, {}).get("wall_s", 0.0) for name in names))

    return {"collection": wall(COLLECTION_STAGES), "analysis": wall(ANALYSIS_STAGES)}


def table(report: dict) -> str:
    device = report["device_name"]
    lines = [
        f"GPU check ({device}; `bash benchmarks/gpu_check.sh{' --dry-run' if report['dry_run'] else ''}`, "
        f"{report['seconds']:.0f} s in all)",
        "",
        "| what | measured | goal | met? |",
        "|---|---:|---:|:---:|",
    ]
    fp32 = report["quickstart"]["fp32"]
    bf16 = report["quickstart"]["bf16"]
    lines.append(
        f"| quickstart results, device fp32 (TF32 off) vs CPU: max relative difference "
        f"(estimates, control mean/sd, CI ends) | {fp32['worst_relative_excluding_p']:.2e} | "
        f"≤ {FP32_TOLERANCE:g} | {'yes' if fp32['worst_relative_excluding_p'] <= FP32_TOLERANCE else '**no**'} |"
    )
    lines.append(f"| same, bf16 autocast vs CPU | {bf16['worst_relative_excluding_p']:.2e} | reported | — |")
    for name in ("fp32", "bf16"):
        p = report["quickstart"][name].get("p_value", {})
        lines.append(
            f"| quickstart p-values, {name} vs CPU: max relative difference | "
            f"{p.get('max_relative', float('nan')):.2e} | reported | — |"
        )
    walls = report["quickstart_seconds"]
    lines.append(
        f"| quickstart wall time cpu / cuda fp32 / cuda bf16 (s) | {walls['cpu']:.0f} / {walls['fp32']:.0f} / "
        f"{walls['bf16']:.0f} | — | — |"
    )
    for precision in ("bf16", "fp32"):
        p2 = report["p2"][precision]
        tps = p2["tokens_per_s"]
        lines.append(
            f"| P2 {p2['config']['dim']}-d × {p2['config']['layers']} blocks, {precision}: anistat ÷ naive "
            f"(tokens/s) | {p2['speedup_vs_naive']:.2f}× | ≥ 1.5× | "
            f"{'yes' if p2['speedup_vs_naive'] >= 1.5 else '**no**'} |"
        )
        lines.append(
            f"| P2 same, {precision}: anistat ÷ floor (time) | {p2['ratio_to_floor']:.3f} | ≤ 1.2 | "
            f"{'yes' if p2['ratio_to_floor'] <= 1.2 else '**no**'} |"
        )
        lines.append(
            f"| P2 same, {precision}: tokens/s anistat / naive / floor | {tps['anistat']:,.0f} / "
            f"{tps['naive']:,.0f} / {tps['floor']:,.0f} | — | — |"
        )
    for name, split in report.get("stages", {}).items():
        ratio = split["analysis"] / split["collection"] if split["collection"] > 0 else float("nan")
        lines.append(
            f"| quickstart {name}: analysis ÷ collection (manifest stages; {split['analysis']:.1f} s / "
            f"{split['collection']:.1f} s) | {ratio:.2f} | reported | — |"
        )
    for kind, check in report.get("analysis", {}).items():
        secs = check["seconds"]
        lines.append(
            f"| analysis at the paper's settings ({check['units']} units, d = {check['d']}, ranks "
            f"{'/'.join(map(str, check['ranks']))}, {kind} proxies): seconds cpu / device | "
            f"{secs['cpu']:.1f} / {secs.get('device', secs['cpu']):.1f} | — | — |"
        )
        relative = check.get("estimates_max_relative", 0.0)
        lines.append(
            f"| analysis on device ({kind}): eigendecompositions batched and Haar streams on the device "
            f"vs the CPU path, max relative difference of the estimates | {relative:.1e} | ≤ 1e-09 | "
            f"{'yes' if relative <= 1e-9 else '**no**'} |"
        )
        lines.append(
            f"| same, exact p-values identical on both | {check['p_values_identical']} of "
            f"{check['p_values']} | all | {'yes' if check['p_values_identical'] == check['p_values'] else '**no**'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU only, tiny shapes: tests this script")
    parser.add_argument("--out", default=None, help="working directory (default: a temporary one)")
    args = parser.parse_args()
    import tempfile

    import torch

    started = time.perf_counter()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        fail("no CUDA device is visible (use --dry-run to test the script on the CPU)")
    out = Path(args.out or tempfile.mkdtemp(prefix="anistat-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    source = ROOT / "protocols" / "quickstart.yaml"
    walls, runs = {}, {}
    for name, dev, precision in (("cpu", "cpu", "fp32"), ("fp32", device, "fp32"), ("bf16", device, "bf16")):
        protocol = protocol_variant(source, out / f"quickstart-{name}.yaml", precision, args.dry_run)
        runs[name] = out / f"quickstart-{name}"
        walls[name] = run_quickstart(protocol, runs[name], dev)
        print(f"quickstart {name}: {walls[name]:.1f} s", file=sys.stderr, flush=True)
    quickstart = {name: compare(runs["cpu"], runs[name]) for name in ("fp32", "bf16")}
    p2 = {}
    for precision in ("bf16", "fp32"):
        p2[precision] = bench_p2(args.dry_run, device, precision, out)
        print(f"P2 {precision}: done", file=sys.stderr, flush=True)
    analysis = analysis_check(args.dry_run, device)
    print("analysis: done", file=sys.stderr, flush=True)
    report = {
        "dry_run": args.dry_run,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else "CPU",
        "torch": torch.__version__,
        "quickstart": quickstart,
        "quickstart_seconds": walls,
        "p2": p2,
        "analysis": analysis,
        "stages": {name: stage_split(runs[name]) for name in runs},
        "seconds": time.perf_counter() - started,
    }
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(table(report))
    print(f"\n(details: {out / 'gpu_check.json'})")
    fp32_ok = quickstart["fp32"]["worst_relative_excluding_p"] <= FP32_TOLERANCE
    raise SystemExit(0 if fp32_ok else 1)


if __name__ == "__main__":
    main()
