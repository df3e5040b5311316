"""Synthetic, realistic inputs for the report stage (and a few checks of the generator itself).

`make_results()` mimics what `anistat.analyze` produces for the quickstart protocol: a tiny
decoder (CLM) and a tiny encoder (MLM), 2 layers, 4 checkpoints (steps 0..400), proxy PCA at
ranks 4 and 8, `normal` and `haar` controls (20 each). Numbers follow the paper's qualitative
picture (decoders ≫ encoders, early > late) and the exact relations between metrics
(ratio = E(U)/mean E(Q), anisotropy capture, Holm-adjusted p-values).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from anistat.report._data import RESULT_COLUMNS

# The report's columns less n_eff, m_eff and fallback, which the synthetic table leaves for the report to add.
COLUMNS = [column for column in RESULT_COLUMNS if column not in ("n_eff", "m_eff", "fallback")]
STEPS = (0, 100, 200, 400)
PHASE = {0: "early", 100: "early", 200: "late", 400: "late"}


def _holm(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    q = p[ok]
    m = len(q)
    if m == 0:
        return out
    order = np.argsort(q, kind="stable")
    adj = np.maximum.accumulate((m - np.arange(m)) * q[order])
    res = np.empty(m)
    res[order] = np.minimum(adj, 1.0)
    out[ok] = res
    return out


def make_results(
    *,
    models: tuple[tuple[str, str], ...] = (("tiny-gpt2", "clm"), ("tiny-bert", "mlm")),
    with_failed: bool = True,
    with_buckets: bool = False,
    seed: int = 0,
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    d, n_ctrl, n_seq, seq_len = 64, 20, 64, 128
    rows: list[dict[str, Any]] = []

    def row(**kw: Any) -> None:
        base = {c: np.nan for c in COLUMNS}
        base.update(status="ok", note="", ci_method="", n_controls=np.nan)
        base.update(kw)
        rows.append(base)

    for model, objective in models:
        strength = 1.0 if objective == "clm" else 0.3
        for step in STEPS:
            decay = 1.0 - 0.45 * (step / 400) ** 0.8
            for layer in (0, 1):
                failed = with_failed and objective == "mlm" and step == 400 and layer == 1
                unit = dict(
                    model=model,
                    objective=objective,
                    checkpoint=f"step{step}",
                    step=step,
                    phase=PHASE[step],
                    layer=layer,
                    site=f"layers.{layer}.resid_post",
                    dim=d,
                    proxy="pca",
                    n_sequences=n_seq,
                    n_tokens=n_seq * seq_len,
                )
                for k in (4, 8):
                    kd = k / d
                    oracle = min(0.95, 0.55 + 0.25 * k / 8 + 0.03 * layer + rng.normal(0, 0.01))
                    e_u = kd + (oracle - kd) * min(0.95, strength * decay * (0.55 + 0.1 * layer) + rng.normal(0, 0.02))
                    e_u = float(np.clip(e_u, kd * 1.02, oracle))
                    if failed:
                        reason = "non-finite gradients (NaN) in 3 of 64 sequences; unit skipped"
                        for metric, control in (("oracle_fraction", "none"), ("anisotropy_capture", "none")):
                            row(**unit, rank=k, control=control, metric=metric, status="failed", note=reason)
                        for control in ("normal", "haar"):
                            for metric in (
                                "energy_fraction",
                                "energy_ratio",
                                "log2_energy_ratio",
                                "delta_isoscore_star",
                                "hedges_g",
                            ):
                                row(
                                    **unit,
                                    rank=k,
                                    control=control,
                                    metric=metric,
                                    status="failed",
                                    note=reason,
                                    n_controls=n_ctrl,
                                )
                        continue
                    se = 0.04 + 0.02 * (objective == "mlm")
                    row(
                        **unit,
                        rank=k,
                        control="none",
                        metric="oracle_fraction",
                        estimate=oracle,
                        ci_low=oracle - 0.02,
                        ci_high=min(1.0, oracle + 0.02),
                        ci_method="bca",
                    )
                    cap = (e_u - kd) / (oracle - kd)
                    row(
                        **unit,
                        rank=k,
                        control="none",
                        metric="anisotropy_capture",
                        estimate=cap,
                        ci_low=cap - 0.05,
                        ci_high=cap + 0.05,
                        ci_method="bca",
                    )
                    for control in ("normal", "haar"):
                        c_mean = (kd * (1 - e_u) * d / (d - k) if control == "normal" else kd) * (
                            1 + rng.normal(0, 0.03)
                        )
                        c_sd = c_mean * 0.18
                        ratio = e_u / c_mean
                        method = "bca" if (layer + k + step // 100) % 5 else "percentile"
                        note = (
                            ""
                            if method == "bca"
                            else "BCa acceleration undefined (degenerate jackknife); percentile CI"
                        )
                        common = dict(
                            **unit,
                            rank=k,
                            control=control,
                            n_controls=n_ctrl,
                            control_mean=c_mean,
                            control_sd=c_sd,
                            ci_method=method,
                            note=note,
                        )
                        p_mc = 1 / (n_ctrl + 1) if e_u > c_mean + 2 * c_sd else 0.38
                        z = (e_u - c_mean) / c_sd
                        row(
                            **common,
                            metric="energy_fraction",
                            estimate=e_u,
                            ci_low=e_u * (1 - se),
                            ci_high=e_u * (1 + se),
                            p_value=p_mc,
                            effect_size=z,
                        )
                        p_perm = 1 / 10001 if ratio > 1.5 else 0.21
                        for metric, est, lo, hi in (
                            ("energy_ratio", ratio, ratio * math.exp(-2 * se), ratio * math.exp(2 * se)),
                            (
                                "log2_energy_ratio",
                                math.log2(ratio),
                                math.log2(ratio) - 2 * se / math.log(2),
                                math.log2(ratio) + 2 * se / math.log(2),
                            ),
                        ):
                            row(
                                **common,
                                metric=metric,
                                estimate=est,
                                ci_low=lo,
                                ci_high=hi,
                                p_value=p_perm,
                                effect_size=math.log2(ratio),
                            )
                        iso_p = 0.12 * strength * decay * (1 + 0.1 * layer) * (k / 8) ** 0.5
                        iso_c = 0.004 * k / 8
                        row(
                            **{**common, "control_mean": iso_c, "control_sd": 0.003},
                            metric="delta_isoscore_star",
                            estimate=iso_p,
                            ci_low=iso_p - 0.01,
                            ci_high=iso_p + 0.01,
                            p_value=p_mc,
                            effect_size=(iso_p - iso_c) / 0.003,
                        )
                        g = 2.5 * strength * decay + rng.normal(0, 0.1)
                        row(
                            **common,
                            metric="hedges_g",
                            estimate=g,
                            ci_low=g - 0.4,
                            ci_high=g + 0.4,
                            p_value=p_perm,
                            effect_size=g,
                        )
                if with_buckets and not failed:
                    for b, mult in (("q1", 1.6), ("q2", 1.2), ("q3", 0.9), ("q4", 0.7)):
                        r = (1 + 9 * strength * decay) * mult
                        row(
                            **unit,
                            rank=8,
                            control="normal",
                            metric="energy_ratio",
                            estimate=r,
                            ci_low=r * 0.85,
                            ci_high=r * 1.15,
                            ci_method="percentile",
                            n_controls=n_ctrl,
                            freq_bucket=b,
                        )
                    rho = -0.5 * strength * decay + rng.normal(0, 0.03)
                    row(
                        **unit,
                        rank=8,
                        control="none",
                        metric="freq_distance_spearman",
                        estimate=rho,
                        ci_low=rho - 0.08,
                        ci_high=rho + 0.08,
                        ci_method="bca",
                    )

    df = pd.DataFrame(rows)
    fam = (df["metric"] == "energy_ratio") & df["p_value"].notna()
    if "freq_bucket" in df.columns:
        fam &= df["freq_bucket"].isna()
    df.loc[fam, "p_adjusted"] = _holm(df.loc[fam, "p_value"].to_numpy())
    for metric in ("log2_energy_ratio", "hedges_g"):
        sel = (df["metric"] == metric) & df["p_value"].notna()
        df.loc[sel, "p_adjusted"] = _holm(df.loc[sel, "p_value"].to_numpy())
    mc = df["metric"].isin(["energy_fraction", "delta_isoscore_star"]) & df["p_value"].notna()
    df.loc[mc, "p_adjusted"] = _holm(df.loc[mc, "p_value"].to_numpy())
    extra = [c for c in df.columns if c not in COLUMNS]
    return df[COLUMNS + extra]


PROTOCOL_YAML = """
anistat_protocol: 1
name: NAME
description: Do PCA proxies fitted early in training capture more true-gradient energy than matched random subspaces?
seed: 0
data: {source: builtin, seq_len: 128, n_fit_sequences: 64, n_test_sequences: 64}
models:
  - {name: tiny-gpt2, source: builtin, architecture: gpt2, hidden_size: 64, num_layers: 2, num_heads: 2,
     train: {steps: 400, checkpoints: [0, 100, 200, 400]}}
  - {name: tiny-bert, source: builtin, architecture: bert, hidden_size: 64, num_layers: 2, num_heads: 2,
     train: {steps: 400, checkpoints: [0, 100, 200, 400]}}
sites: {kind: residual, layers: all}
proxies: {methods: [pca], ranks: [4, 8], fit_window: 0.5}
controls: {kinds: [normal, haar], n: 20}
stats: {alpha: 0.05, n_bootstrap: 2000, ci_level: 0.95, ci_method: bca, n_permutations: 10000,
        multiplicity: holm, family: run, isoscore_c0: scaled_identity, isoscore_zeta: 0.5}
"""


def make_protocol(
    name: str = "quickstart-tiny",
    title: str = "Tangent proxies vs random controls in tiny models",
    description: str | None = None,
    **sections: Any,
):
    """The (real, validated) protocol the synthetic results pretend to come from."""
    import yaml

    from anistat.protocol import parse_protocol

    data = yaml.safe_load(PROTOCOL_YAML.replace("NAME", name))
    data["report"] = {"title": title}
    if description is not None:
        data["description"] = description
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_protocol(data)


def make_manifest() -> dict[str, Any]:
    """Manifest fields other than the protocol (which `make_inputs` adds from `make_protocol`)."""
    return {
        "protocol_sha256": "3f1c0d5e9a7b2c4d6e8f00112233445566778899aabbccddeeff001122334455",
        "versions": {
            "anistat": "0.1.0",
            "python": "3.11.9",
            "torch": "2.13.0",
            "transformers": "4.57.0",
            "numpy": "2.3.1",
            "scipy": "1.16.0",
        },
        "device": "cpu",
        "dtype": "float32",
        "started_at": "2026-05-01T10:00:00Z",
        "finished_at": "2026-05-01T10:03:12Z",
        "units": [
            {"id": f"{m}/step{s}/layers.{layer}", "status": "ok", "note": "", "seconds": 1.5 + layer}
            for m in ("tiny-gpt2", "tiny-bert")
            for s in STEPS
            for layer in (0, 1)
        ],
        "warnings": ["Only 20 controls: the smallest attainable Monte-Carlo p is 1/21 = 0.048."],
    }


def split_buckets(results: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Move per-frequency-bucket rows (``freq_bucket``) out of the results into frequency.csv
    form (``bucket`` column), as the pipeline writes them."""
    if "freq_bucket" not in results.columns:
        return results, pd.DataFrame()
    is_bucket = results["freq_bucket"].notna() & (results["freq_bucket"].astype(str) != "")
    buckets = results[is_bucket].rename(columns={"freq_bucket": "bucket"})
    return results[~is_bucket].drop(columns=["freq_bucket"]), buckets


def make_inputs(
    results: pd.DataFrame,
    *,
    manifest: dict[str, Any] | None = None,
    protocol=None,
    claims: list[dict] | None = None,
    extras: dict[str, Any] | None = None,
):
    """ReportInputs through the one adapter (`anistat.bundle.report_inputs`)."""
    import dataclasses

    from anistat.bundle import report_inputs

    protocol = protocol or make_protocol()
    extras = extras or {}
    manifest = dict(make_manifest() if manifest is None else manifest)
    manifest["protocol"] = protocol.normalised()
    results, buckets = split_buckets(results)
    frequency = extras.get("frequency", pd.DataFrame())
    if len(buckets):
        frequency = pd.concat([frequency, buckets], ignore_index=True)
    inputs = report_inputs(
        protocol,
        results,
        manifest,
        frequency=frequency,
        claims=claims or [],
        concept_cards=extras.get("concept_cards", []),
    )
    return dataclasses.replace(inputs, calibration=extras.get("calibration"), control_draws=extras.get("control_draws"))


def make_claims() -> list[dict[str, Any]]:
    return [
        {
            "id": "decoder-enrichment",
            "statement": "Energy ratio > 1 in every decoder unit (Holm, α = 0.05)",
            "passed": True,
            "evidence": {"units": 16, "significant": 16, "min_ratio": 3.9},
        },
        {
            "id": "isotropy",
            "statement": "Removing the proxy raises IsoScore* more than controls",
            "passed": True,
            "evidence": "median ΔIsoScore* 0.08 vs 0.003",
        },
        {
            "id": "encoder-weaker",
            "statement": "The effect is weaker late than early in encoders",
            "passed": False,
            "evidence": {"early_median_log2": 1.2, "late_median_log2": 1.3},
        },
    ]


def make_extras() -> dict[str, Any]:
    calib = []
    for test, _kind in (("monte_carlo_p", "rejection"), ("sign_flip", "rejection")):
        for a in (0.01, 0.05, 0.1, 0.2):
            calib.append(
                {
                    "test": test,
                    "nominal": a,
                    "observed": a * (1.0 + (0.05 if test == "sign_flip" else -0.04) * (a > 0.02)),
                    "mcse": math.sqrt(a * (1 - a) / 2000),
                    "n_sim": 2000,
                }
            )
    for lvl in (0.8, 0.9, 0.95):
        calib.append(
            {
                "test": "bootstrap_ci_coverage",
                "nominal": lvl,
                "observed": lvl - 0.01,
                "mcse": math.sqrt(lvl * (1 - lvl) / 2000),
                "n_sim": 2000,
            }
        )
    cards = [
        {
            "model": "tiny-gpt2",
            "checkpoint": "step100",
            "layer": 1,
            "proxy": "pca",
            "rank": 4,
            "direction": i,
            "top_tokens": toks,
            "contexts": ctx,
        }
        for i, (toks, ctx) in enumerate(
            [
                (
                    ["\u0120the", "\u0120a", "\u0120of", ",", "."],
                    ["the module <b>returns</b> a list", "a value of type int"],
                ),
                (["def", "class", "return", "\u010a"], ["def f(x): return x & y", "class A: pass  # 100% done"]),
            ]
        )
    ]
    frequency = pd.DataFrame(
        [
            {
                "model": model,
                "checkpoint": checkpoint,
                "site": site,
                "bucket": "all",
                "metric": metric,
                "estimate": estimate,
                "ci_low": estimate - 0.1,
                "ci_high": estimate + 0.1,
                "ci_method": "bca",
                "p_value": 0.01,
                "note": "40 token types",
            }
            for model in ("tiny-gpt2", "tiny-bert")
            for checkpoint in ("step0", "step400")
            for site in ("residual.0", "residual.1")
            for metric, estimate in (("spearman_logfreq_distance", -0.42), ("pearson_logfreq_distance", -0.31))
        ]
    )
    return {"concept_cards": cards, "calibration": pd.DataFrame(calib), "frequency": frequency}


# ------------------------------------------------------------------ checks of the generator


def test_fixture_follows_contract():
    df = make_results(with_buckets=True)
    assert list(df.columns[: len(COLUMNS)]) == COLUMNS
    assert 300 <= len(df[df["freq_bucket"].isna()]) <= 420
    ok = df[(df.status == "ok") & (df.metric == "energy_ratio") & df.freq_bucket.isna()]
    ef = df[(df.status == "ok") & (df.metric == "energy_fraction")]
    np.testing.assert_allclose(ok.estimate.to_numpy(), (ef.estimate / ef.control_mean).to_numpy())
    assert set(df.phase) == {"early", "late"}
    failed = df[df.status == "failed"]
    assert len(failed) and failed.estimate.isna().all() and (failed.note != "").all()


def null_check_results(proxy: str) -> pd.DataFrame:
    """The energy-fraction rows of a null-check run of 200 units: one uninformative proxy per unit, tested
    against ``normal`` and ``haar`` controls; the exact test's p-values are uniform (calibrated),
    the paper's convention draws ``U²`` against ``normal`` controls (anti-conservative)."""
    rng = np.random.default_rng(0)
    rows = []
    for unit in range(200):
        p_exact, p_paper = rng.uniform(), rng.uniform() ** 2
        for control in ("normal", "haar"):
            rows.append(
                {
                    "model": "m",
                    "checkpoint": "step0",
                    "layer": unit % 4,
                    "site": f"residual.{unit % 4}",
                    "rank": unit,
                    "proxy": proxy,
                    "control": control,
                    "metric": "energy_fraction",
                    "estimate": 0.1,
                    "p_value": p_exact,
                    "p_test": "haar_monte_carlo",
                    "p_value_paper": p_paper if control == "normal" else p_exact,
                    "status": "ok",
                }
            )
    return pd.DataFrame(rows)
