"""The null check's verdict: its false-alarm rate, and what runs of `protocols/null-check.yaml` say.

Part A (``--families F``): F families of N independent p-values drawn from the sequential exact
test's null law (h = 10 exceedances, at most n = 9 999 draws: `stats.uniformity.
sample_sequential_pvalues`), each judged like a run's null check — the exact binomial test of the
share of p <= 0.05 and the Kolmogorov–Smirnov distance against the law, its p-value from one
reference sample of B distances (what `p_value_uniformity` draws afresh per call). Reported: the
share of families called NOT calibrated when each test is taken at 0.05 on its own, and with
Holm's procedure over the two (the verdict's rule), with binomial margins; and a planted
deviation's detection rate (p-values of a test whose exceedance probability is ``u^power``:
1.25 liberal, 0.8 conservative).

Part B (``--bundles DIR...``): the null-check rows of finished runs (one per seed), per run and
pooled over the runs (the runs' tests are independent: every seed draws new proxies and
streams): P(p <= 0.05), P(p <= 0.5), mean p, the binomial and KS p-values and the verdict, for
the exact test and the paper's convention (20 normal controls).

Part C (``--direct R``): the exact test of one real unit, run by `anistat.analyze.nulls.
exact_tests` as a run does, for R fresh random proxies per rank (2/4/8/16) on that unit's saved
gradient moments, each with its own stream (``--unit-cache DIR``: a run's unit cache, kept with
``anistat run --keep-cache``). Reported per rank: P(p <= 0.05), P(p <= 0.5), mean p, the KS
p-value against the law, and the correlation of p-values between ranks of one family.

    python benchmarks/bench_null_check.py --families 4000
    python benchmarks/bench_null_check.py --bundles /tmp/nc/out0 /tmp/nc/out1 ...
    python benchmarks/bench_null_check.py --direct 500 --unit-cache /tmp/nc/cache0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from anistat.stats.uniformity import (
    _Law,
    holm_rejections,
    law_ks_distance,
    p_value_uniformity,
    sample_sequential_pvalues,
)

ALPHA, LEVEL, H, N_MAX = 0.05, 0.05, 10, 9999


def false_alarms(families: int, n_tests: int, reference: int, seed: int = 0) -> dict:
    """Part A: verdicts on families drawn from the law (false alarms) and from a planted law."""
    rng = np.random.default_rng(seed)
    law = _Law(sample_sequential_pvalues(N_MAX, H, 400_000, rng))
    expected = float(law.cdf(ALPHA + 1e-12))
    null_d = law_ks_distance(sample_sequential_pvalues(N_MAX, H, reference * n_tests, rng).reshape(-1, n_tests), law)
    out: dict = {"families": families, "n_tests": n_tests, "reference_samples": reference}

    def judge(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = law_ks_distance(p, law)
        ks_p = (1 + (null_d[None, :] >= d[:, None] - 1e-12).sum(axis=1)) / (1 + reference)
        hits = (p <= ALPHA + 1e-12).sum(axis=1)
        binom_p = np.array([sps.binomtest(int(h), n_tests, expected).pvalue for h in hits])
        return binom_p, ks_p

    binom_p, ks_p = judge(sample_sequential_pvalues(N_MAX, H, families * n_tests, rng).reshape(families, n_tests))
    separate = (binom_p < LEVEL) | (ks_p < LEVEL)
    holm = np.array([any(holm_rejections(pair, LEVEL)) for pair in zip(binom_p, ks_p)])
    margin = lambda x: 1.96 * np.sqrt(x.mean() * (1 - x.mean()) / x.size)  # noqa: E731
    out["null"] = {
        "not_calibrated_each_at_level": float(separate.mean()),
        "margin_each": float(margin(separate)),
        "not_calibrated_holm": float(holm.mean()),
        "margin_holm": float(margin(holm)),
        "ks_p_below_level": float((ks_p < LEVEL).mean()),
        "binomial_p_below_level": float((binom_p < LEVEL).mean()),
    }
    for power in (1.25, 0.8):  # exceedance probability u**power: liberal (> 1) or conservative (< 1)
        u = rng.uniform(size=(families // 4, n_tests)) ** power
        stop_at = H + rng.negative_binomial(H, u)
        p = np.where(stop_at <= N_MAX, H / np.minimum(stop_at, N_MAX + 1), (1 + rng.binomial(N_MAX, u)) / (N_MAX + 1))
        binom_p, ks_p = judge(p)
        caught = np.array([any(holm_rejections(pair, LEVEL)) for pair in zip(binom_p, ks_p)])
        out[f"planted_u^{power}"] = {"families": int(caught.size), "caught_holm": float(caught.mean())}
    return out


def describe(p: np.ndarray, n_draws: int | None, stop_after: int) -> dict:
    check = p_value_uniformity(p, ALPHA, n_draws=n_draws, stop_after=stop_after, level=LEVEL)
    return {
        "tests": int(p.size),
        "p_eq_1": float((p == 1.0).mean()),
        "p_le_0.05": float((p <= 0.05 + 1e-12).mean()),
        "expected_p_le_0.05": check.expected_rate,
        "p_le_0.5": float((p <= 0.5 + 1e-12).mean()),
        "mean_p": float(p.mean()),
        "binomial_p": check.binomial_p,
        "ks_p": check.uniformity_p,
        "verdict": check.verdict,
    }


def bundle_rows(bundles: list[str]) -> dict:
    """Part B: each run's null-check p-values (as `bundle.null_check_summaries` selects them)."""
    out: dict = {"runs": {}}
    pooled: dict[str, list[np.ndarray]] = {"exact": [], "paper": []}
    correlations: list[np.ndarray] = []  # per run: the exact p-values' ranks, unit × rank
    for folder in bundles:
        results = pd.read_csv(Path(folder) / "results.csv")
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
        nulls = manifest.get("null_settings", {})
        rows = results[
            results["proxy"].astype(str).str.fullmatch(r"random(@.+)?")
            & (results["metric"] == "energy_fraction")
            & (results["status"] == "ok")
        ]
        exact_rows = rows[rows["p_test"] == "haar_monte_carlo"]
        exact_rows = exact_rows[exact_rows["control"] == exact_rows["control"].iloc[0]]
        exact = exact_rows["p_value"].to_numpy(float)
        by_rank = exact_rows.pivot_table("p_value", ["model", "checkpoint", "site"], "rank")
        correlations.append(by_rank.rank().to_numpy())
        paper = rows.loc[rows["control"] == "normal", "p_value_paper"].dropna().to_numpy(float)
        pooled["exact"].append(exact)
        pooled["paper"].append(paper)
        out["runs"][str(manifest.get("seed"))] = {
            "exact": describe(exact, int(nulls["n_null_draws"]), int(nulls.get("stop_after") or 0)),
            "paper": describe(paper, 20, 0),
            "null_draws": nulls.get("null_draws"),
            "n_null_draws": nulls.get("n_null_draws"),
        }
        print(json.dumps({folder: out["runs"][str(manifest.get("seed"))]}, default=float), flush=True)
    cap = int(next(iter(out["runs"].values()))["n_null_draws"])
    rho = np.mean([sps.spearmanr(ranks).statistic for ranks in correlations], axis=0)
    out["mean_spearman_between_ranks_of_a_unit"] = rho[np.triu_indices(rho.shape[0], 1)].tolist()
    out["pooled"] = {
        "exact": describe(np.concatenate(pooled["exact"]), cap, H),
        "paper": describe(np.concatenate(pooled["paper"]), 20, 0),
    }
    return out


def direct_experiment(cache: str, replicates: int, unit: str = "tiny-decoder--step400--residual.2") -> dict:
    """Part C: ``replicates`` random proxies per rank on one real unit's gradient moments, each
    tested by `exact_tests` with a stream of its own (the null-check protocol's settings)."""
    import torch

    from anistat.analyze.nulls import NullOptions, UnitSpectrum, exact_tests
    from anistat.analyze.units import Frame
    from anistat.collect.artifact import UnitArtifact
    from anistat.geometry import fit_proxy
    from anistat.seeding import derive_seed

    artifact = UnitArtifact.load(Path(cache) / "units" / f"{unit}.json")
    second = Frame.of(artifact.gradient_moments["outer"])
    placeholder = torch.zeros(4, artifact.dim, dtype=torch.float64)  # a random proxy ignores the data
    ranks = (2, 4, 8, 16)
    spectra = []
    for r in range(replicates):
        for k in ranks:
            basis = fit_proxy(placeholder, "random", k, seed=derive_seed("direct", r, k)).basis
            energy = float(second.traces(basis)[0][0] / second.trace)
            spectra.append(UnitSpectrum(f"{r}/{k}", artifact.dim, second.eigenvalues, {("random", k): energy}))
    options = NullOptions(n_max=11519, stop_after=H, alternative="greater", c0="scaled_identity", zeta=0.1)
    nulls = exact_tests(spectra, options, None, lambda u: (u.unit_id, derive_seed("direct-stream", u.unit_id)))
    p = np.array([[nulls.energy[(f"{r}/{k}", "random", k)].p_value for k in ranks] for r in range(replicates)])
    out: dict = {"unit": unit, "dim": artifact.dim, "replicates": replicates, "ranks": {}}
    for j, k in enumerate(ranks):
        out["ranks"][k] = describe(p[:, j], options.n_max, H)
    out["all"] = describe(p.ravel(), options.n_max, H)
    rho = sps.spearmanr(p).statistic
    out["max_abs_rank_correlation"] = float(np.abs(rho[np.triu_indices(len(ranks), 1)]).max())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=0, help="part A: families of null p-values")
    parser.add_argument("--tests", type=int, default=192, help="part A: p-values per family")
    parser.add_argument("--reference", type=int, default=9999, help="part A: reference KS samples")
    parser.add_argument("--bundles", nargs="*", default=[], help="part B: null-check bundles (one per seed)")
    parser.add_argument("--direct", type=int, default=0, help="part C: random proxies per rank")
    parser.add_argument("--unit-cache", default=None, help="part C: a run's unit cache (--keep-cache)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result: dict = {}
    if args.families:
        result["false_alarms"] = false_alarms(args.families, args.tests, args.reference)
    if args.bundles:
        result["runs"] = bundle_rows(args.bundles)
    if args.direct:
        result["direct"] = direct_experiment(args.unit_cache, args.direct)
    print(json.dumps(result, indent=1, default=float))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
