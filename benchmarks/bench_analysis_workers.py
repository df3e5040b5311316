"""The analysis stage alone over worker processes: `analyze_run` with N workers ÷ 1 worker on the
same units (goal for 2 workers on a 2-core machine: ≤ 0.6), with each stage's wall seconds and the
bound the one-worker stages set: the exact tests already run on all the run's threads with one
worker, so only the rest can shrink (`bound` = (exact + rest / N) / total). `task_slowdown` is
the CPU seconds of the rest with N workers ÷ with 1 (the workers' tasks included: a task runs
slower when N share the machine's caches and memory), and `bound_with_slowdown` the bound with it.

Run (from the repository root):

    PYTHONPATH=. python benchmarks/bench_analysis_workers.py --units 12 --dim 768 --workers 2 --repeats 3

The units are `bench_stats.synthetic_unit`s (4 096 tokens in 32 documents, planted PCA proxies at
the paper's ranks 8/32/128, 20 normal controls, the paper-replication statistics: Holm per model,
2 000 bootstrap resamples). The two settings alternate (1, N, 1, N, …) so a change in the
machine's load falls on both; the tables are checked to be identical, bit for bit. The fork
server's start (its imports) is paid before the first timed call, as a run pays it while it
collects (`anistat.workers.start_server`).

`--units-from DIR` analyses a real run's units instead — with their frequency buckets, the
per-(sequence, type) sums and the frequency rows — as kept by
`bench_run.py --keep-units DIR` (the run's protocol, cached units and corpus token counts):

    PYTHONPATH=. python benchmarks/bench_run.py --n-fit 32 --n-test 96 --threads 2 --keep-units /tmp/units96
    PYTHONPATH=. python benchmarks/bench_analysis_workers.py --units-from /tmp/units96 --workers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stats import PROTOCOL, synthetic_unit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--proxies",
        choices=["planted", "random"],
        default="planted",
        help="planted (every exact test uses all its draws) or Haar-random proxies (the tests stop early)",
    )
    parser.add_argument("--units-from", default=None, help="a real run's units (bench_run.py --keep-units DIR)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    from anistat.analyze import analyze_run
    from anistat.protocol import Protocol
    from anistat.runtime import cpu_threads
    from anistat.timing import StageTimer
    from anistat.workers import start_server

    protocol = Protocol.model_validate(
        yaml.safe_load(PROTOCOL) | {"proxies": {"methods": ["pca"], "ranks": args.ranks}}
    )
    token_counts: dict = {}
    if args.units_from:
        from anistat.collect import UnitArtifact

        kept = Path(args.units_from)
        protocol = Protocol.model_validate(yaml.safe_load((kept / "protocol.yaml").read_text()))
        artifacts = [UnitArtifact.load(path) for path in sorted((kept / "units").glob("*.json"))]
        with np.load(kept / "token_counts.npz") as counts:
            token_counts = {name: counts[name] for name in counts.files}
    else:
        rng = np.random.default_rng(args.dim)
        artifacts = [
            synthetic_unit(rng, args.dim, args.ranks, planted=args.proxies == "planted", layer=i)
            for i in range(args.units)
        ]
    start_server(args.workers)
    seconds: dict[int, list[float]] = {1: [], args.workers: []}
    walls: dict[int, list[dict[str, float]]] = {1: [], args.workers: []}
    cpus: dict[int, list[dict[str, float]]] = {1: [], args.workers: []}
    tables = {}
    with cpu_threads(args.workers):  # the run's thread setting: its exact tests use them all
        for _ in range(args.repeats):
            for workers in (1, args.workers):
                timer = StageTimer()
                started = time.perf_counter()
                with timer.activate():
                    analysis = analyze_run(artifacts, token_counts, protocol, "cpu", workers=workers)
                tables[workers] = analysis.results.to_csv() + analysis.frequency.to_csv()
                seconds[workers].append(time.perf_counter() - started)
                walls[workers].append({name: time.wall for name, time in timer.stages().items()})
                cpus[workers].append({name: time.cpu for name, time in timer.stages().items()})
    identical = tables[1] == tables[args.workers]
    one, many = statistics.median(seconds[1]), statistics.median(seconds[args.workers])
    out = {
        "units": len(artifacts),
        "units_from": args.units_from,
        "dim": artifacts[0].dim,
        "ranks": sorted({rank for unit in artifacts for _, rank in unit.proxy_bases}),
        "proxies": "real" if args.units_from else args.proxies,
        "workers": args.workers,
        "seconds": {str(k): [round(s, 2) for s in v] for k, v in seconds.items()},
        "median_ratio": round(many / one, 3),
        "stages": {str(k): _median_stages(v) for k, v in walls.items()},
        # Amdahl's bound on N workers ÷ 1: the exact tests run in this process on all the run's
        # threads in both settings, so only the rest can shrink, at best by N
        "bound": round(_bound(_median_stages(walls[1]), args.workers), 3),
        # CPU seconds per stage, the workers' tasks included: N workers' CPU ÷ 1 worker's, outside
        # the exact tests, is how much slower a task runs when N run at once on this machine
        "cpu_stages": {str(k): _median_stages(v) for k, v in cpus.items()},
        "task_slowdown": round(_slowdown(_median_stages(cpus[1]), _median_stages(cpus[args.workers])), 3),
        # the bound with that slowdown: (exact + rest × slowdown / N) / total
        "bound_with_slowdown": round(
            _bound(
                _median_stages(walls[1]),
                args.workers,
                _slowdown(_median_stages(cpus[1]), _median_stages(cpus[args.workers])),
            ),
            3,
        ),
        "identical": identical,
        "load_before_after": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def _median_stages(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each stage's median wall seconds over the runs."""
    names = sorted({name for run in runs for name in run})
    return {name: round(statistics.median(run.get(name, 0.0) for run in runs), 2) for name in names}


def _bound(stages: dict[str, float], workers: int, slowdown: float = 1.0) -> float:
    """The smallest N workers ÷ 1 the one-worker stage times allow: (exact + rest · slowdown / N) / total."""
    total = sum(stages.values())
    exact = stages.get("exact tests", 0.0)
    return (exact + (total - exact) * slowdown / workers) / total if total else 1.0


def _slowdown(one: dict[str, float], many: dict[str, float]) -> float:
    """CPU seconds of every stage but the exact tests with N workers ÷ with 1."""
    rest = [name for name in one if name != "exact tests"]
    return sum(many.get(name, 0.0) for name in rest) / max(sum(one[name] for name in rest), 1e-12)


if __name__ == "__main__":
    main()
