"""The sequence-bootstrap CI of the log-frequency vs centroid-distance correlation.

A. Calibration against a known law (the long version of
   `tests/analyze/test_frequency_bootstrap.py::test_interval_covers_the_population_correlation`):
   coverage of the population Spearman ρ, the estimator's and the bootstrap's bias, and
   bootstrap SE ÷ sampling SD, for several corpus sizes. Every interval of one corpus comes
   from the same resamples: normal (what the analysis uses), basic, BCa falling back to basic
   or percentile, percentile, and a naive bootstrap that lets copies of one sequence pair with
   each other (distance 0 between a token and its own copy), to show why anistat leaves those
   pairs out.
C. (`--definitions CORPORA`) the same law, the normal, basic and percentile intervals for all
   three per-type definitions the analysis reports (spread, mean distance, mean norm).
B. Speed at a real-model size (128 sequences × 128 tokens from a Zipf law over 50 000 types,
   d = 768): `ResampledCentroidDistance` (per-type factors, sparse sums) against the direct
   computation (per resample, every type's weighted sums from the (P, d) pair table), side by
   side on the same resamples.

    PYTHONPATH=. python benchmarks/bench_frequency.py [--corpora 3000] [--sizes 30 100 300] [--json out.json]
    PYTHONPATH=. python benchmarks/bench_frequency.py --definitions 1000 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy import stats

from anistat.geometry import ResampledCentroidDistance, ResampledTypeMeans, masked_correlations, sequence_type_sums
from anistat.stats import ci_from_replicates, iter_bootstrap_weights, jackknife_weights


def law(vocab: int, dim: int, seed: int = 123):
    rng = np.random.default_rng(seed)
    probability = 1.0 / np.arange(1, vocab + 1)
    probability /= probability.sum()
    means = rng.normal(size=(vocab, dim)) * 3.0
    scale = (0.5 + 0.3 * np.log1p(np.arange(vocab))) * np.exp(rng.normal(size=vocab) * 0.35)
    return probability, means, scale


def corpus(rng, probability, means, scale, n_seq, length, shift):
    ids = rng.choice(len(probability), size=(n_seq, length), p=probability)
    dim = means.shape[1]
    activations = (
        means[ids]
        + scale[ids][..., None] * rng.normal(size=(n_seq, length, dim))
        + rng.normal(size=(n_seq, 1, dim)) * shift
    )
    return ids, activations


def corpus_sums(rng, probability, means, scale, n_seq, length, shift):
    """A simulated corpus as per-(sequence, type) sums, the types seen twice, their log p_t."""
    ids, activations = corpus(rng, probability, means, scale, n_seq, length, shift)
    sums = sequence_type_sums(activations.reshape(-1, means.shape[1]), ids.ravel(), np.repeat(np.arange(n_seq), length))
    types, counts = np.unique(ids, return_counts=True)
    types = types[counts >= 2]
    return sums, types, np.log(probability[types])


def naive_distance(sums, types):
    """Bessel-corrected RMS distance where every pair of drawn tokens counts, copies included."""
    rows = [np.flatnonzero(sums.token_type == t) for t in types]

    def distance(weights):
        out = np.full((weights.shape[0], len(types)), np.nan)
        for j, index in enumerate(rows):
            w = weights[:, sums.sequence[index]]
            n = w @ sums.count[index]
            q = w @ sums.square_sum[index]
            m = w @ sums.vector_sum[index]
            with np.errstate(invalid="ignore", divide="ignore"):
                value = (n * q - (m * m).sum(1)) / (n * n - n)
            distinct = (w > 0) @ sums.count[index]
            out[:, j] = np.where(distinct >= 2, np.sqrt(np.maximum(value, 0)), np.nan)
        return out

    return distance


def coverage(
    n_corpora: int,
    n_seq: int,
    length: int = 25,
    dim: int = 6,
    vocab: int = 40,
    shift: float = 1.0,
    n_resamples: int = 1000,
    seed: int = 0,
) -> list[dict]:
    probability, means, scale = law(vocab, dim)
    population = stats.spearmanr(np.log(probability), np.sqrt(dim * (scale**2 + shift**2))).statistic
    rng = np.random.default_rng(seed + 11 * n_seq)
    # every interval of one distance function comes from the same resamples (and jackknife rows);
    # "bca>basic": BCa, falling back to basic where a BCa endpoint would lie beyond the resamples
    variants = {
        ("anistat", "normal"): [],
        ("anistat", "basic"): [],
        ("anistat", "bca>basic"): [],
        ("anistat", "bca>percentile"): [],
        ("anistat", "percentile"): [],
        ("copies pair", "normal"): [],
    }
    estimates, biases = [], []
    for _ in range(n_corpora):
        sums, types, log_count = corpus_sums(rng, probability, means, scale, n_seq, length, shift)
        functions = {"anistat": ResampledCentroidDistance(sums, types), "copies pair": naive_distance(sums, types)}
        draw = int(rng.integers(1 << 31))
        for name, distance in functions.items():

            def statistic(w, log_count=log_count, distance=distance):  # bound now: the loop moves on
                return masked_correlations(log_count, distance(w))[0]

            estimate = statistic(np.ones((1, n_seq)))[0]
            replicates = np.concatenate([statistic(w) for w in iter_bootstrap_weights(n_seq, n_resamples, draw)])
            jackknife = statistic(jackknife_weights(n_seq))
            for (variant, method), results in variants.items():
                if variant != name:
                    continue
                interval, _, fallback = method.partition(">")
                results.append(
                    ci_from_replicates(
                        estimate, replicates, jackknife, 0.95, interval, bca_fallback=fallback or "percentile"
                    )
                )
            if name == "anistat":
                estimates.append(estimate)
                biases.append(np.nanmean(replicates) - estimate)
    sd = float(np.std(estimates, ddof=1))
    rows = []
    for (name, method), results in variants.items():
        covered = np.array([r.ci_low <= population <= r.ci_high for r in results])
        rows.append(
            {
                "sequences": n_seq,
                "variant": name,
                "method": method,
                "population_rho": float(population),
                "mean_estimate": float(np.mean(estimates)),
                "estimator_bias": float(np.mean(estimates) - population),
                "bootstrap_bias": float(np.mean(biases)),
                "sampling_sd": sd,
                "se_ratio": float(np.mean([r.se for r in results]) / sd),
                "coverage": float(covered.mean()),
                "coverage_mc_se": float(np.sqrt(covered.mean() * (1 - covered.mean()) / covered.size)),
                "corpora": n_corpora,
                "resamples": n_resamples,
            }
        )
    return rows


def definitions_coverage(
    n_corpora: int,
    n_seq: int,
    length: int = 25,
    dim: int = 6,
    vocab: int = 40,
    shift: float = 1.0,
    n_resamples: int = 1000,
    seed: int = 0,
) -> list[dict]:
    """Coverage of normal / basic / percentile intervals for the three per-type definitions the
    analysis reports (`ResampledTypeMeans`): RMS spread, distance of the type's mean from the
    global mean, and the mean's norm; population values from the law (the global mean is
    Σ p_t μ_t: the per-sequence shifts average to 0)."""
    probability, means, scale = law(vocab, dim)
    population_values = {
        "spread": np.sqrt(dim * (scale**2 + shift**2)),
        "mean_distance": np.linalg.norm(means - probability @ means, axis=1),
        "mean_norm": np.linalg.norm(means, axis=1),
    }
    population = {k: stats.spearmanr(np.log(probability), v).statistic for k, v in population_values.items()}
    rng = np.random.default_rng(seed + 11 * n_seq)
    methods = ("normal", "basic", "percentile")
    covered = {(k, m): [] for k in population for m in methods}
    estimates = {k: [] for k in population}
    for _ in range(n_corpora):
        sums, types, log_count = corpus_sums(rng, probability, means, scale, n_seq, length, shift)
        geometry = ResampledTypeMeans(sums, types)
        draw = int(rng.integers(1 << 31))
        full = geometry.all_three(np.ones((1, n_seq)))
        resampled = [
            np.concatenate(parts)
            for parts in zip(*(geometry.all_three(w) for w in iter_bootstrap_weights(n_seq, n_resamples, draw)))
        ]
        for j, name in enumerate(population):
            estimate = masked_correlations(log_count, full[j])[0][0]
            replicates = masked_correlations(log_count, resampled[j])[0]
            estimates[name].append(estimate)
            for method in methods:
                r = ci_from_replicates(estimate, replicates, None, 0.95, method)
                covered[(name, method)].append(r.ci_low <= population[name] <= r.ci_high)
    return [
        {
            "sequences": n_seq,
            "definition": name,
            "population_rho": float(population[name]),
            "mean_estimate": float(np.mean(estimates[name])),
            "sampling_sd": float(np.std(estimates[name], ddof=1)),
            **{f"coverage_{m}": float(np.mean(covered[(name, m)])) for m in methods},
            "corpora": n_corpora,
        }
        for name in population
    ]


def speed(
    n_seq: int = 128, length: int = 128, vocab: int = 50_000, dim: int = 768, n_resamples: int = 256, seed: int = 0
) -> dict:
    rng = np.random.default_rng(seed)
    probability = 1.0 / np.arange(1, vocab + 1) ** 1.05
    probability /= probability.sum()
    ids = rng.choice(vocab, size=(n_seq, length), p=probability)
    activations = rng.normal(size=(n_seq * length, dim)) + rng.normal(size=(vocab, dim))[ids.ravel()]
    sums = sequence_type_sums(activations, ids.ravel(), np.repeat(np.arange(n_seq), length))
    types, counts = np.unique(ids, return_counts=True)
    types = types[counts >= 2]
    weights = next(iter_bootstrap_weights(n_seq, n_resamples, seed=1, chunk_size=n_resamples))
    started = time.perf_counter()
    fast = ResampledCentroidDistance(sums, types)
    built = time.perf_counter() - started
    started = time.perf_counter()
    fast_values = fast(weights)
    fast_seconds = time.perf_counter() - started
    started = time.perf_counter()
    direct_values = naive_direct(sums, types, weights)
    direct_seconds = time.perf_counter() - started
    agree = float(np.nanmax(np.abs(fast_values - direct_values) / np.abs(direct_values)))
    return {
        "tokens": n_seq * length,
        "pairs": sums.n_pairs,
        "types": int(types.size),
        "dim": dim,
        "resamples": n_resamples,
        "build_s": built,
        "anistat_s": fast_seconds,
        "direct_s": direct_seconds,
        "speedup": direct_seconds / fast_seconds,
        "max_relative_difference": agree,
        "pair_table_mib": sums.n_pairs * (dim + 4) * 8 / 2**20,
    }


def naive_direct(sums, types, weights):
    """Per type: the weighted sums from the raw (S_t, d) pair rows, pairs of copies left out."""
    out = np.full((weights.shape[0], len(types)), np.nan)
    order = np.argsort(sums.token_type, kind="stable")
    starts = np.searchsorted(sums.token_type[order], types)
    stops = np.searchsorted(sums.token_type[order], types, side="right")
    for j, (start, stop) in enumerate(zip(starts, stops)):
        index = order[start:stop]
        w = weights[:, sums.sequence[index]]
        count, square, vector = sums.count[index], sums.square_sum[index], sums.vector_sum[index]
        within = count * square - (vector * vector).sum(1)
        n, q, m = w @ count, w @ square, w @ vector
        repeats = w * w - w
        numerator = n * q - (m * m).sum(1) - repeats @ within
        denominator = n * n - n - repeats @ (count * count)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, j] = np.where(denominator > 0.5, np.sqrt(np.maximum(numerator, 0) / denominator), np.nan)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=int, default=3000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[30, 100, 300])
    parser.add_argument(
        "--definitions",
        type=int,
        default=0,
        metavar="CORPORA",
        help="C only: coverage of the three per-type definitions at 100 and 300 sequences",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.definitions:
        rows = [row for n_seq in (100, 300) for row in definitions_coverage(args.definitions, n_seq)]
        for row in rows:
            print("C.", json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as stream:
                json.dump({"definitions": rows}, stream, indent=1)
        return
    results = {"coverage": [], "speed": speed()}
    print("B. speed:", json.dumps(results["speed"], indent=1))
    for n_seq in args.sizes:
        rows = coverage(args.corpora, n_seq)
        results["coverage"].extend(rows)
        for row in rows:
            print(
                f"A. S={row['sequences']:4d} {row['variant']:12s} {row['method']:14s} coverage {row['coverage']:.3f} "
                f"SE/SD {row['se_ratio']:.2f}  ρ={row['population_rho']:.3f} mean ρ̂={row['mean_estimate']:.3f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(results, stream, indent=1)


if __name__ == "__main__":
    main()
