"""The whole `anistat run` on a local Pythia-shaped model vs the floor passes it needs.

Run (from the repository root):

    PYTHONPATH=. python benchmarks/bench_run.py --dim 768 --layers 12 --vocab 50304 --json /tmp/bench_run.json

A randomly initialised GPT-NeoX model of the given shape (default: Pythia-160m's) is saved as a
local checkpoint directory with a byte-level BPE tokenizer trained on the built-in corpus, and a
protocol measures it (one checkpoint, all residual sites, PCA rank 4, default controls, report
without PDF). The run is timed phase by phase from its own log, then — in the same process,
right after — the floor: the fit split's forward pass (phase 1) plus the test split's forward
and backward to the probes (phase 2), on the same model and the same number of tokens. Goal:
run ÷ floor ≤ 1.5.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collect import floor_collect, make_model, make_splits  # noqa: E402

from anistat.collect import collect_fit_activations  # noqa: E402


def save_model_with_tokenizer(directory: Path, args) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from anistat.data import load_corpus
    from anistat.protocol import DataSpec

    model = make_model(args.dim, args.layers, args.vocab, args.seq_len, arch="gpt-neox")
    model.save_pretrained(directory)
    documents = load_corpus(DataSpec()).documents
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(documents, vocab_size=min(args.vocab, args.tokenizer_vocab), show_progress=False,
                            special_tokens=["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                        pad_token="<|endoftext|>")
    tokenizer.save_pretrained(directory)


def protocol_for(model_dir: Path, args) -> dict:
    return {
        "anistat_protocol": 1, "name": "bench-run", "seed": 0, "device": "cpu",
        "data": {"source": "builtin", "seq_len": args.seq_len, "n_fit_sequences": args.n_fit,
                 "n_test_sequences": args.n_test, "batch_size": args.batch_size},
        "models": [{"name": "pythia-shape", "source": "local", "path": str(model_dir), "objective": "clm"}],
        "sites": {"kind": "residual", "layers": "all"},
        "proxies": {"methods": ["pca"], "ranks": [4]},
        "controls": {"kinds": ["normal", "haar"], "n": 20},
        "report": {"compile_pdf": False},
    }


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
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or process CPU time (stable on a shared machine; use with --threads 1)")
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
        started = clock()
        result = run(protocol, tmp / "bundle", log=lambda message: events.append((clock() - started, message)))
        wall = clock() - started
        manifest = result.manifest
        # the floor, same process, same model and token counts
        model = make_model(args.dim, args.layers, args.vocab, args.seq_len, arch="gpt-neox").eval()
        splits = make_splits(args.n_test, args.seq_len, args.vocab)
        fit_tokens = torch.randint(0, args.vocab, (args.n_fit, args.seq_len), generator=torch.Generator().manual_seed(1))
        layers = list(range(args.layers))
        t0 = clock()
        collect_fit_activations(model, fit_tokens, layers, batch_size=args.batch_size, device=torch.device("cpu"))
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
    out = {"config": vars(args), "clock": args.clock, "run_seconds": wall, "floor_seconds": {"fit_forward": fit_floor,
                                                                          "test_forward_backward": test_floor},
           "ratio_to_floor": wall / floor, "unit_seconds": [u["seconds"] for u in manifest["units"]],
           "phases": phases}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
