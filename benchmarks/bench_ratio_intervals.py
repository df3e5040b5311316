"""Coverage of the energy-ratio interval methods side by side, over every calibration scenario.

Runs :func:`anistat.stats.run_calibration` over all scenarios (``isotropic``, ``anisotropic``,
``clustered``, ``skewed``, ``heavy``, ``hot``) with the uninformative proxy and a planted ratio
of 1, at 30, 60 and 200 documents. Every simulated study computes the haar energy ratio's 95 %
interval by each method of :data:`anistat.stats.ratio_intervals.RATIO_INTERVAL_METHODS` on the
same per-document sums and resamples. Printed: coverage per scenario × documents × method (the
mean over the two conditions, ``2·studies`` studies per cell, ± one binomial Monte-Carlo SE), the
data test's level at ratio 1, and coverage and data-test level by Kish's effective number of
documents (pooled over scenarios, conditions and sizes).

Usage: ``python benchmarks/bench_ratio_intervals.py [--studies 250] [--out /tmp/ratio.json]``
(one process; about 0.1–0.3 s per study on one core).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from anistat.stats.calibrate import SCENARIOS, _jsonable, run_calibration
from anistat.stats.ratio_intervals import RATIO_INTERVAL_METHODS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=250, help="simulated studies per scenario, condition, size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-null", type=int, default=199, help="Haar draws of the exact test (not studied here)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    t0 = time.perf_counter()
    result = run_calibration(
        args.studies,
        seed=args.seed,
        scenarios=SCENARIOS,
        planted_ratios=(1.0,),
        n_documents=60,
        coverage_documents=(30, 200),
        n_null=args.n_null,
    )
    frame = result.to_frame()
    print(f"{args.studies} studies per scenario, condition and size; {time.perf_counter() - t0:.0f} s")
    header = ["scenario", "documents", "n_eff (median)", *RATIO_INTERVAL_METHODS, "data test at ratio 1"]
    print(" | ".join(header))
    for (scenario, size), group in frame.groupby(["scenario", "documents"], sort=False):
        cells = []
        for method in RATIO_INTERVAL_METHODS:
            value = float(group[f"coverage_method_{method}"].mean())
            se = float(np.sqrt(value * (1 - value) / (len(group) * args.studies)))
            cells.append(f"{value:.3f} ± {se:.3f}")
        null = group[group["condition"] == "1.0"].iloc[0]
        data = f"{null['rejection_data_document']:.3f} ± {null['rejection_data_document_se']:.3f}"
        print(" | ".join([scenario, str(size), f"{group['n_eff_median'].median():.1f}", *cells, data]))
    print("by n_eff: low | high | studies | " + " | ".join(RATIO_INTERVAL_METHODS) + " | data test (studies)")
    for row in result.concentration:
        cells = [f"{row[f'coverage_{m}']:.3f} ± {row[f'coverage_{m}_se']:.3f}" for m in RATIO_INTERVAL_METHODS]
        data = f"{row['rejection_data']:.3f} ± {row['rejection_data_se']:.3f} ({row['data_test_studies']})"
        print(" | ".join([f"{row['n_eff_low']:g}", f"{row['n_eff_high']:g}", str(row["studies"]), *cells, data]))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            payload = {"conditions": list(result.conditions), "concentration": list(result.concentration)}
            json.dump(_jsonable({**payload, "settings": result.settings}), fh, indent=1)


if __name__ == "__main__":
    main()
