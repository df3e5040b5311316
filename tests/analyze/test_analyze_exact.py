"""The analysis stage on a synthetic unit: the exact test shared by every control kind, the
closed-form and drawn references, document resampling, and the Monte-Carlo sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from conftest import MINI_PROTOCOL
from test_analyze_degenerate import measured_unit

from anistat.analyze import analyze_run, null_settings, planned_tests, unit_rows
from anistat.collect import BasisColumn, UnitArtifact, UnitKey
from anistat.geometry import HaarDiagonalStream, SpectralFrame, draw_controls
from anistat.protocol import Protocol
from anistat.seeding import derive_seed
from anistat.stats import monte_carlo_pvalue, sequential_monte_carlo_pvalue

D, K, S, T = 12, 2, 30, 8


def _protocol(**stats) -> Protocol:
    raw = yaml.safe_load(MINI_PROTOCOL)
    raw["proxies"]["ranks"] = [K]
    raw["stats"].update({"n_bootstrap": 200, **stats})
    return Protocol.model_validate(raw)


def _artifact(kinds_projected=(), seed=0, n_controls=9) -> UnitArtifact:
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.arange(1, D + 1)
    grads = rng.standard_normal((S, T, D)) * scale * rng.lognormal(0, 0.3, (S, 1, 1))
    acts = rng.standard_normal((S, T, D))
    u = np.linalg.qr(rng.standard_normal((D, K)))[0]
    bases = [BasisColumn("pca", K, "proxy", -1)]
    stack = [u]
    for kind in kinds_projected:
        q = draw_controls(kind, u, n_controls, seed=3).numpy()
        bases += [BasisColumn("pca", K, kind, j) for j in range(n_controls)]
        stack += list(q)
    return measured_unit(grads, acts, seed, np.repeat(np.arange(10), 3), bases, stack, {("pca", K): u})


def _rows(rows, **where):
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def test_one_exact_test_behind_every_energy_metric_and_kind():
    protocol = _protocol(n_null_draws=999)
    artifact = _artifact()
    rows, _ = unit_rows(artifact, protocol)
    energy_rows = [r for r in rows if r.get("p_test") == "haar_monte_carlo" and r["metric"] != "delta_isoscore_star"]
    assert {r["control"] for r in energy_rows} == {"normal", "haar"}
    assert len({r["p_value"] for r in energy_rows}) == 1 and len({r["_test"] for r in energy_rows}) == 1
    # reproduce it independently: the run's Haar stream for this width (float64 throughout), read
    # against the unit's eigenvalues, counted with the sequential rule
    frame = SpectralFrame(artifact.gradient_moments["outer"])
    observed = frame.energy_fractions(frame.traces_of(artifact.proxy_bases[("pca", K)]))[0]
    stream = HaarDiagonalStream(D, [K], derive_seed(protocol.seed, "haar-null", D), dtype=torch.float64)
    weights = frame.eigenvalues / frame.eigenvalues.sum()
    null = torch.cat([stream.chunk(i).diagonals[K] @ weights for i in range(8)])[:999].numpy()
    p, used = sequential_monte_carlo_pvalue(observed, null, protocol.stats.null_stop_exceedances)
    assert energy_rows[0]["p_value"] == p and energy_rows[0]["n_controls"] == used
    assert monte_carlo_pvalue(observed, null) == pytest.approx(p, abs=0.05)  # h/L vs the fixed-n p
    # closed-form references, documents as the resampling unit
    p, t = artifact.energy[:, 0, 0], artifact.total_energy[:, 0]
    (haar_ratio,) = _rows(rows, metric="energy_ratio", control="haar")
    (normal_ratio,) = _rows(rows, metric="energy_ratio", control="normal")
    assert haar_ratio["estimate"] == pytest.approx(p.sum() / (K / D * t.sum()))
    assert normal_ratio["estimate"] == pytest.approx(p.sum() / (K / (D - K) * (t - p).sum()))
    assert haar_ratio["n_clusters"] == 10 and "10 documents resampled" in haar_ratio["note"]
    # haar and normal contributions are proportional: one sign-flip test for both
    flips = _rows(rows, metric="hedges_g")
    assert len({r["_test"] for r in flips}) == 1 and flips[0]["estimate"] == pytest.approx(flips[1]["estimate"])
    # the oracle fraction comes from the second moment's eigenvalues (numpy's, independently)
    ev = np.linalg.eigvalsh(artifact.gradient_moments["outer"])
    (oracle,) = _rows(rows, metric="oracle_fraction")
    assert oracle["estimate"] == pytest.approx(ev[-K:].sum() / ev.sum(), rel=1e-12)
    (capture,) = _rows(rows, metric="anisotropy_capture", control="haar")
    assert capture["estimate"] == pytest.approx((observed - K / D) / (oracle["estimate"] - K / D), rel=1e-9)


def test_drawn_reference_is_the_papers_conditional_ratio():
    protocol = _protocol(n_null_draws=499, energy_ratio_reference="drawn")
    assert protocol.projected_control_kinds == ["normal", "haar"]
    artifact = _artifact(kinds_projected=("normal", "haar"))
    rows, _ = unit_rows(artifact, protocol)
    (ratio,) = _rows(rows, metric="energy_ratio", control="normal")
    columns = artifact.columns_for("pca", K, "normal")
    energy = artifact.energy[:, 0]
    assert ratio["estimate"] == pytest.approx(energy[:, 0].sum() / energy[:, columns].mean(axis=1).sum())
    assert "drawn normal controls (conditional on the draw)" in ratio["note"]
    # the paper's p-value: the proxy against its 9 drawn controls, beside the exact test
    t = artifact.total_energy[:, 0].sum()
    assert ratio["p_value_paper"] == monte_carlo_pvalue(energy[:, 0].sum() / t, energy[:, columns].sum(axis=0) / t)
    assert ratio["p_test"] == "haar_monte_carlo"


def test_enough_draws_for_the_family_and_sequence_option():
    protocol = _protocol(multiplicity="holm")
    artifacts = [_artifact(seed=s) for s in range(3)]
    # per unit x (proxy, rank): exact energy test, exact ΔIsoScore* test, one sign flip
    assert planned_tests(artifacts, protocol) == 9
    nulls = null_settings(artifacts, protocol)
    assert nulls.n_null_draws == 9999 and nulls.n_test_resamples >= 179
    big = _protocol(multiplicity="holm", alpha=0.0001)
    assert null_settings(artifacts, big).n_null_draws == 89999  # 9 / 0.0001 - 1
    rows, _ = unit_rows(artifacts[0], _protocol(n_null_draws=199, resampling_unit="sequence"))
    assert _rows(rows, metric="energy_ratio", control="haar")[0]["n_clusters"] == S
    analysis = analyze_run(artifacts, {}, _protocol(n_null_draws=99, multiplicity="holm"), frequency=False)
    results = analysis.results
    assert analysis.null_settings["n_null_draws"] == 99  # an explicit setting is used as given
    assert any("Haar null draws give a p-value floor" in w for w in analysis.warnings)
    assert str(results["rank"].dtype) == "Int64" and str(results["n_clusters"].dtype) == "Int64"


def test_a_stream_per_test_when_asked():
    """stats.null_draws: per_test — every (unit, rank) its own stream, so tests of independent
    proxies are independent given the data (what a run's own null check assumes)."""
    raw = yaml.safe_load(MINI_PROTOCOL)
    raw["proxies"]["ranks"] = [1, K]
    raw["stats"].update({"n_bootstrap": 100, "n_null_draws": 199, "null_draws": "per_test"})
    protocol = Protocol.model_validate(raw)
    artifact = _artifact()
    u1 = np.linalg.qr(np.random.default_rng(8).standard_normal((D, 1)))[0]
    artifact.bases.insert(0, BasisColumn("pca", 1, "proxy", -1))
    artifact.proxy_bases[("pca", 1)] = u1
    grads_energy = artifact.energy  # (S, 1, n_bases): add the rank-1 proxy's column in front
    artifact.energy = np.concatenate([grads_energy[:, :, :1] * 0.3, grads_energy], axis=2)
    made = analyze_run([artifact], {}, protocol, frequency=False).null_settings
    assert made["streams"] == 2 and "draws_made" not in made  # one stream per (unit, rank)
    shared = analyze_run(
        [artifact], {}, Protocol.model_validate({**raw, "stats": {**raw["stats"], "null_draws": "shared"}})
    )
    assert list(shared.null_settings["draws_made"]) == [str(D)]


def test_frequency_buckets_have_their_own_exact_test():
    """Each frequency bucket's energy_ratio rows carry the exact Haar test of the bucket's energy
    fraction against its own gradient second moment, read off the run's stream for the width."""
    from anistat.analyze import analyze_run, frequency_rows

    protocol = _protocol(n_null_draws=299)
    rng = np.random.default_rng(4)
    grads = rng.standard_normal((S, T, D)) * (1.0 / np.arange(1, D + 1))
    bucket_of = rng.integers(0, 2, size=(S, T))
    u = np.linalg.qr(rng.standard_normal((D, K)))[0]
    total = np.stack([((grads * (bucket_of == b)[..., None]) ** 2).sum(axis=(1, 2)) for b in range(2)], axis=1)
    energy = np.stack([(((grads * (bucket_of == b)[..., None]) @ u) ** 2).sum(axis=(1, 2)) for b in range(2)], axis=1)[
        :, :, None
    ]
    flat, flat_b = grads.reshape(-1, D), bucket_of.reshape(-1)
    outers = np.stack([flat[flat_b == b].T @ flat[flat_b == b] for b in range(2)])
    moments = {"count": flat.shape[0], "sum": flat.sum(0), "outer": flat.T @ flat, "bucket_outer": outers}
    artifact = UnitArtifact(
        key=UnitKey("m", "clm", "step0", 0, "early", 0, "residual.0"),
        dim=D,
        bases=[BasisColumn("pca", K, "proxy", -1)],
        n_tokens=np.full(S, T),
        sequence_documents=np.arange(S),
        total_energy=total,
        energy=energy,
        delta_isoscore_star=np.zeros(1),
        gradient_moments=moments,
        activation_moments={"count": flat.shape[0], "sum": flat.sum(0), "outer": flat.T @ flat},
        gradient_unit_sum=flat.sum(0),
        activation_unit_sum=flat.sum(0),
        type_count=np.zeros(5, dtype=np.int64),
        type_rms_distance=np.full(5, np.nan),
        proxy_bases={("pca", K): u},
    )
    table = frequency_rows([artifact], {}, protocol)
    joint = analyze_run([artifact], {}, protocol).frequency  # the run's way: one pass over the streams
    stream = HaarDiagonalStream(D, [K], derive_seed(protocol.seed, "haar-null", D), dtype=torch.float64)
    for b in range(2):
        m = outers[b].astype(np.float32).astype(np.float64)  # the artifact stores it in float32 on disk
        observed = np.trace(u.T @ m @ u) / np.trace(m)
        lam = np.clip(np.linalg.eigvalsh(m), 0, None)
        null = torch.cat([stream.chunk(i).diagonals[K] @ torch.as_tensor(lam / lam.sum()) for i in range(3)])[:299]
        p, _ = sequential_monte_carlo_pvalue(observed, null.numpy(), protocol.stats.null_stop_exceedances)
        rows = table[(table["bucket"] == str(b)) & (table["metric"] == "energy_ratio")]
        assert len(rows) == 2 and rows["p_value"].tolist() == pytest.approx([p, p], abs=1 / 300), b
        assert "exact Haar test of the bucket" in rows["note"].iloc[0]
        assert joint[(joint["bucket"] == str(b))]["p_value"].tolist() == rows["p_value"].tolist()
