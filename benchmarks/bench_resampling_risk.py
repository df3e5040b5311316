"""Resampling risk of Monte-Carlo decisions: the risk-bounded procedure against Besag–Clifford.

Fixed-seed studies of a 48-test family with effects planted near the decision threshold. In every
study each test has an ideal (infinite-draw) p-value: 40 null tests with ``p ~ U(0, 1)`` drawn
afresh per study, and 8 planted tests with fixed p-values around the threshold of the family's
procedure. The ideal decision is the procedure applied to the ideal p-values. A study's draws are
fed to

* :class:`anistat.stats.resampling_risk.RiskBoundedMonteCarlo` (resampling risk ``ε``; the
  binomial exceedance counts between two looks are drawn directly — the per-test law of the counts
  is exactly that of a stream of draws, and the bound is a union bound that holds whatever the
  dependence between tests, so independent counts lose nothing);
* the Besag–Clifford rule of ``anistat`` today (stop at ``h = 10`` exceedances, at most
  ``n = 9999`` draws; ``p = h/L`` or ``(1 + g)/(1 + n)``), decided by the same procedure.

Reported per procedure: the proportion of tests whose decision differs from the ideal one, the
proportion of studies in which any decision of the family differs, the share left undecided at the
cap, the unconditional type-I error of the 40 null tests (uncorrected family), the mean draws per
test and the mean stream length (the most draws any test of the study used: what a shared stream
costs).

Usage: ``python benchmarks/bench_resampling_risk.py [--studies 2000] [--epsilon 0.01]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from anistat.stats.resampling_risk import (
    NOT_REJECTED,
    REJECTED,
    UNDECIDED,
    RiskBoundedMonteCarlo,
    family_rejections,
)

ALPHA = 0.05
N_NULL = 40
#: planted ideal p-values, around each procedure's threshold (uncorrected 0.05; Holm and
#: Bonferroni's first step 0.05/48 ≈ 0.00104; BH's steps r·0.05/48)
PLANTED = {
    "none": [0.02, 0.03, 0.04, 0.045, 0.055, 0.06, 0.07, 0.08],
    "holm": [1e-4, 3e-4, 6e-4, 8e-4, 1.3e-3, 1.6e-3, 3e-3, 1e-2],
    "bonferroni": [1e-4, 3e-4, 6e-4, 8e-4, 1.3e-3, 1.6e-3, 3e-3, 1e-2],
    "fdr_bh": [2e-4, 6e-4, 1.5e-3, 2.5e-3, 4e-3, 5.5e-3, 7e-3, 1.2e-2],
}


def risk_bounded_study(p_ideal, method, epsilon, n_max, rng):
    engine = RiskBoundedMonteCarlo(np.zeros(p_ideal.size), ALPHA, epsilon, n_max, method)
    while engine.remaining:
        used = int(engine.draws_used[engine.active].max())
        width = int(engine.looks[engine._next_look]) - used
        engine.add_counts(rng.binomial(width, p_ideal), width)
    return engine.decisions(), engine.draws_used


def besag_clifford_study(p_ideal, h, n_max, rng):
    """Besag–Clifford p-values: the ``h``-th exceedance at draw ``L = h + NB(h, p)`` when ``L ≤ n``,
    else ``g < h`` exceedances in ``n`` draws (Binomial(n, p) conditioned on ``< h``)."""
    stop = h + rng.negative_binomial(h, p_ideal)
    p = np.empty(p_ideal.size)
    draws = np.minimum(stop, n_max)
    stopped = stop <= n_max
    p[stopped] = h / stop[stopped]
    for i in np.flatnonzero(~stopped):
        from scipy.stats import binom

        weights = binom.pmf(np.arange(h), n_max, p_ideal[i])
        g = rng.choice(h, p=weights / weights.sum())
        p[i] = (1.0 + g) / (1.0 + n_max)
    return p, draws


def run(method, epsilon, studies, n_max, seed):
    rng = np.random.default_rng(seed)
    planted = np.array(PLANTED[method])
    tally = {
        key: 0.0
        for key in (
            "rb_diff",
            "rb_family_diff",
            "rb_undecided",
            "rb_null_rejected",
            "rb_draws",
            "rb_stream",
            "bc_diff",
            "bc_family_diff",
            "bc_null_rejected",
            "bc_draws",
            "bc_stream",
        )
    }
    for _ in range(studies):
        p_ideal = np.concatenate([rng.uniform(size=N_NULL), planted])
        ideal = family_rejections(p_ideal, ALPHA, method)
        status, used = risk_bounded_study(p_ideal, method, epsilon, n_max, rng)
        decided = status != UNDECIDED
        differ = decided & ((status == REJECTED) != ideal)
        tally["rb_diff"] += differ.mean()
        tally["rb_family_diff"] += differ.any()
        tally["rb_undecided"] += (~decided).mean()
        tally["rb_null_rejected"] += (status[:N_NULL] == REJECTED).mean()
        tally["rb_draws"] += used.mean()
        tally["rb_stream"] += used.max()
        p_bc, draws = besag_clifford_study(p_ideal, 10, 9999, rng)
        bc = family_rejections(p_bc, ALPHA, method)
        tally["bc_diff"] += (bc != ideal).mean()
        tally["bc_family_diff"] += (bc != ideal).any()
        tally["bc_null_rejected"] += bc[:N_NULL].mean()
        tally["bc_draws"] += draws.mean()
        tally["bc_stream"] += draws.max()
        assert not ((status == NOT_REJECTED) & (status == REJECTED)).any()
    return {key: value / studies for key, value in tally.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=2000)
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--n-max", type=int, default=2**17)
    parser.add_argument("--methods", default="none,holm,fdr_bh")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"epsilon {args.epsilon}, {args.studies} studies of 48 tests ({N_NULL} null, 8 planted), "
        f"alpha {ALPHA}, cap {args.n_max} draws; Besag-Clifford h = 10, n = 9999"
    )
    for method in args.methods.split(","):
        start = time.perf_counter()
        r = run(method, args.epsilon, args.studies, args.n_max, args.seed)
        margin = 1.96 * np.sqrt(max(r["rb_family_diff"], 1.0 / args.studies) / args.studies)
        print(
            f"[{method}] risk-bounded: tests differing {r['rb_diff']:.5f}, families differing "
            f"{r['rb_family_diff']:.4f} (± {margin:.4f}), undecided {r['rb_undecided']:.4f}, null tests rejected "
            f"{r['rb_null_rejected']:.4f}, draws/test {r['rb_draws']:.0f}, "
            f"stream {r['rb_stream']:.0f}"
        )
        print(
            f"[{method}] Besag-Clifford h=10: tests differing {r['bc_diff']:.5f}, families differing "
            f"{r['bc_family_diff']:.4f}, null tests rejected {r['bc_null_rejected']:.4f}, draws/test "
            f"{r['bc_draws']:.0f}, stream {r['bc_stream']:.0f}   ({time.perf_counter() - start:.0f} s)"
        )


if __name__ == "__main__":
    main()
