"""The whole `anistat run` on a local Pythia-shaped model vs the floor passes it needs.

Run (from the repository root):

    PYTHONPATH=. python benchmarks/bench_run.py --dim 768 --layers 12 --vocab 50304 --json /tmp/bench_run.json

A randomly initialised GPT-NeoX model of the given shape (default: Pythia-160m's) is saved as a
local checkpoint directory with a byte-level BPE tokenizer trained on the built-in corpus, and a
protocol measures it (one checkpoint, all residual sites, the paper's settings by default: PCA ranks
8/32/128 and 20 normal controls — `--ranks`, `--kinds`, `--n-controls` — default statistics, report
without PDF). The run is timed phase by phase from its own log, then — in the same process,
right after — the floor: the fit split's forward through the transformer body (phase 1: every
block, no LM head, `fit_floor_pass`) plus the test split's forward and backward to the probes
(phase 2), on the same model and the same number of tokens. Goal:
run ÷ floor ≤ 1.5.

The JSON says where the time goes: `phase_seconds` splits the run into disjoint phases that add
up to `run_seconds` (model loading and tokenising, fit forward, proxies, concept cards, test pass,
analysis, report, other; see `phase_seconds`), `phase_ratio_to_floor` compares the two passes
with their floors, `fixed_seconds` is everything but those two passes, and `functions` lists the
inclusive time and call count of each timed function (`TIMED`; e.g. `_load_pretrained` counts
checkpoint loads); `stages` are the manifest's own stage timings (`anistat.timing`). `--threads N`
is the run's thread setting (and so its N analysis and figure worker processes) and the floor's
torch threads. `--profile FILE` writes cProfile stats of the run; `--keep-units DIR` keeps the
run's measured units for `bench_analysis_workers.py --units-from DIR`.

Sizes used in benchmarks/README.md (both `--threads 1 --clock cpu`): `--n-fit 32 --n-test 32`
and a realistic study, `--n-fit 64 --n-test 256`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collect import floor_collect, make_model, make_splits  # noqa: E402

#: Functions timed inside the run (module, attribute): each is wrapped for the run's duration and
#: its inclusive time and call count recorded. Calls nest (fit_bases holds fit_proxy, …), so the
#: phases below are built by subtraction, not by summing every row.
TIMED = (
    ("anistat.pipeline", "preflight"),
    ("anistat.pipeline", "load_corpus"),
    ("anistat.models", "_load_pretrained"),
    ("anistat.models", "_pretrained_tokenizer"),
    ("anistat.models", "make_splits"),
    ("anistat.models", "_pretrained_series"),
    ("anistat.pipeline", "sites_from_spec"),
    ("anistat.pipeline", "fit_bases"),
    ("anistat.collect.bases", "fit_proxies"),
    ("anistat.collect.bases", "draw_controls"),
    ("anistat.pipeline", "concept_cards"),
    ("anistat.pipeline", "measure_checkpoint"),
    ("anistat.finalize", "analyze_run"),
    ("anistat.analyze", "frequency_rows"),
    ("anistat.analyze", "run_exact_tests"),
    ("anistat.analyze", "prepare_unit"),
    ("anistat.claims", "evaluate_claims"),
    ("anistat.finalize", "publish_bundle"),
    ("anistat.bundle", "write_results"),
    ("anistat.bundle", "report_inputs"),
    ("anistat.report", "render_bundle"),
    ("anistat.report.render", "render_figures"),
    ("anistat.report.render", "render_html"),
    ("anistat.report.render", "render_tables"),
    ("anistat.report.render", "render_report_tex"),
    ("anistat.bundle", "file_digests"),
)


class FunctionTimer:
    """Wrap the `TIMED` functions with a clock; restore them on exit."""

    def __init__(self, clock):
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.saved: list[tuple[object, str, object]] = []

    def __enter__(self):
        import importlib

        for module_name, attribute in TIMED:
            module = importlib.import_module(module_name)
            original = getattr(module, attribute)
            self.saved.append((module, attribute, original))
            setattr(module, attribute, self._wrap(attribute, original))
        return self

    def _wrap(self, name, original):
        def timed(*args, **kwargs):
            started = self.clock()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - started
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def __exit__(self, *exc):
        for module, attribute, original in reversed(self.saved):
            setattr(module, attribute, original)
        return False


def phase_seconds(total: float, t: dict[str, float]) -> dict[str, float]:
    """The run split into disjoint phases (they add up to `total`), from the timed functions.

    fit_forward: phase 1's model forward passes and activation sampling (fit_bases minus the
    proxy fits, control draws and concept cards); proxies: PCA fits + control draws; concept
    cards; test_pass: measure_checkpoint (the test split's forward/backward and statistics);
    model_loading: loading the checkpoint, the tokenizer, tokenising the corpus; analysis:
    analyze_run (results and frequency tables) + claims; report: publish_bundle (tables, figures, HTML, LaTeX,
    digests); other: the rest (protocol, preflight, corpus, sites, …)."""
    g = lambda name: t.get(name, 0.0)  # noqa: E731
    phases = {
        "model_loading_and_tokenising": g("_pretrained_series"),
        "fit_forward": g("fit_bases") - g("fit_proxies") - g("draw_controls") - g("concept_cards"),
        "proxies_pca_and_controls": g("fit_proxies") + g("draw_controls"),
        "concept_cards": g("concept_cards"),
        "test_pass": g("measure_checkpoint"),
        "analysis": g("analyze_run") + g("evaluate_claims"),
        "report": g("publish_bundle"),
    }
    phases["other"] = total - sum(phases.values())
    return {k: round(v, 3) for k, v in phases.items()}


def save_model_with_tokenizer(directory: Path, args) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from anistat.corpus import load_corpus
    from anistat.protocol import DataSpec

    model = make_model(args.dim, args.layers, args.vocab, args.seq_len, arch="gpt-neox")
    model.save_pretrained(directory)
    documents = load_corpus(DataSpec()).documents
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        documents,
        vocab_size=min(args.vocab, args.tokenizer_vocab),
        show_progress=False,
        special_tokens=["<|endoftext|>"],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tokenizer.save_pretrained(directory)


def protocol_for(model_dir: Path, args) -> dict:
    return {
        "anistat_protocol": 1,
        "name": "bench-run",
        "seed": 0,
        "device": "cpu",
        "data": {
            "source": "builtin",
            "seq_len": args.seq_len,
            "n_fit_sequences": args.n_fit,
            "n_test_sequences": args.n_test,
            "batch_size": args.batch_size,
        },
        "models": [{"name": "pythia-shape", "source": "local", "path": str(model_dir), "objective": "clm"}],
        "sites": {"kind": "residual", "layers": "all"},
        "proxies": {"methods": ["pca"], "ranks": args.ranks},
        "controls": {"kinds": args.kinds, "n": args.n_controls},
        **({"stats": {"ci_method": args.ci_method}} if args.ci_method else {}),
        "report": {"compile_pdf": False},
    }


def fit_floor_pass(model, tokens: torch.Tensor, batch_size: int) -> None:
    """The least a fit pass can do: the fit split through the transformer body only (every
    block, up to the last site; no LM head, no gradients, nothing recorded). anistat's fit
    forward also stops after the last site (`pipeline._FitForwardCut`)."""
    body = model.base_model
    with torch.no_grad():
        for start in range(0, tokens.shape[0], batch_size):
            body(input_ids=tokens[start : start + batch_size])


@contextlib.contextmanager
def _token_counts_kept():
    """Record the corpus token counts per model that `collect_units` hands the analysis."""
    import anistat.pipeline as pipeline

    kept: dict = {}
    original = pipeline.collect_units

    def collect_units(*args, **kwargs):
        artifacts, info = original(*args, **kwargs)
        kept.update(info["frequency"])
        return artifacts, info

    pipeline.collect_units = collect_units
    try:
        yield kept
    finally:
        pipeline.collect_units = original


def keep_units(tmp: Path, protocol: Path, token_counts: dict, into: Path) -> None:
    """The run's cached units (`<cache>/units`), its protocol and token counts, copied to ``into``."""
    import shutil

    (units,) = (tmp / ".anistat-cache").glob("*/units")
    shutil.copytree(units, into / "units", dirs_exist_ok=True)
    shutil.copy(protocol, into / "protocol.yaml")
    np.savez(into / "token_counts.npz", **{name: np.asarray(c) for name, c in token_counts.items()})
    shutil.rmtree(units.parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--tokenizer-vocab", type=int, default=8000, help="BPE merges learnt on the built-in corpus")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-fit", type=int, default=32)
    parser.add_argument("--n-test", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--ranks", type=int, nargs="+", default=[8, 32, 128], help="PCA ranks (default: the paper's 8 32 128)"
    )
    parser.add_argument("--kinds", nargs="+", default=["normal"], help="control kinds (default: the paper's normal)")
    parser.add_argument("--n-controls", type=int, default=20, help="controls.n (default: the paper's 20)")
    parser.add_argument("--ci-method", default=None, help="stats.ci_method (default: the protocol's default)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time, or process CPU time (stable on a shared machine; use with --threads 1)",
    )
    parser.add_argument("--profile", default=None, help="also write cProfile stats of the run to this file")
    parser.add_argument(
        "--keep-bundle", default=None, help="copy the run's bundle here (to profile `anistat report` on it)"
    )
    parser.add_argument(
        "--keep-units",
        default=None,
        help="copy the run's measured units, protocol and corpus token counts here "
        "(`bench_analysis_workers.py --units-from` analyses them)",
    )
    args = parser.parse_args()
    from anistat.pipeline import run

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = tmp / "model"
        save_model_with_tokenizer(model_dir, args)
        protocol = tmp / "protocol.yaml"
        protocol.write_text(yaml.safe_dump(protocol_for(model_dir, args), sort_keys=False))
        if args.threads:
            torch.set_num_threads(args.threads)
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        events: list[tuple[float, str]] = []
        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
        counts = _token_counts_kept() if args.keep_units else contextlib.nullcontext({})
        with FunctionTimer(clock) as timer, counts as token_counts:
            started = clock()
            if profiler:
                profiler.enable()
            result = run(
                protocol,
                tmp / "bundle",
                threads=args.threads or None,  # the run's thread setting: also its analysis and figure workers
                log=lambda message: events.append((clock() - started, message)),
                keep_cache=bool(args.keep_units),
            )
            if profiler:
                profiler.disable()
            wall = clock() - started
        if profiler:
            profiler.dump_stats(args.profile)
        if args.keep_units:
            keep_units(tmp, protocol, token_counts, Path(args.keep_units))
        if args.keep_bundle:
            import shutil

            shutil.copytree(tmp / "bundle", args.keep_bundle, dirs_exist_ok=True)
        manifest = result.manifest
        # the floor, same process, same model and token counts
        model = make_model(args.dim, args.layers, args.vocab, args.seq_len, arch="gpt-neox").eval()
        splits = make_splits(args.n_test, args.seq_len, args.vocab)
        fit_tokens = torch.randint(
            0, args.vocab, (args.n_fit, args.seq_len), generator=torch.Generator().manual_seed(1)
        )
        layers = list(range(args.layers))
        t0 = clock()
        fit_floor_pass(model, fit_tokens, args.batch_size)
        fit_floor = clock() - t0
        t0 = clock()
        floor_collect(model, splits, layers, args.batch_size)
        test_floor = clock() - t0
    phases = []
    previous = 0.0
    for at, message in events:
        phases.append({"until_s": round(at, 2), "took_s": round(at - previous, 2), "log": message})
        previous = at
    floor = fit_floor + test_floor
    phase = phase_seconds(wall, timer.seconds)
    # fixed costs: everything but the passes the floor also makes (fit forward, test pass)
    fixed = wall - phase["fit_forward"] - phase["test_pass"]
    out = {
        "config": vars(args),
        "clock": args.clock,
        "run_seconds": wall,
        "floor_seconds": {"fit_forward": fit_floor, "test_forward_backward": test_floor},
        "ratio_to_floor": wall / floor,
        "phase_seconds": phase,
        "stages": manifest.get("stages", {}),
        "phase_ratio_to_floor": {
            "fit_forward": phase["fit_forward"] / fit_floor,
            "test_pass": phase["test_pass"] / test_floor,
        },
        "fixed_seconds": round(fixed, 3),
        "fixed_share_of_run": round(fixed / wall, 3),
        "functions": {
            name: {"seconds": round(seconds, 3), "calls": timer.calls[name]} for name, seconds in timer.seconds.items()
        },
        "unit_seconds": [u["seconds"] for u in manifest["units"]],
        "log": phases,
    }
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
