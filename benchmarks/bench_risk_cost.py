"""The cost of risk-bounded decisions (`stats.resampling_risk`) at the paper's settings.

The paper's 288 units — 96 at d = 768 (pythia-160m: 12 layers × 8 checkpoints) and 192 at
d = 1024 (pythia-410m: 24 × 8), ranks 8/32/128 — as `bench_stats.py` part B builds them
(synthetic units of 4 096 tokens in 128 sequences from 32 documents, λ_j ∝ 1/j; a planted proxy,
significant like a trained model's PCA, or a Haar-random one, the null), analysed by
`anistat.analyze.analyze_units` with the paper's statistics (Holm per model, 20 normal controls,
2 000 bootstrap resamples, 9 999 Haar draws at most, h = 10) with `stats.resampling_risk` off and
at ε, side by side on the same artifacts (off first, then on). Reported per width and proxy kind:
process CPU time, the streams' lengths, the draws per exact energy test behind ``p_value`` and
behind the risk-bounded decision, and the decisions.

    PYTHONPATH=. python benchmarks/bench_risk_cost.py --epsilon 0.001 --threads 1 --json /tmp/risk.json
    PYTHONPATH=. python benchmarks/bench_risk_cost.py --epsilon 0.001 --layout 768:96 --proxies planted
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stats import PROTOCOL, synthetic_unit  # noqa: E402

#: The paper's units per width: pythia-160m (d = 768, 12 layers × 8 checkpoints) and pythia-410m
#: (d = 1024, 24 layers × 8 checkpoints), 288 in all, each at ranks 8/32/128.
PAPER_UNITS = ((768, 96), (1024, 192))


def _risk_summary(results) -> dict:
    """Draws and decisions of a run's exact energy tests (the risk-bounded draws read off the
    rows' notes, where `analyze.units` records them)."""
    exact = results[(results["p_test"] == "haar_monte_carlo") & (results["metric"] == "energy_fraction")]
    exact = exact.drop_duplicates(["unit_id", "proxy", "rank"]) if "unit_id" in exact else exact
    risk = exact["note"].astype(str).str.extract(r"risk-bounded decision: (\d+) Haar")[0].dropna().astype(float)
    decisions = exact["mc_decision"].value_counts().to_dict() if "mc_decision" in exact else {}
    return {
        "tests": int(len(exact)),
        "p_value_draws_per_test": float(exact["n_controls"].mean()),
        "risk_draws_per_test": float(risk.mean()) if len(risk) else None,
        "decisions": {str(k): int(v) for k, v in decisions.items()},
    }


def part_risk(epsilon: float, proxies=("planted", "random"), layout=PAPER_UNITS, ranks=(8, 32, 128)) -> dict:
    """Analysis time at the paper's settings with `stats.resampling_risk` off and at ``epsilon``,
    side by side on the same artifacts (off first, then on), per width and proxy kind."""
    import yaml

    from anistat.analyze import analyze_run
    from anistat.protocol import Protocol

    rows = []
    for d, units in layout:
        for kind in proxies:
            rng = np.random.default_rng(d + (kind == "planted"))
            artifacts = [synthetic_unit(rng, d, ranks, planted=kind == "planted", layer=i) for i in range(units)]
            timed = {}
            for risk in (None, epsilon):
                settings = yaml.safe_load(PROTOCOL) | {"proxies": {"methods": ["pca"], "ranks": list(ranks)}}
                settings["stats"] = settings["stats"] | {"resampling_risk": risk}
                protocol = Protocol.model_validate(settings)
                started = time.process_time()
                analysis = analyze_run(artifacts, {}, protocol, frequency=False)
                results = analysis.results
                seconds = time.process_time() - started
                timed[risk] = seconds
                rows.append(
                    {
                        "d": d,
                        "units": units,
                        "proxy": kind,
                        "ranks": list(ranks),
                        "resampling_risk": risk,
                        "seconds": seconds,
                        "per_unit_s": seconds / units,
                        "draws_made": analysis.null_settings.get("draws_made"),
                        **_risk_summary(results),
                    }
                )
                print(json.dumps(rows[-1], default=float), flush=True)
            rows[-1]["ratio_on_to_off"] = timed[epsilon] / timed[None]
            del artifacts
    total = {risk: sum(r["seconds"] for r in rows if r["resampling_risk"] == risk) for risk in (None, epsilon)}
    return {
        "rows": rows,
        "total_seconds_off": total[None],
        "total_seconds_on": total[epsilon],
        "ratio_on_to_off": total[epsilon] / total[None],
        "threads": torch.get_num_threads(),
        "clock": "process CPU time",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=0.001, help="stats.resampling_risk when on")
    parser.add_argument("--proxies", nargs="+", default=["planted", "random"], choices=["planted", "random"])
    parser.add_argument(
        "--layout", nargs="+", default=None, metavar="D:UNITS", help="widths and units (default 768:96 1024:192)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (recorded)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layout = tuple(tuple(int(x) for x in item.split(":")) for item in args.layout) if args.layout else PAPER_UNITS
    result = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "part_risk": part_risk(args.epsilon, tuple(args.proxies), layout),
    }
    print(json.dumps(result, indent=1, default=float))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
