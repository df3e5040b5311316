"""Degenerate data through `analyze_units`: every unit gets an answer — failed with its reason, or
rows whose intervals lie in their parameter's range, withheld (NaN with the reason) where the
resampling units are too few, and a note beside every p-value that cannot be computed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import MINI_PROTOCOL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anistat import stats
from anistat.analyze import analyze_units
from anistat.collect import BasisColumn, UnitArtifact, UnitKey
from anistat.protocol import Protocol
from anistat.stats import (
    FALLBACK_CODES,
    MIN_RESAMPLING_UNITS,
    analyze_energy,
    control_energy_moments,
    expected_control_energy,
    fallbacks,
)
from anistat.stats.fallbacks import WITHHELD_FEW_UNITS


def _protocol(ranks, kinds=("normal", "haar"), **stats) -> Protocol:
    raw = yaml.safe_load(MINI_PROTOCOL)
    raw["proxies"]["ranks"] = list(ranks)
    raw["controls"]["kinds"] = list(kinds)
    raw["stats"].update({"n_bootstrap": 200, "n_null_draws": 199, **stats})
    return Protocol.model_validate(raw)


def _artifact(d=8, ranks=(2,), s=30, t=6, n_documents=10, seed=0, zero=False, basis=None) -> UnitArtifact:
    """A unit measured the way the collector measures one: per-sequence energies of each proxy
    (its own columns, as given) and the second moments of the same gradients."""
    rng = np.random.default_rng(seed)
    grads = rng.standard_normal((s, t, d)) / np.arange(1, d + 1) * rng.lognormal(0, 0.3, (s, 1, 1))
    if zero:
        grads[:] = 0.0
    bases, stack, proxies = [], [], {}
    for rank in ranks:
        u = basis if basis is not None else np.linalg.qr(rng.standard_normal((d, rank)))[0]
        bases.append(BasisColumn("pca", rank, "proxy", -1))
        stack.append(u)
        proxies[("pca", rank)] = u
    acts = rng.standard_normal((s * t, d))
    return measured_unit(grads, acts, seed, np.arange(s) % n_documents, bases, stack, proxies)


def measured_unit(grads, acts, seed: int, documents, bases, columns, proxy_bases) -> UnitArtifact:
    """The unit ``residual.<seed>`` of gradients ``grads`` (S, T, d) and activations ``acts``
    (S·T rows of d) as the collector measures it: the per-sequence energy ``Σ_t ‖g_stᵀB‖²`` in
    each basis of ``columns`` (the (d, r) blocks named by ``bases``), the second moments and sums
    of both, the sequences' ``documents``; ``proxy_bases`` maps (method, rank) to its basis."""
    n_sequences, n_tokens, d = grads.shape
    energy = np.stack([((grads @ b) ** 2).sum(axis=(1, 2)) for b in columns], axis=1)  # (S, n_bases)
    flat_g, flat_a = grads.reshape(-1, d), acts.reshape(-1, d)

    def moments(x):
        return {"count": x.shape[0], "sum": x.sum(0), "outer": x.T @ x}

    return UnitArtifact(
        key=UnitKey("m", "clm", "step0", 0, "early", seed, f"residual.{seed}"),
        dim=d,
        bases=bases,
        n_tokens=np.full(n_sequences, n_tokens),
        sequence_documents=documents,
        total_energy=(grads**2).sum(axis=(1, 2))[:, None],
        energy=energy[:, None, :],
        delta_isoscore_star=np.zeros(len(bases)),
        gradient_moments=moments(flat_g),
        activation_moments=moments(flat_a),
        gradient_unit_sum=flat_g.sum(0),
        activation_unit_sum=flat_a.sum(0),
        type_count=np.zeros(5, dtype=np.int64),
        type_rms_distance=np.full(5, np.nan),
        proxy_bases=proxy_bases,
    )


def _rows(results, **where):
    mask = np.ones(len(results), dtype=bool)
    for column, value in where.items():
        mask &= (results[column] == value).to_numpy()
    return results[mask]


# -- reproductions ------------------------------------------------------------------------------


def test_a_unit_with_zero_gradient_energy_fails_alone():
    healthy, dead = _artifact(seed=0), _artifact(seed=1, zero=True)
    results = analyze_units([healthy, dead], _protocol([2]))
    failed = _rows(results, layer=1)
    assert len(failed) and (failed["status"] == "failed").all()
    assert failed["note"].str.contains("zero gradient energy").all()
    assert dead.status == "failed"  # the run's unit records (manifest, exit code 3) see it
    ok = _rows(results, layer=0)
    assert (ok["status"] == "ok").all() and np.isfinite(_rows(ok, metric="energy_fraction")["p_value"]).all()


def test_duplicated_proxy_columns_are_refused_with_their_numerical_rank():
    u1 = np.linalg.qr(np.random.default_rng(5).standard_normal((8, 1)))[0]
    results = analyze_units([_artifact(basis=np.hstack([u1, u1]))], _protocol([2]))
    assert (results["status"] == "failed").all()
    assert results["note"].str.contains("numerical rank 1 of 2").all()


def test_intervals_are_withheld_below_the_fewest_resampling_units():
    results = analyze_units([_artifact(s=6, n_documents=2)], _protocol([2]))
    energy = results[results["metric"].isin(["energy_fraction", "energy_ratio", "hedges_g"])]
    assert len(energy) == 6
    assert energy[["ci_low", "ci_high", "se"]].isna().all().all()
    assert energy["note"].str.contains(f"2 documents, fewer than the {MIN_RESAMPLING_UNITS} resampling units").all()
    data_test = _rows(results, metric="hedges_g")
    assert data_test["p_value"].isna().all() and data_test["note"].str.contains("data test withheld").all()
    # the exact test does not resample the data: it stays
    assert np.isfinite(_rows(results, metric="energy_fraction")["p_value"]).all()


def test_fewer_tokens_than_dimensions_keep_the_haar_ratio_in_its_range():
    d, k = 16, 2
    few = analyze_units([_artifact(d=d, ranks=(k,), s=6, t=1, n_documents=6)], _protocol([k]))
    ratio = _rows(few, metric="energy_ratio", control="haar").iloc[0]
    assert np.isnan(ratio["ci_low"]) and np.isnan(ratio["ci_high"]) and "6 documents, fewer than" in ratio["note"]
    results = analyze_units([_artifact(d=d, ranks=(k,), s=12, t=1, n_documents=12)], _protocol([k]))
    ratio = _rows(results, metric="energy_ratio", control="haar").iloc[0]
    assert 0.0 <= ratio["ci_low"] <= ratio["estimate"] <= ratio["ci_high"] <= d / k
    fraction = _rows(results, metric="energy_fraction", control="haar").iloc[0]
    assert 0.0 <= fraction["ci_low"] <= fraction["ci_high"] <= 1.0


def _near_ceiling(seed=0, s=12):
    """A proxy holding nearly all of the energy, with one heavy unit: the bootstrap-t interval of
    the fraction passes 1 unless it is clipped."""
    rng = np.random.default_rng(seed)
    t = rng.lognormal(0, 1.0, s)
    p = t * rng.uniform(0.97, 1.0, s)
    p[0] = 0.3 * t[0]
    return p, t


def test_fraction_interval_is_clipped_at_one_not_at_the_sample_oracle():
    p, t = _near_ceiling()
    k, d = 2, 8
    res = analyze_energy(
        p,
        t,
        expected_control_energy("haar", p, t, k, d),
        rank=k,
        dim=d,
        null_fractions=np.full(9, 0.25),
        oracle_fraction=0.96,
        seed=1,
    )
    fraction = res["energy_fraction"]
    assert fraction.ci_high == 1.0 and "CI clipped to the energy fraction's range [0, 1]" in fraction.note
    # above the sample oracle: said, not clipped (E*_k only estimates the population ceiling)
    assert fraction.ci_high > 0.96 and "passes the sample oracle fraction E*_k = 0.96" in fraction.note
    ratio = res["energy_ratio"]
    assert ratio.ci_high == d / k and "energy ratio's range [0, 4]" in ratio.note


def test_a_deterministic_control_gets_exact_moments_and_no_z():
    d, k = 8, 4  # normal controls at k = d/2: the whole complement
    results = analyze_units([_artifact(d=d, ranks=(k,))], _protocol([k]))
    fraction = _rows(results, metric="energy_fraction", control="normal").iloc[0]
    assert fraction["control_sd"] == 0.0
    assert fraction["control_mean"] == pytest.approx(1.0 - fraction["estimate"], abs=1e-12)
    z = _rows(results, metric="z", control="normal").iloc[0]
    assert np.isnan(z["estimate"]) and "z undefined: the normal control's sd is 0" in z["note"]
    delta = _rows(results, metric="delta_isoscore_star", control="normal").iloc[0]
    assert delta["control_sd"] == 0.0 and np.isnan(delta["effect_size"]) and "whole complement" in delta["note"]
    moments = control_energy_moments("normal", 1, 2, 3.0, 5.0, 1.0, 1.0, 1.0)
    assert (moments.mean, moments.sd) == (2.0 / 3.0, 0.0)  # d = 2, k = 1: tr A / tr M exactly


def test_a_missing_isoscore_p_value_says_why():
    d, k = 6, 5  # d − k = 1: IsoScore* of one remaining dimension is not defined
    results = analyze_units([_artifact(d=d, ranks=(k,))], _protocol([k], kinds=["haar"]))
    delta = _rows(results, metric="delta_isoscore_star")
    assert len(delta) and delta["p_value"].isna().all()
    assert delta["note"].str.contains("d − k = 1").all()


# -- property --------------------------------------------------------------------------------------


#: Each parameter's range: estimate and interval must lie inside (NaN allowed where withheld).
def _ranges(row):
    d, k = int(row["dim"]), int(row["rank"])
    metric, control = row["metric"], row["control"]
    if metric == "energy_fraction":
        return 0.0, 1.0
    if metric == "energy_ratio":
        return 0.0, (d / k if control == "haar" else np.inf)
    if metric == "log2_energy_ratio":
        return -np.inf, (np.log2(d / k) if control == "haar" else np.inf)
    if metric == "anisotropy_capture":
        return -np.inf, 1.0
    return -np.inf, np.inf


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(["zero", "duplicated", "documents", "tokens", "half", "one_left", "plain"]),
    n_documents=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_degenerate_inputs_get_honest_rows(case, n_documents, seed):
    d, ranks, s, t, basis = 8, (2,), 12, 4, None
    if case == "duplicated":
        u1 = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, 1)))[0]
        basis = np.hstack([u1, u1])
    elif case == "tokens":
        s, t = 4, 1  # 4 tokens < d
    elif case == "half":
        ranks = (d // 2,)
    elif case == "one_left":
        ranks = (d - 1,)
    artifact = _artifact(
        d=d,
        ranks=ranks,
        s=s,
        t=t,
        n_documents=n_documents if case != "plain" else s,
        seed=seed,
        zero=case == "zero",
        basis=basis,
    )
    protocol = _protocol(ranks, kinds=["haar"] if case == "one_left" else ["normal", "haar"])
    results = analyze_units([artifact], protocol)  # no exception escapes
    assert len(results)
    failed = results["status"] == "failed"
    assert (results.loc[failed, "note"].str.len() > 0).all()
    if case in ("zero", "duplicated"):
        assert failed.all()
    tested = results[~failed & (results["p_test"] != "")]
    missing = tested[tested["p_value"].isna()]
    silent = missing[~missing["note"].str.contains("withheld|no p-value")]
    assert silent.empty, silent[["metric", "control", "note"]]
    for _, row in results[
        ~failed & results["metric"].isin(["energy_fraction", "energy_ratio", "log2_energy_ratio", "anisotropy_capture"])
    ].iterrows():
        low, high = _ranges(row)
        for column in ("estimate", "ci_low", "ci_high"):
            value = row[column]
            assert np.isnan(value) or low - 1e-12 <= value <= high + 1e-12, (row["metric"], column, value)
        if np.isnan(row["ci_low"]) or np.isnan(row["ci_high"]):
            said = ("withheld", "undefined", "unbounded")  # an EL end the data cannot bound has no log2
            assert any(word in row["note"] for word in said) or row["ci_method"] == "none"
    # the machine-readable code says what the note says, from the closed vocabulary only
    codes = results["fallback"].str.split(";").explode()
    assert set(codes[codes != ""]) <= set(FALLBACK_CODES)
    withheld = ~failed & results["note"].str.contains("withheld")
    assert results.loc[withheld, "fallback"].str.contains(WITHHELD_FEW_UNITS).all()
    unbounded = ~failed & results["note"].str.contains("end unbounded")
    assert results.loc[unbounded, "fallback"].str.contains(fallbacks.CI_UNBOUNDED).all()


# -- fallback codes ------------------------------------------------------------------------------


def _codes(frame_or_result) -> set[str]:
    """Every fallback code in a results table's column, or in one result's field."""
    joined = frame_or_result["fallback"].tolist() if hasattr(frame_or_result, "columns") else [frame_or_result.fallback]
    return {code for text in joined for code in text.split(";") if code}


def _produced_codes() -> dict[str, set[str]]:
    """Each degenerate input of this file and the fallback codes it produces (results rows through
    `analyze_units`, or the statistics' own results where no unit can reach the case)."""
    rng = np.random.default_rng(3)
    p, t = _near_ceiling()
    clipped = analyze_energy(p, t, expected_control_energy("haar", p, t, 2, 8), rank=2, dim=8,
                             null_fractions=np.full(9, 0.25), seed=1, ci_method="studentized")  # fmt: skip
    t = rng.uniform(1.0, 2.0, 12)  # a proxy with no energy: the log-scale interval and test undefined
    empty = analyze_energy(
        np.zeros(12), t, t / 4, rank=2, dim=8, null_fractions=np.full(9, 0.25), seed=1, ci_method="studentized"
    )
    three = analyze_energy(
        t[:3] / 2,
        t[:3],
        t[:3] / 4,
        rank=2,
        dim=8,
        null_fractions=[0.2],
        min_resampling_units=2,
        ci_method="studentized",
    )
    replicates = np.r_[rng.normal(1.0, 0.1, 40), np.nan]
    dominant = np.r_[100.0, np.ones(11)]  # Kish n_eff ≈ 1.2: the EL statistic cannot reach its χ² quantile
    return {
        "2 documents": _codes(analyze_units([_artifact(s=6, n_documents=2)], _protocol([2]))),
        "one document": _codes(analyze_units([_artifact(n_documents=1)], _protocol([2]))),
        "normal control at k = d/2": _codes(
            _rows(analyze_units([_artifact(d=8, ranks=(4,))], _protocol([4])), control="normal", metric="z")
        ),
        "d − k = 1": _codes(
            _rows(
                analyze_units([_artifact(d=6, ranks=(5,))], _protocol([5], kinds=["haar"])),
                metric="delta_isoscore_star",
            )
        ),
        "fraction near 1": _codes(clipped["energy_fraction"]) | _codes(clipped["anisotropy_capture"]),
        "zero proxy energy": _codes(empty["energy_fraction"]) | _codes(empty["hedges_g"]),
        "3 resampling units": _codes(three["hedges_g"]),
        "a non-finite resample": _codes(stats.ci_from_replicates(1.0, replicates, method="percentile")),
        "no finite resample": _codes(stats.ci_from_replicates(1.0, np.full(5, np.nan), method="percentile")),
        "one dominant document (balanced EL)": _codes(
            stats.ratio_el_interval(dominant * np.r_[0.5, np.full(11, 0.1)], dominant, 0.95, "balanced")
        ),
        "a zero-SE resample (bootstrap-t)": _codes(
            stats.ci_from_replicates(
                1.0, replicates[:40], method="studentized", se=0.1, replicate_se=np.r_[np.full(39, 0.1), 0.0]
            )
        ),
    }


def test_each_fallback_code_is_produced_by_a_real_degenerate_input():
    produced = _produced_codes()
    expected = {
        "2 documents": {WITHHELD_FEW_UNITS},
        "one document": {fallbacks.SEQUENCES_RESAMPLED},
        "normal control at k = d/2": {fallbacks.ZERO_CONTROL_SD},
        "d − k = 1": {fallbacks.NO_EXACT_TEST},
        "fraction near 1": {fallbacks.CI_CLIPPED, fallbacks.CAPTURE_UNDEFINED},
        "zero proxy energy": {fallbacks.CI_METHOD_FALLBACK, fallbacks.NO_DATA_TEST},
        "3 resampling units": {fallbacks.NO_INTERVAL},
        "a non-finite resample": {fallbacks.RESAMPLES_DROPPED},
        "no finite resample": {fallbacks.NO_INTERVAL},
        "a zero-SE resample (bootstrap-t)": {fallbacks.RESAMPLES_DROPPED},
        "one dominant document (balanced EL)": {fallbacks.CI_UNBOUNDED},
    }
    for case, codes in expected.items():
        assert codes <= produced[case], (case, produced[case])
    assert set().union(*produced.values()) == set(FALLBACK_CODES)


def test_a_healthy_unit_has_no_fallback_and_the_column_follows_the_note():
    results = analyze_units([_artifact(s=40, n_documents=40)], _protocol([2]))
    assert list(results.columns).index("fallback") == list(results.columns).index("note") + 1
    quiet = results[~results["note"].str.contains("fell back|clipped|withheld|undefined|no p-value|dropped")]
    assert len(quiet) and (quiet["fallback"] == "").all()
    assert (_rows(results, metric="oracle_fraction")["fallback"] == "").all()


def test_the_fallback_vocabulary_is_documented():
    docs = Path(__file__).resolve().parents[2] / "docs"
    page = (docs / "results-columns.md").read_text(encoding="utf-8")
    assert "<!-- generated: fallback-codes -->" in page and "| `fallback` |" in page
    spec = importlib.util.spec_from_file_location("anistat_docs_hooks", docs / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    table = hooks.fallback_codes_markdown()
    for code, meaning in FALLBACK_CODES.items():
        assert f"| `{code}` | {meaning} |" in table
    assert (
        fallbacks.join_fallbacks("ci_clipped", "", "ci_method_fallback;ci_clipped") == "ci_clipped;ci_method_fallback"
    )
    with pytest.raises(ValueError, match="unknown fallback code 'clipped'"):
        fallbacks.join_fallbacks("clipped")
