"""P3 benchmark: the statistics engine vs the naive way, and the absolute scale point.

Run:  PYTHONPATH=. python benchmarks/bench_stats.py [--quick] [--json OUT]

Part A (same inputs, side by side): synthetic per-token gradients G (N x d) in S sequences,
a proxy U and n controls Q_j.
  naive  — per-token projections for every control (a loop over controls), per-sequence sums,
           scipy.stats.bootstrap (paired over sequences, BCa) for the CI of the energy ratio
           with all controls resampled jointly, and a Python loop over sign vectors for the
           paired sign-flip test.
  engine — one batched projection to the per-sequence sufficient statistics (what collection
           stores), then anistat.stats.analyze_energy (all metrics, BCa CIs, MC p, sign flip).
Agreement: the Monte-Carlo p-values are identical; the loop test run over the engine's own
sign vectors gives the identical sign-flip p-value; the ratio CI endpoints differ by a
fraction of the bootstrap SE (two independent 2000-resample bootstraps).

Part B (scale point): 12 layers x 4 ranks x 3 proxies x 2 control kinds = 288 analyses, each
with S = 500 sequences, n = 1000 controls, B = 2000 bootstrap resamples, 9999 sign flips.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
from scipy import stats

from anistat.stats import analyze_energy, monte_carlo_pvalue, sign_flip_null


def _orth(rng, shape_lead, d, k):
    return np.linalg.qr(rng.standard_normal(shape_lead + (d, k)))[0]


def make_gradients(rng, s, tokens, d, k, boost=1.3):
    u = _orth(rng, (), d, k)
    lam = 1.0 / np.arange(1, d + 1) ** 0.5
    a = np.diag(np.sqrt(lam)) + (boost - 1) * (u @ u.T)
    z = rng.standard_normal((s, 1, d)) * 0.7 + rng.standard_normal((s, tokens, d))
    z *= np.exp(0.25 * rng.standard_normal(s))[:, None, None]
    g = z.reshape(-1, d) @ a
    return g, u


def naive(g, u, q, s, tokens, n_boot, sign_rows, seed):
    t0 = time.perf_counter()
    starts = np.arange(0, s * tokens, tokens)
    tok_total = (g**2).sum(axis=1)
    total = np.add.reduceat(tok_total, starts)
    proxy = np.add.reduceat(((g @ u) ** 2).sum(axis=1), starts)
    ctrl = np.empty((s, q.shape[0]))
    for j in range(q.shape[0]):  # per-token projections, one control at a time
        ctrl[:, j] = np.add.reduceat(((g @ q[j]) ** 2).sum(axis=1), starts)
    e_u = proxy.sum() / total.sum()
    e_q = ctrl.sum(axis=0) / total.sum()
    p_mc = monte_carlo_pvalue(e_u, e_q)

    def ratio(p, *cols, axis=-1):
        c = np.stack(cols, axis=0)  # (n, ..., S)
        return p.sum(axis=axis) / c.sum(axis=axis).mean(axis=0)

    boot = stats.bootstrap((proxy, *ctrl.T), ratio, paired=True, vectorized=True,
                           n_resamples=n_boot, method="BCa", rng=seed)
    d = (proxy - ctrl.mean(axis=1)) / total
    obs = d.mean()
    count = 0
    for eps in sign_rows:  # loop-based sign-flip test (one sign vector at a time)
        if np.mean(eps * d) >= obs - 100 * np.finfo(float).eps * abs(obs):
            count += 1
    p_sf = (1 + count) / (1 + len(sign_rows))
    elapsed = time.perf_counter() - t0
    return elapsed, dict(p_mc=p_mc, p_sf=p_sf, ci=tuple(boot.confidence_interval),
                         se=boot.standard_error, ratio=e_u / e_q.mean())


def engine(g, u, q, s, tokens, n_boot, n_perm, seed):
    t0 = time.perf_counter()
    d = g.shape[1]
    bases = np.concatenate([u[None], q]).transpose(1, 0, 2).reshape(d, -1)
    e = ((g @ bases) ** 2).reshape(s, tokens, q.shape[0] + 1, -1).sum(axis=(1, 3))
    total = (g**2).reshape(s, -1).sum(axis=1)
    t1 = time.perf_counter()
    a = analyze_energy(e[:, 0], e[:, 1:], total, rank=u.shape[1], dim=d, n_bootstrap=n_boot,
                       n_permutations=n_perm, seed=seed)
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1, a


def part_a(quick):
    s, tokens, d, k, n = (100, 16, 64, 4, 100) if quick else (200, 16, 128, 8, 200)
    n_boot, n_perm, seed = 2000, 2000, 0
    rng = np.random.default_rng(0)
    g, u = make_gradients(rng, s, tokens, d, k)
    q = _orth(rng, (n,), d, k)
    # warm-up (imports, BLAS threads); then the measured runs
    engine(g, u, q, s, tokens, n_boot, n_perm, seed)
    t_eng, t_eng_stats, a = engine(g, u, q, s, tokens, n_boot, n_perm, seed)
    signs, exact = sign_flip_null(s, n_perm, seed)
    t_naive, nv = naive(g, u, q, s, tokens, n_boot, signs, seed)
    r = a["energy_ratio"]
    out = dict(
        sizes=dict(sequences=s, tokens_per_sequence=tokens, dim=d, rank=k, controls=n,
                   bootstrap=n_boot, permutations=n_perm),
        naive_s=t_naive, engine_s=t_eng, engine_stats_only_s=t_eng_stats,
        speedup=t_naive / t_eng, speedup_stats_only=t_naive / t_eng_stats,
        p_mc_naive=nv["p_mc"], p_mc_engine=a.mc_p_value,
        p_sf_naive=nv["p_sf"], p_sf_engine=a.sign_flip.p_value,
        ratio_naive=nv["ratio"], ratio_engine=r.estimate,
        ci_naive=nv["ci"], ci_engine=(r.ci_low, r.ci_high), boot_se=nv["se"],
        ci_diff_in_se=(abs(r.ci_low - nv["ci"][0]) / nv["se"],
                       abs(r.ci_high - nv["ci"][1]) / nv["se"]),
    )
    return out


def part_b(quick, z_interval="fixed_sd"):
    layers, ranks, proxies, kinds = (2, 4, 3, 2) if quick else (12, 4, 3, 2)
    s, n, n_boot, n_perm = 500, 1000, 2000, 9999
    n_analyses = layers * ranks * proxies * kinds
    rng = np.random.default_rng(1)
    n_tables = 8
    tables = []
    for _ in range(n_tables):
        t = rng.gamma(4.0, 1.0, s) * 100
        c = t[:, None] * rng.beta(2, 60, (s, n))
        p = t * rng.beta(3, 60, s)
        tables.append((p, c, t))
    analyze_energy(*tables[0], rank=4, dim=256, n_bootstrap=n_boot, n_permutations=n_perm,
                   z_interval=z_interval)  # warm-up: builds the cached W and sign matrix
    t0 = time.perf_counter()
    for i in range(n_analyses):
        p, c, t = tables[i % n_tables]
        analyze_energy(p, c, t, rank=4, dim=256, oracle_fraction=0.3, n_bootstrap=n_boot,
                       n_permutations=n_perm, seed=0, z_interval=z_interval)
    elapsed = time.perf_counter() - t0
    return dict(analyses=n_analyses, sequences=s, controls=n, bootstrap=n_boot,
                permutations=n_perm, z_interval=z_interval, seconds=elapsed,
                per_analysis_ms=1e3 * elapsed / n_analyses)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    info = dict(machine=platform.machine(), cpus=os.cpu_count(), python=platform.python_version(),
                numpy=np.__version__)
    a = part_a(args.quick)
    print(json.dumps(a, indent=1, default=float))
    b = part_b(args.quick)
    print(json.dumps(b, indent=1))
    b2 = part_b(args.quick, "resampled_sd")
    print(json.dumps(b2, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(info=info, part_a=a, part_b=b, part_b_resampled_sd=b2), fh, indent=1,
                      default=float)


if __name__ == "__main__":
    main()
