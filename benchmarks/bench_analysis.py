"""The analysis stage alone (`analyze_run`) on one set of collected units, per interval method.

Two steps (from the repository root):

    PYTHONPATH=. python benchmarks/bench_analysis.py collect --units /tmp/units96 --n-fit 32 --n-test 96
    PYTHONPATH=. python benchmarks/bench_analysis.py time --units /tmp/units96 --repeats 3 --json /tmp/an.json

``collect`` runs `anistat run` on the Pythia-160m-shaped checkpoint of ``bench_run.py`` (the same
model, protocol and shape options: d = 768, 12 blocks, vocabulary 50 304, every residual site, PCA
ranks 8/32/128, 20 normal controls) up to the analysis and saves what the analysis receives — the
unit artifacts, the corpus token counts and the protocol — then stops (no analysis, no report).
``--protocol FILE`` collects that protocol instead (e.g. ``protocols/quickstart.yaml``).

``time`` loads them and runs the whole analysis (`anistat.analyze.analyze_run`: result rows, exact
tests, frequency rows — what ``bench_run.py`` reports as ``analysis`` less the claims) once per
``--methods`` entry per repeat, the methods interleaved (order alternating between repeats),
1 torch thread, process CPU time; it reports each method's median, its ratio to the first method,
and how many energy-ratio intervals of each kind the analysis computed (``ratio_interval`` calls,
the fraction and ratio intervals of every row group and of every frequency bucket).
``--save-results DIR`` writes each method's results and frequency tables as CSV with the bundle's
ten significant digits (``float_format="%.10g"``), so two code versions can be compared digit by
digit; ``--compare DIR`` compares this run's tables with such a folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run import protocol_for, save_model_with_tokenizer  # noqa: E402


class _Collected(Exception):
    """Raised by the intercepted analysis once its inputs are saved: the run stops there."""


def collect(args) -> None:
    """Run the protocol up to the analysis and save the analysis' inputs under ``args.units``."""
    import anistat.finalize as finalize
    import anistat.pipeline as pipeline

    units = Path(args.units)
    units.mkdir(parents=True, exist_ok=True)

    def save_inputs(artifacts, token_counts, protocol, device="cpu"):
        for artifact in artifacts:
            artifact.save(units / "artifacts")
        np.savez(units / "token_counts.npz", **{str(k): np.asarray(v) for k, v in token_counts.items()})
        (units / "protocol.json").write_text(protocol.model_dump_json())
        raise _Collected

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.protocol:
            protocol = Path(args.protocol)
        else:
            model_dir = Path(tmp) / "model"
            save_model_with_tokenizer(model_dir, args)
            protocol = Path(tmp) / "protocol.yaml"
            protocol.write_text(yaml.safe_dump(protocol_for(model_dir, args), sort_keys=False))
        finalize.analyze_run = save_inputs
        try:
            pipeline.run(protocol, Path(tmp) / "bundle")
        except _Collected:
            print(f"saved the analysis inputs of {len(list((units / 'artifacts').glob('*.json')))} units in {units}")
            return
    raise SystemExit("the run ended without reaching the analysis")


def _load(units: Path):
    from anistat.finalize import load_units
    from anistat.protocol import Protocol

    artifacts = load_units(units / "artifacts")
    with np.load(units / "token_counts.npz") as data:
        token_counts = {name: data[name] for name in data.files}
    protocol = Protocol.model_validate_json((units / "protocol.json").read_text())
    return artifacts, token_counts, protocol


def _counting_intervals():
    """Wrap `ratio_interval` where the analysis calls it; returns the counter and an undo."""
    import anistat.stats.energy as energy

    counts: dict[str, int] = {}
    original = energy.ratio_interval

    def counted(numerator, denominator, method, *args, **kwargs):
        counts[method] = counts.get(method, 0) + 1
        return original(numerator, denominator, method, *args, **kwargs)

    energy.ratio_interval = counted

    def undo():
        energy.ratio_interval = original

    return counts, undo


def time_analysis(args) -> dict:
    """Median CPU seconds of `analyze_run` per method, interleaved."""
    from anistat.analyze import analyze_run

    torch.set_num_threads(1)
    artifacts, token_counts, protocol = _load(Path(args.units))
    variants = {
        m: protocol.model_copy(update={"stats": protocol.stats.model_copy(update={"ci_method": m})})
        for m in args.methods
    }
    seconds: dict[str, list[float]] = {m: [] for m in args.methods}
    tables = {}
    for repeat in range(args.repeats):
        order = args.methods if repeat % 2 == 0 else args.methods[::-1]
        for method in order:
            start = time.process_time()
            tables[method] = analyze_run(artifacts, token_counts, variants[method], device="cpu")
            seconds[method].append(time.process_time() - start)
            print(f"repeat {repeat}: {method} {seconds[method][-1]:.2f} s", flush=True)
    counts = {}
    for method in args.methods:
        counted, undo = _counting_intervals()
        try:
            analyze_run(artifacts, token_counts, variants[method], device="cpu")
        finally:
            undo()
        counts[method] = counted
    results, frequency = tables[args.methods[0]].results, tables[args.methods[0]].frequency
    median = {m: statistics.median(s) for m, s in seconds.items()}
    out = {
        "config": vars(args),
        "units": len(artifacts),
        "result_rows": len(results),
        "frequency_rows": 0 if frequency is None else len(frequency),
        "seconds": seconds,
        "median_seconds": median,
        "ratio_to_first": {m: median[m] / median[args.methods[0]] for m in args.methods},
        "ratio_interval_calls": counts,
    }
    if args.save_results:
        _save_tables(Path(args.save_results), tables)
    if args.compare:
        out["compare"] = _compare_tables(Path(args.compare), tables)
    return out


def _save_tables(directory: Path, tables) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for method, (results, frequency) in tables.items():
        results.to_csv(directory / f"results_{method}.csv", index=False, float_format="%.10g", lineterminator="\n")
        if frequency is not None:
            frequency.to_csv(
                directory / f"frequency_{method}.csv", index=False, float_format="%.10g", lineterminator="\n"
            )


def _compare_tables(directory: Path, tables) -> dict:
    """Per method and table: the cells whose ten-significant-digit text differs from the saved one,
    and the largest relative difference of the numeric cells."""
    with tempfile.TemporaryDirectory() as tmp:
        _save_tables(Path(tmp), tables)
        out = {}
        for path in sorted(Path(tmp).glob("*.csv")):
            mine, saved = pd.read_csv(path, dtype=str), pd.read_csv(directory / path.name, dtype=str)
            differ = (mine != saved) & ~(mine.isna() & saved.isna())
            numeric_mine = mine.apply(pd.to_numeric, errors="coerce")
            numeric_saved = saved.apply(pd.to_numeric, errors="coerce")
            with np.errstate(invalid="ignore", divide="ignore"):
                relative = ((numeric_mine - numeric_saved).abs() / numeric_saved.abs()).to_numpy(dtype=float)
            finite = relative[np.isfinite(relative)]
            out[path.stem] = {
                "cells": int(mine.size),
                "cells_differing_at_10_digits": int(differ.to_numpy().sum()),
                "columns": sorted(mine.columns[differ.any(axis=0)].tolist()),
                "max_relative_difference": float(finite.max()) if finite.size else 0.0,
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["collect", "time"])
    parser.add_argument("--units", required=True, help="folder of the saved analysis inputs")
    parser.add_argument("--protocol", default=None, help="collect: this protocol instead of the Pythia-shaped one")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--tokenizer-vocab", type=int, default=8000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-fit", type=int, default=32)
    parser.add_argument("--n-test", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--kinds", nargs="+", default=["normal"])
    parser.add_argument("--n-controls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", nargs="+", default=["studentized", "balanced_el", "adjusted_el_f"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save-results", default=None, help="write each method's tables as CSV here")
    parser.add_argument("--compare", default=None, help="compare the tables with those saved here")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.ci_method = None  # bench_run's protocol_for: the protocol's default; `time` sets each method
    if args.step == "collect":
        collect(args)
        return
    out = time_analysis(args)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
