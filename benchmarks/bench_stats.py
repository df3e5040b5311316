"""P3 benchmark: the statistics engine (analysis-time null + exact test + CIs) vs the naive way.

Run:  PYTHONPATH=. python benchmarks/bench_stats.py [--quick] [--json OUT]

Part A (same inputs, side by side): synthetic anisotropic per-token gradients G (N x d) in S
sequences cut from documents, a proxy U.
  naive  — the per-token way: n Haar controls projected on every token (a loop over controls),
           energy fractions, the Monte-Carlo p-value, and scipy.stats.bootstrap (BCa, over
           sequences) of the ratio to the controls' mean.
  engine — what anistat does: the proxy's per-sequence energies and the second moment M = GᵀG
           (what collection keeps), then n Haar draws from M in O(dk²) each
           (anistat.geometry.SpectralFrame) and anistat.stats.analyze_energy (exact p, the
           default interval over documents, the data test with 9,999 bootstrap resamples).
Agreement: the energy fraction of the *same* bases evaluated per token and from M agree to
~1e-12 (relative); both p-values are exact Monte-Carlo p-values of the same null law.

Part B (scale point): `analyze_units` on synthetic units (4 096 tokens, 128 sequences in 32
documents, λ_j ∝ 1/j) at d = 768, 1024, 2048, 12 units per width sharing one stream of Haar
draws, 20 normal controls, default statistics (Holm, 9,999 draws at most); rank 8 alone, rank
128 alone and ranks 8/32/128; planted proxies (significant: every test uses all draws) and random
proxies (null: sequential stopping ends them early). Per-unit process CPU time and its ratio to
rank 8.

    PYTHONPATH=. python benchmarks/bench_stats.py --skip-a --threads 1 --json /tmp/p3.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch
from scipy import stats

from anistat.geometry import SpectralFrame
from anistat.stats import analyze_energy, expected_control_energy, monte_carlo_pvalue


def _orth(rng, lead, d, k):
    return np.linalg.qr(rng.standard_normal(lead + (d, k)))[0]


def make_gradients(rng, s, tokens, d, k):
    u = _orth(rng, (), d, k)
    scale = 1.0 / np.arange(1, d + 1)
    z = rng.standard_normal((s, 1, d)) * 0.7 + rng.standard_normal((s, tokens, d))
    z *= np.exp(0.25 * rng.standard_normal(s))[:, None, None]
    return (z * scale).reshape(-1, d), u


def naive(g, u, q, s, tokens, n_boot, seed):
    t0 = time.perf_counter()
    starts = np.arange(0, s * tokens, tokens)
    total = np.add.reduceat((g**2).sum(axis=1), starts)
    proxy = np.add.reduceat(((g @ u) ** 2).sum(axis=1), starts)
    ctrl = np.empty((s, q.shape[0]))
    for j in range(q.shape[0]):  # per-token projections, one control at a time
        ctrl[:, j] = np.add.reduceat(((g @ q[j]) ** 2).sum(axis=1), starts)
    e_u = proxy.sum() / total.sum()
    p = monte_carlo_pvalue(e_u, ctrl.sum(axis=0) / total.sum())
    cbar = ctrl.mean(axis=1)
    res = stats.bootstrap(
        (proxy, cbar),
        lambda a, b: a.sum() / b.sum(),
        paired=True,
        vectorized=False,
        n_resamples=n_boot,
        method="BCa",
        random_state=seed,
    )
    return time.perf_counter() - t0, p, (res.confidence_interval.low, res.confidence_interval.high)


def engine(g, u, s, tokens, documents, n_null, n_boot, seed):
    t0 = time.perf_counter()
    starts = np.arange(0, s * tokens, tokens)
    total = np.add.reduceat((g**2).sum(axis=1), starts)
    proxy = np.add.reduceat(((g @ u) ** 2).sum(axis=1), starts)
    frame = SpectralFrame(g.T @ g)
    k = u.shape[1]
    null = frame.energy_fractions(frame.random_traces([k], n_null, seed)[k])
    observed = float(frame.energy_fractions(frame.traces_of(u))[0])
    reference = expected_control_energy("haar", proxy, total, k, g.shape[1])
    res = analyze_energy(
        proxy,
        total,
        reference,
        rank=k,
        dim=g.shape[1],
        null_fractions=null,
        observed_fraction=observed,
        group_ids=documents,
        n_bootstrap=n_boot,
        n_test_resamples=9999,
        seed=seed,
    )
    return time.perf_counter() - t0, res.p_value, (res["energy_ratio"].ci_low, res["energy_ratio"].ci_high)


def part_a(quick: bool) -> dict:
    rng = np.random.default_rng(0)
    s, tokens, d, k = (100, 16, 64, 4) if quick else (200, 16, 128, 8)
    n_naive = 199 if quick else 999
    g, u = make_gradients(rng, s, tokens, d, k)
    documents = np.repeat(np.arange(s // 4), 4)
    q = _orth(rng, (n_naive,), d, k)
    t_naive, p_naive, ci_naive = naive(g, u, q, s, tokens, 2000, 1)
    out = {
        "shape": dict(sequences=s, tokens=tokens, d=d, k=k),
        "naive_controls": n_naive,
        "naive_seconds": t_naive,
        "naive_p": p_naive,
        "naive_ratio_ci_vs_drawn": ci_naive,
    }
    for n_null in (n_naive, 9999):
        t_engine, p_engine, ci = engine(g, u, s, tokens, documents, n_null, 2000, 1)
        out[f"engine_{n_null}_seconds"] = t_engine
        out[f"engine_{n_null}_p"] = p_engine
        out[f"engine_{n_null}_ratio_ci_vs_expected"] = ci
    frame = SpectralFrame(g.T @ g)
    direct = np.array([((g @ q[j]) ** 2).sum() for j in range(5)]) / (g**2).sum()
    from_moment = frame.energy_fractions(frame.traces_of(torch.as_tensor(q[:5])))
    out["max_relative_difference_per_token_vs_moment"] = float(np.max(np.abs(direct - from_moment) / direct))
    out["speedup_same_n"] = t_naive / out[f"engine_{n_naive}_seconds"]
    return out


def synthetic_unit(rng, d: int, ranks, *, planted: bool, layer: int, n_sequences: int = 128, tokens: int = 32):
    """A unit artifact from synthetic anisotropic gradients (λ_j ∝ 1/j, 4 096 tokens in 32
    documents) and a proxy that is either planted (the top eigenvectors of a noisy copy of the
    gradient covariance: significant, like a trained model's PCA) or Haar-random (the null)."""
    from anistat.collect import BasisColumn, UnitArtifact, UnitKey

    scale = 1.0 / np.sqrt(np.arange(1, d + 1))
    grads = (rng.standard_normal((n_sequences, tokens, d)) * scale) @ _orth(rng, (), d, d).T
    flat = grads.reshape(-1, d)
    bases, stack, proxy_bases = [], [], {}
    for k in ranks:
        if planted:
            noisy = flat[: flat.shape[0] // 2]
            u = np.linalg.eigh(noisy.T @ noisy)[1][:, ::-1][:, :k].copy()
        else:
            u = _orth(rng, (), d, k)
        bases.append(BasisColumn("pca", k, "proxy", -1))
        stack.append(u)
        proxy_bases[("pca", k)] = u
    energy = np.stack([((grads @ b) ** 2).sum(axis=(1, 2)) for b in stack], axis=1)
    moments = lambda x: {"count": x.shape[0], "sum": x.sum(0), "outer": x.T @ x}  # noqa: E731
    return UnitArtifact(
        key=UnitKey("synthetic", "clm", "step0", 0, "early", layer, f"residual.{layer}"),
        dim=d,
        bases=bases,
        n_tokens=np.full(n_sequences, tokens),
        sequence_documents=np.repeat(np.arange(32), n_sequences // 32),
        total_energy=(grads**2).sum(axis=(1, 2))[:, None],
        energy=energy[:, None, :],
        delta_isoscore_star=np.zeros(len(bases)),
        gradient_moments=moments(flat),
        activation_moments=moments(flat),
        gradient_unit_sum=flat.sum(0),
        activation_unit_sum=flat.sum(0),
        type_count=np.zeros(5, dtype=np.int64),
        type_rms_distance=np.full(5, np.nan),
        proxy_bases=proxy_bases,
    )


def part_b(quick: bool, widths=(768, 1024, 2048), units: int = 12, rank_sets=None) -> dict:
    """Per-unit analysis time (`analyze_units`: eigenvalues, shared Haar draws with sequential
    stopping, normal controls, bootstraps) at rank 8 alone, rank 128 alone and ranks 8/32/128, for
    planted (significant: every test uses all draws) and random (null: tests stop early) proxies."""
    import yaml

    from anistat.analyze import analyze_run
    from anistat.protocol import Protocol

    widths = (256,) if quick else widths
    units = 3 if quick else units
    rank_sets = ([8], [64], [8, 32, 64]) if quick else (rank_sets or ([8], [128], [8, 32, 128]))
    out = []
    for d in widths:
        for planted in (True, False):
            rng = np.random.default_rng(d + planted)
            for ranks in rank_sets:
                artifacts = [synthetic_unit(rng, d, ranks, planted=planted, layer=i) for i in range(units)]
                protocol = Protocol.model_validate(
                    yaml.safe_load(PROTOCOL) | {"proxies": {"methods": ["pca"], "ranks": ranks}}
                )
                started = time.process_time()
                analysis = analyze_run(artifacts, {}, protocol, frequency=False)
                seconds = time.process_time() - started
                made = analysis.null_settings["draws_made"]
                out.append(
                    {
                        "d": d,
                        "proxy": "planted" if planted else "random",
                        "ranks": ranks,
                        "units": units,
                        "seconds": seconds,
                        "per_unit_s": seconds / units,
                        "draws_made": made,
                        "n_null_draws": analysis.null_settings["n_null_draws"],
                    }
                )
                print(json.dumps(out[-1]), flush=True)
    for row in out:
        base = next(r for r in out if r["d"] == row["d"] and r["proxy"] == row["proxy"] and r["ranks"] == rank_sets[0])
        row["per_unit_ratio_to_rank_8"] = row["per_unit_s"] / base["per_unit_s"]
    return {"rows": out, "threads": torch.get_num_threads(), "clock": "process CPU time"}


PROTOCOL = """
anistat_protocol: 1
name: p3
seed: 0
models: [{name: synthetic, architecture: gpt2, hidden_size: 2048, num_layers: 1, num_heads: 1}]
controls: {kinds: [normal], n: 20}
stats: {multiplicity: holm, family: model, n_bootstrap: 2000}   # paper-replication's statistics
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (recorded)")
    parser.add_argument("--widths", type=int, nargs="+", default=[768, 1024, 2048])
    parser.add_argument("--units", type=int, default=12, help="units sharing the Haar draws, per width")
    parser.add_argument(
        "--rank-sets",
        nargs="+",
        default=None,
        metavar="R[,R...]",
        help="rank sets to time (default 8 128 8,32,128; the first is the baseline of the ratios)",
    )
    parser.add_argument("--skip-a", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "part_a": None if args.skip_a else part_a(args.quick),
        "part_b": part_b(
            args.quick,
            tuple(args.widths),
            args.units,
            [[int(r) for r in group.split(",")] for group in args.rank_sets] if args.rank_sets else None,
        ),
    }
    print(json.dumps(result, indent=1, default=float))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1, default=float)


if __name__ == "__main__":
    main()
