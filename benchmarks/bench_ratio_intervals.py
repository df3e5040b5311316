"""Coverage of the energy-ratio interval methods side by side, over every calibration scenario.

Runs :func:`anistat.stats.run_calibration` over all scenarios (``isotropic``, ``anisotropic``,
``clustered``, ``skewed``, ``heavy``, ``hot``) with the uninformative proxy and a planted ratio
of 1, at 30, 60 and 200 documents. Every simulated study computes the haar energy ratio's 95 %
interval by each method of :data:`anistat.stats.ratio_intervals.RATIO_INTERVAL_METHODS` on the
same per-document sums and resamples. Printed: coverage per scenario × documents × method (the
mean over the two conditions, ``2·studies`` studies per cell, ± one binomial Monte-Carlo SE), the
data test's level at ratio 1, and coverage and data-test level by the ratio's effective number
of documents ``m_eff`` (:func:`anistat.stats.el_effective_size`; pooled over scenarios,
conditions and sizes).

Usage: ``python benchmarks/bench_ratio_intervals.py [--studies 250] [--seed 0] [--out /tmp/ratio.json]``
(one process; about 0.1–0.3 s per study on one core). ``--pool a.json b.json``: the tables of
several ``--out`` files of the same settings and different seeds, pooled (rates weighted by
their studies). Last tables: the data test's level at ratio 1 by the documents' energy spread
``n/n_eff``, and per scenario and size its level over all studies, the share the concentration
warning flags (spread at or above the threshold those levels give) and the level among the others.

``--coverage``: instead, coverage alone (no tests: each study only simulates and computes every
method's interval, about 5–20 ms) under the six scenarios and the heavier document laws of
:data:`anistat.stats.calibrate.HEAVIER_SCENARIOS` (a t₃ scale mixture and 5 % of documents at 20×
the energy), the random proxy and ratio 1, at 10, 30, 60 and 200 documents: coverage by ``m_eff``
level pooled over the laws and per law, and per level the lowest and highest law (what
:data:`anistat.stats.ratio_intervals.CONCENTRATION_COVERAGE` keeps). ``--studies`` then counts
studies per law, condition and size.

``--laws t3 two_point``: those laws only; ``--coverage-pool a.json b.json``: the coverage tables of
several such runs' laws together.

``--cost``: instead, the cost of each method per row group at the d = 768 shape (per-sequence
energies of 32 tokens per sequence in d = 768 with a rank-8 proxy; 128 sequences in 32 documents,
as ``bench_stats.py`` part B, and 96 sequences each its own document, the paper's test split),
2 000 resamples: the median process CPU time of ``analyze_energy`` (data test, fraction and ratio
intervals: the analysis of one row group) with the studentized and the balanced-EL interval, and
of each method's interval alone, side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from anistat.stats.calibrate import (
    HEAVIER_SCENARIOS,
    SCENARIOS,
    _interval_methods,
    _jsonable,
    _simulated_study,
    run_calibration,
)
from anistat.stats.ratio_intervals import (
    CONCENTRATION_LEVELS,
    COVERAGE_CEILING,
    COVERAGE_FLOOR,
    RATIO_INTERVAL_METHODS,
    SPREAD_LEVELS,
    data_test_spread_threshold,
)


def _energies(rng: np.random.Generator, sequences: int, d: int = 768, k: int = 8, tokens: int = 32):
    """Per-sequence proxy and total energies of anisotropic gradients (λ_j ∝ 1/j) with lognormal
    sequence scales, as ``bench_stats.py`` makes them."""
    u = np.linalg.qr(rng.standard_normal((d, k)))[0]
    z = rng.standard_normal((sequences, 1, d)) * 0.7 + rng.standard_normal((sequences, tokens, d))
    z *= np.exp(0.25 * rng.standard_normal(sequences))[:, None, None]
    g = (z / np.arange(1, d + 1)).reshape(-1, d)
    proxy = ((g @ u) ** 2).sum(axis=1).reshape(sequences, tokens).sum(axis=1)
    total = (g * g).sum(axis=1).reshape(sequences, tokens).sum(axis=1)
    return proxy, total


def _cpu_median(call, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return float(np.median(times))


def interval_cost() -> dict:
    """Median CPU seconds of today's row-group analysis and of each interval method alone."""
    from anistat.stats import analyze_energy, bootstrap_weights, cluster_sums, ratio_interval

    rng = np.random.default_rng(0)
    out = {}
    for label, sequences, per_document in (("128 sequences in 32 documents", 128, 4), ("96 sequences", 96, 1)):
        proxy, total = _energies(rng, sequences)
        documents = np.repeat(np.arange(sequences // per_document), per_document)
        reference = 8 / 768 * total
        null = rng.uniform(0.0, 0.02, 999)

        def analysis(method, proxy=proxy, total=total, reference=reference, documents=documents, null=null):
            analyze_energy(
                proxy,
                total,
                reference,
                rank=8,
                dim=768,
                null_fractions=null,
                group_ids=documents,
                n_bootstrap=1000,
                n_test_resamples=2000,
                seed=1,
                ci_method=method,
            )

        sums, n = cluster_sums(np.stack([proxy, reference], axis=1), documents)
        weights = bootstrap_weights(n, 2000, seed=1)
        row = {f"analyze_energy ({m})": _cpu_median(lambda m=m: analysis(m)) for m in ("studentized", "balanced_el")}
        for method in RATIO_INTERVAL_METHODS:
            row[method] = _cpu_median(
                lambda method=method, sums=sums, weights=weights, n=n: ratio_interval(
                    sums[:, 0], sums[:, 1], method, weights, expand_units=n
                )
            )
        out[label] = row
        print(label + ": " + ", ".join(f"{name} {1e3 * value:.2f} ms" for name, value in row.items()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=250, help="simulated studies per scenario, condition, size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-null", type=int, default=199, help="Haar draws of the exact test (not studied here)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--planted", type=float, nargs="+", default=[1.0], help="planted ratios besides random")
    parser.add_argument("--documents", type=int, nargs="+", default=[60, 30, 200], help="study sizes")
    parser.add_argument("--cost", action="store_true", help="time the methods at the d = 768 shape instead")
    parser.add_argument("--coverage", action="store_true", help="coverage alone, heavier laws included")
    parser.add_argument("--laws", nargs="+", default=None, help="--coverage: these laws only (default all)")
    parser.add_argument(
        "--coverage-pool", nargs="+", default=None, help="print the laws of these --coverage files, pooled"
    )
    parser.add_argument("--pool", nargs="+", default=None, help="print the tables of these --out files, pooled")
    args = parser.parse_args()
    if args.pool:
        print_tables(*pool(args.pool))
        return
    if args.cost:
        interval_cost()
        return
    if args.coverage_pool:
        laws: dict[str, dict[str, list[float]]] = {}  # a law's studies from every file, concatenated
        for path in args.coverage_pool:
            with open(path, encoding="utf-8") as fh:
                for law, columns in json.load(fh)["laws"].items():
                    for name, values in columns.items():
                        laws.setdefault(law, {}).setdefault(name, []).extend(values)
        print_coverage({"laws": laws})
        return
    if args.coverage:
        table = coverage_by_law(args.studies, args.seed, args.documents, args.laws)
        print_coverage(table)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as fh:
                json.dump(_jsonable(table), fh)
        return
    t0 = time.perf_counter()
    # one run per size, each keeping its studies: the per-study m_eff and data-test p-values are
    # what the flagged / unflagged split of the data test's level needs (the seeds of a study do
    # not depend on its size, so this is the same as one run over all sizes)
    runs = [
        run_calibration(
            args.studies,
            seed=args.seed,
            scenarios=SCENARIOS,
            planted_ratios=tuple(args.planted),
            n_documents=size,
            coverage_documents=(),
            n_null=args.n_null,
            keep_simulations=True,
        )
        for size in args.documents
    ]
    print(f"{args.studies} studies per scenario, condition and size; {time.perf_counter() - t0:.0f} s")
    payload = {
        "conditions": [row for run in runs for row in run.conditions],
        "concentration": _pooled_levels([list(run.concentration) for run in runs]),
        "studies": {
            f"{size}/{key}": {column: [float(x) for x in columns[column]] for column in STUDY_COLUMNS}
            for size, run in zip(args.documents, runs, strict=True)
            for key, columns in run.simulations.items()
        },
        "settings": {**runs[0].settings, "documents": list(args.documents)},
    }
    print_tables(payload["conditions"], payload["concentration"], payload["studies"])
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(_jsonable(payload), fh, indent=1)


#: The per-study columns an ``--out`` file keeps.
STUDY_COLUMNS = ("m_eff", "n_eff", "p_data_document", "cover_method_adjusted_el_f")


def print_tables(conditions: list[dict], concentration: list[dict], studies: dict | None = None) -> None:
    """Coverage per scenario × documents × method (± one binomial SE), the data test's level at
    ratio 1, both by ``m_eff`` level, and (with the per-study columns) the data test's level by
    energy spread ``n/n_eff`` and among the rows the concentration warning flags and the others."""
    import pandas as pd

    frame = pd.DataFrame(conditions)
    header = ["scenario", "documents", "n_eff (median)", "m_eff (median)", *RATIO_INTERVAL_METHODS, "data test at 1"]
    print(" | ".join(header))
    for (scenario, size), group in frame.groupby(["scenario", "documents"], sort=False):
        cells = []
        for method in RATIO_INTERVAL_METHODS:
            value = float(group[f"coverage_method_{method}"].mean())
            se = float(np.sqrt(value * (1 - value) / group["n_simulations"].sum()))
            cells.append(f"{value:.3f} ± {se:.3f}")
        null = group[group["condition"] == "1.0"]
        data = (
            f"{null['rejection_data_document'].iloc[0]:.3f} ± {null['rejection_data_document_se'].iloc[0]:.3f}"
            if len(null)
            else "—"
        )
        medians = [f"{group['n_eff_median'].median():.1f}", f"{group['m_eff_median'].median():.1f}"]
        print(" | ".join([scenario, str(size), *medians, *cells, data]))
    print("by m_eff: low | high | studies | " + " | ".join(RATIO_INTERVAL_METHODS) + " | data test (studies)")
    for row in concentration:
        cells = [f"{row[f'coverage_{m}']:.3f} ± {row[f'coverage_{m}_se']:.3f}" for m in RATIO_INTERVAL_METHODS]
        data = f"{row['rejection_data']:.3f} ± {row['rejection_data_se']:.3f} ({row['data_test_studies']})"
        high = float("inf") if row["m_eff_high"] is None else row["m_eff_high"]  # JSON writes inf as null
        print(" | ".join([f"{row['m_eff_low']:g}", f"{high:g}", str(row["studies"]), *cells, data]))
    if studies:
        print_flagged(studies)


def spread_levels(studies: dict, alpha: float = 0.05) -> tuple[list[float], list[int]]:
    """The data test's rejection rate and studies at a planted ratio of 1 per
    :data:`~anistat.stats.ratio_intervals.SPREAD_LEVELS` level of the energy spread ``n/n_eff``
    (as :func:`anistat.stats.calibrate.spread_rows`)."""
    spread, rejected = _spreads(studies, alpha)
    rates, counts = [], []
    for low, high in SPREAD_LEVELS:
        inside = (spread >= low) & (spread < high)
        rates.append(float(rejected[inside].mean()) if inside.any() else float("nan"))
        counts.append(int(inside.sum()))
    return rates, counts


def _spreads(studies: dict, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Every ratio-1 study's energy spread ``n/n_eff`` and whether the data test rejected it."""
    spread, rejected = [], []
    for key, columns in studies.items():
        size, _, condition = key.split("/")
        if condition == "1.0":
            spread.extend(int(size) / np.asarray(columns["n_eff"]))
            rejected.extend(np.asarray(columns["p_data_document"]) <= alpha)
    return np.asarray(spread), np.asarray(rejected, dtype=bool)


def print_flagged(studies: dict, alpha: float = 0.05) -> None:
    """The data test's level by energy spread, then per scenario × documents at a planted ratio of
    1: its level over all studies, the share at or above the spread threshold those levels give
    (:func:`~anistat.stats.ratio_intervals.data_test_spread_threshold`, the run warning's rule)
    and the level among the others."""
    rates, counts = spread_levels(studies, alpha)
    print("data test by n/n_eff: low | high | level (studies)")
    for (low, high), rate, count in zip(SPREAD_LEVELS, rates, counts, strict=True):
        se = np.sqrt(rate * (1 - rate) / count) if count else float("nan")
        print(f"{low:g} | {high:g} | {rate:.3f} ± {se:.3f} ({count})")
    threshold = data_test_spread_threshold(SPREAD_LEVELS, rates, counts, alpha)
    print(f"data test at ratio 1, flagged from n/n_eff {threshold:g}: documents | scenario | all | flagged | unflagged")

    def rate(x: np.ndarray) -> str:
        return f"{x.mean():.3f} ± {np.sqrt(x.mean() * (1 - x.mean()) / x.size):.3f} ({x.size})" if x.size else "—"

    for key, columns in studies.items():
        size, scenario, condition = key.split("/")
        if condition != "1.0":
            continue
        spread = int(size) / np.asarray(columns["n_eff"])
        rejected = np.asarray(columns["p_data_document"]) <= alpha
        kept = spread < threshold
        print(f"{size} | {scenario} | {rate(rejected)} | {1 - kept.mean():.3f} | {rate(rejected[kept])}")


def _pooled_levels(runs: list[list[dict]]) -> list[dict]:
    """Concentration levels of several runs (sizes or seeds), pooled: rates weighted by studies."""
    levels: dict[float, list[dict]] = {}
    for run in runs:
        for row in run:
            levels.setdefault(row["m_eff_low"], []).append(row)
    concentration = []
    for low in sorted(levels):
        rows = levels[low]
        row = dict(rows[0], studies=sum(r["studies"] for r in rows))
        row["data_test_studies"] = sum(r["data_test_studies"] for r in rows)
        for method in RATIO_INTERVAL_METHODS:
            key = f"coverage_{method}"
            row[key], row[f"{key}_se"] = _pooled_rate(rows, key, "studies")
        row["rejection_data"], row["rejection_data_se"] = _pooled_rate(rows, "rejection_data", "data_test_studies")
        concentration.append(row)
    return concentration


def _pooled_rate(rows: list[dict], key: str, weight: str) -> tuple[float, float]:
    """A rate over several runs' rows, weighted by their studies, and its binomial SE."""
    n = sum(r[weight] for r in rows if r[key] is not None)
    value = sum(r[key] * r[weight] for r in rows if r[key] is not None) / n if n else float("nan")
    return value, float(np.sqrt(value * (1 - value) / n)) if n else float("nan")


def pool(paths: list[str]) -> tuple[list[dict], list[dict], dict]:
    """The conditions, ``m_eff`` levels and per-study columns of several ``--out`` files of the
    same settings but the seed, pooled: rates weighted by their studies (medians: the mean of
    the runs')."""
    runs = [json.load(open(path, encoding="utf-8")) for path in paths]
    conditions = []
    for rows in zip(*(run["conditions"] for run in runs), strict=True):
        row = dict(rows[0], n_simulations=sum(r["n_simulations"] for r in rows))
        for key in row:
            if key.startswith(("coverage_", "rejection_")) and not key.endswith("_se"):
                row[key], row[f"{key}_se"] = _pooled_rate(list(rows), key, "n_simulations")
        for key in ("n_eff_median", "m_eff_median"):
            row[key] = float(np.mean([r[key] for r in rows]))
        conditions.append(row)
    studies = {
        key: {column: [x for run in runs for x in run["studies"][key][column]] for column in STUDY_COLUMNS}
        for key in runs[0]["studies"]
    }
    return conditions, _pooled_levels([run["concentration"] for run in runs]), studies


#: The settings of ``anistat calibrate``'s simulated studies that the coverage-only mode uses.
_STUDY = dict(
    dim=24,
    rank=3,
    sequences_per_document=4.0,
    tokens_per_sequence=[4, 16],
    within_correlation=0.3,
    document_correlation=0.3,
    topic_rank=2,
    scale_sd=0.25,
    n_bootstrap=1000,
    n_test_resamples=1000,
    ci_level=0.95,
)


def coverage_by_law(studies: int, seed: int, sizes: list[int], laws: list[str] | None = None) -> dict:
    """Per law (scenario; ``laws``, default every one): every study's ``m_eff`` and each method's
    coverage of the haar ratio, at the random proxy and a planted ratio of 1, ``studies`` per
    condition and size (a law's seeds do not depend on which other laws run)."""
    every = SCENARIOS + HEAVIER_SCENARIOS
    out: dict = {}
    t0 = time.process_time()
    for law in laws or every:
        li = every.index(law)
        rows = []
        for ci, condition in enumerate(("random", 1.0)):
            for size in sizes:
                cfg = {**_STUDY, "n_documents": size}
                for i in range(studies):
                    rng = np.random.default_rng(np.random.SeedSequence([seed, li, ci, size, i]))
                    p_seq, t_seq, _, sigma, u, documents, clustered = _simulated_study(rng, law, condition, cfg)
                    k, d = cfg["rank"], cfg["dim"]
                    truth = float(np.trace(u.T @ sigma @ u) / np.trace(sigma)) / (k / d)
                    common = {**cfg, "seed": int(rng.integers(2**62))}
                    rows.append(_interval_methods(p_seq, t_seq, documents if clustered else None, truth, k, d, common))
        out[law] = {key: [float(row[key]) for row in rows] for key in rows[0]}
        print(f"{law}: {len(rows)} studies, {time.process_time() - t0:.0f} s CPU", flush=True)
    return {"laws": out, "settings": {**_STUDY, "studies": studies, "seed": seed, "documents": sizes}}


def coverage_levels(table: dict, method: str = "adjusted_el_f") -> list[dict]:
    """Per :data:`~anistat.stats.ratio_intervals.CONCENTRATION_LEVELS` level: studies and coverage
    pooled over the laws, and every law's coverage and studies there."""
    levels = []
    for low, high in CONCENTRATION_LEVELS:
        row: dict = {"m_eff_low": low, "m_eff_high": high, "laws": {}}
        hits = total = 0
        for law, columns in table["laws"].items():
            m_eff, cover = np.asarray(columns["m_eff"]), np.asarray(columns[f"cover_method_{method}"])
            inside = (m_eff >= low) & (m_eff < high)
            if inside.any():
                row["laws"][law] = (float(cover[inside].mean()), int(inside.sum()))
                hits, total = hits + int(cover[inside].sum()), total + int(inside.sum())
        row["coverage"], row["studies"] = (hits / total if total else float("nan")), total
        levels.append(row)
    return levels


def print_coverage(table: dict, min_studies: int = 200) -> None:
    """Coverage by ``m_eff`` level (pooled ± binomial SE, then the lowest and highest law with at
    least ``min_studies`` studies there, and whether it lies outside the band beyond its margin)
    for each method."""
    for method in RATIO_INTERVAL_METHODS:
        print(f"{method}: low | high | studies | pooled | lowest law | highest law")
        for row in coverage_levels(table, method):
            if not row["studies"]:
                continue
            value, n = row["coverage"], row["studies"]
            laws = {law: cell for law, cell in row["laws"].items() if cell[1] >= min_studies}
            cells = []
            for pick in (min, max):
                if not laws:
                    cells.append("—")
                    continue
                law = pick(laws, key=lambda name: laws[name][0])
                rate, count = laws[law]
                margin = 1.96 * np.sqrt(0.95 * 0.05 / count)
                off = rate < COVERAGE_FLOOR - margin or rate > COVERAGE_CEILING + margin
                cells.append(f"{rate:.3f} {law} ({count}){' OFF' if off else ''}")
            se = np.sqrt(value * (1 - value) / n)
            print(f"{row['m_eff_low']:g} | {row['m_eff_high']:g} | {n} | {value:.3f} ± {se:.3f} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
