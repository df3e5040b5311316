"""P1 / P2 / P4 benchmarks of the collector, each measured side by side in one run, as ratios.

Run (from the repository root):

    PYTHONPATH=. python benchmarks/bench_collect.py all --json /tmp/bench_collect.json

P1  probe overhead inside training: a GPT-2-style model trained with AdamW, plain vs with a
    `TrainingMeter` measuring true gradients at *every* step (all blocks' residual streams,
    default proxy rank 4, 20 normal + 20 Haar controls) — interleaved repetitions, median
    seconds per step; ratio = meter / plain (goal ≤ 1.05).
P2  post-hoc collection throughput (tokens/s) on the same model and test split:
      anistat — `measure_checkpoint` (additive probes, autograd.grad to the probes only,
                parameters frozen, batched projections on the device);
      naive   — output_hidden_states + `retain_grad` on every block output + full
                `loss.backward()` with parameter gradients + projections and moments in NumPy;
      floor   — forward + backward to the hidden states only (probes, frozen parameters), no
                statistics.
    Goals: anistat ≥ 1.5× naive tokens/s; anistat time ≤ 1.2× floor time.
      floor_plus_moments — the floor plus only the two d×d second moments the exact test and
                the activation geometry need: the arithmetic lower bound of anistat's pass.
P4  peak RSS of a fresh process measuring 10× more test tokens ÷ the same at 1× (goal ≤ 1.1),
    with the pipeline's default budget for per-type sums (1024 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from anistat.collect import BasisSet, UnitKey, collect_fit_activations, measure_checkpoint
from anistat.data import Splits
from anistat.geometry import draw_controls, fit_proxy
from anistat.models import lm_loss


def make_model(dim: int, layers: int, vocab: int, seq_len: int, seed: int = 0, arch: str = "gpt2"):
    """A randomly initialised decoder of the given shape: `gpt2`, or `gpt-neox` (Pythia's
    architecture: rotary attention on 25 % of each head, parallel attention/MLP residual)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    if arch == "gpt-neox":
        from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

        config = GPTNeoXConfig(
            vocab_size=vocab,
            hidden_size=dim,
            num_hidden_layers=layers,
            num_attention_heads=max(1, dim // 64),
            intermediate_size=4 * dim,
            rotary_pct=0.25,
            max_position_embeddings=max(2048, seq_len),
            use_parallel_residual=True,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            bos_token_id=None,
            eos_token_id=None,
        )
        return GPTNeoXForCausalLM(config)
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab,
        n_positions=seq_len,
        n_embd=dim,
        n_layer=layers,
        n_head=max(1, dim // 64),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(config)


def make_splits(n_test: int, seq_len: int, vocab: int, seed: int = 0, tokens: str = "uniform") -> Splits:
    """Random token ids: `uniform` over the vocabulary (every token nearly a new type: the
    worst case for per-type statistics), or `zipf` (rank-frequency ∝ 1/r^1.1, like text)."""
    generator = torch.Generator().manual_seed(seed)
    if tokens == "zipf":
        weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** 1.1
        test = torch.multinomial(weights, n_test * seq_len, replacement=True, generator=generator).view(n_test, seq_len)
    else:
        test = torch.randint(0, vocab, (n_test, seq_len), generator=generator)
    fit = torch.randint(0, vocab, (16, seq_len), generator=generator)
    return Splits(
        test=test,
        fit=fit,
        train=fit,
        test_documents=np.arange(n_test),
        token_counts=np.ones(vocab, np.int64),
        vocab_size=vocab,
        mask_token_id=None,
        pad_token_id=None,
        decode=lambda ids: "",
        tokenizer_id="bench",
    )


def make_bases(model, splits, layers, rank=4, n_controls=20, per_token_controls=None, device="cpu", acts=None):
    """PCA proxies of the given rank per layer, with `n_controls` normal + `n_controls` Haar draws.

    `per_token_controls` (an int) instead builds what the collector projects per token in the
    default configuration since issue #12: Haar and normal controls are evaluated at analysis
    time from the second moment, so `BasisSet.controls` holds only kinds without a closed form
    (`pca_span`, `cov_matched`) — none by default (0), or that many extra columns to price
    one control."""
    if acts is None:
        acts = collect_fit_activations(model, splits.fit, layers, batch_size=16, device=torch.device(device))
    bases = {}
    for layer in layers:
        sample = acts[layer].reshape(-1, acts[layer].shape[-1])
        proxy = fit_proxy(sample, "pca", rank, seed=layer)
        if per_token_controls is None:
            controls = {
                kind: draw_controls(kind, proxy.basis, n_controls, seed=layer + 100 * i)
                for i, kind in enumerate(("normal", "haar"))
            }
        elif per_token_controls > 0:  # the projection cost of a control does not depend on its kind
            controls = {"pca_span": draw_controls("haar", proxy.basis, per_token_controls, seed=layer)}
        else:
            controls = {}
        bases[layer] = [BasisSet("pca", rank, proxy.basis, controls)]
    return bases


#: what `anistat run` passes by default (data.frequency_ci_memory_mb = 1024,
#: data.type_statistics_memory_mb = 1024)
PIPELINE_PAIR_BUDGET = 1024 * 2**20
PIPELINE_TYPE_BUDGET = 1024 * 2**20


def anistat_collect(
    model,
    splits,
    layers,
    bases,
    batch_size,
    pair_budget_bytes=PIPELINE_PAIR_BUDGET,
    device="cpu",
    precision="fp32",
    type_budget_bytes=PIPELINE_TYPE_BUDGET,
):
    """`pair_budget_bytes` > 0 also keeps the per-(sequence, type) activation sums behind the
    frequency-correlation CI, as `anistat run` does by default."""
    keys = {layer: UnitKey("bench", "clm", "c", 0, "early", layer, f"residual.{layer}") for layer in layers}
    return measure_checkpoint(
        model,
        keys=keys,
        bases=bases,
        splits=splits,
        objective="clm",
        token_bucket=torch.zeros(splits.vocab_size, dtype=torch.long),
        n_buckets=1,
        mlm_probability=0.15,
        seed=0,
        batch_size=batch_size,
        device=torch.device(device),
        isoscore_c0="scaled_identity",
        isoscore_zeta=0.1,
        pair_budget_bytes=pair_budget_bytes,
        precision=precision,
        type_budget_bytes=type_budget_bytes,
    )


def naive_collect(model, splits, layers, bases, batch_size, device="cpu"):
    """The straightforward way: retain_grad on returned hidden states, a full backward with
    parameter gradients, projections (proxy and every control, per token) and moments in NumPy."""
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    model.eval()
    matrices = {
        layer: [bases[layer][0].basis.cpu().numpy()]
        + [q.cpu().numpy() for stack in bases[layer][0].controls.values() for q in stack]
        for layer in layers
    }
    n_seq, seq_len = splits.test.shape
    energies = {layer: np.zeros((n_seq, len(matrices[layer]))) for layer in layers}
    outer = {layer: 0.0 for layer in layers}
    for start in range(0, n_seq, batch_size):
        batch = splits.test[start : start + batch_size].to(device)
        model.zero_grad(set_to_none=True)
        out = model(input_ids=batch, output_hidden_states=True)
        hidden = [out.hidden_states[layer + 1] for layer in layers]
        for h in hidden:
            h.retain_grad()
        logits = out.logits[:, :-1]
        loss = (
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="none"
            )
            .view(batch.shape[0], -1)
            .mean(1)
            .sum()
        )
        loss.backward()
        for layer, h in zip(layers, hidden):
            g = h.grad[:, :-1].double().cpu().numpy()
            for j, q in enumerate(matrices[layer]):
                energies[layer][start : start + batch.shape[0], j] = ((g @ q) ** 2).sum(axis=(1, 2))
            flat = g.reshape(-1, g.shape[-1])
            outer[layer] = outer[layer] + flat.T @ flat
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return energies


def floor_collect(model, splits, layers, batch_size, device="cpu", precision="fp32", on_batch=None):
    """Forward + backward to the hidden states only (the probes), no statistics; `on_batch`
    (record, gradients), if given, runs after each batch's backward."""
    from anistat.collect import residual_probe
    from anistat.collect.collector import autocast

    device = torch.device(device)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    model.eval()
    n_seq = splits.test.shape[0]
    for start in range(0, n_seq, batch_size):
        batch = splits.test[start : start + batch_size].to(device)
        with torch.enable_grad(), autocast(device, precision), residual_probe(model, layers, gradients=True) as record:
            loss = lm_loss(model, batch, batch, "clm")
            gradients = torch.autograd.grad(loss, [record.deltas[layer] for layer in layers])
        if on_batch is not None:
            on_batch(record, gradients)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return gradients


def floor_plus_moments(model, splits, layers, batch_size, device="cpu", precision="fp32"):
    """The floor plus only the two d×d second moments (gradients and activations, float32
    per-batch products into float64 sums, as the collector takes them): the arithmetic lower
    bound of a pass that keeps what the exact test and the activation geometry need."""
    from anistat.collect.collector import add_gram_

    dim = model.config.hidden_size
    outers = {layer: torch.zeros(2, dim, dim, dtype=torch.float64, device=device) for layer in layers}

    def moments(record, gradients):
        for layer, gradient in zip(layers, gradients):
            rows = torch.stack(
                [gradient[:, :-1].reshape(-1, dim).float(), record.activations[layer][:, :-1].reshape(-1, dim).float()]
            )
            add_gram_(outers[layer], rows, upper_only=torch.device(device).type == "cpu")

    floor_collect(model, splits, layers, batch_size, device, precision, on_batch=moments)
    return outers


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


# ----------------------------------------------------------------------------------------------
def bench_p2(args) -> dict:
    """P2 side by side: anistat in the default configuration (proxy projections only, see
    `make_bases`), the same with +N per-token controls and with twice the rank (the marginal
    costs), without the per-(sequence, type) sums, the naive loop (20 normal + 20 Haar controls
    projected per token, as the paper's procedure needs) and the floor."""
    model = make_model(args.dim, args.layers, args.vocab, args.seq_len, arch=args.arch).eval()
    splits = make_splits(args.n_test, args.seq_len, args.vocab)
    layers = list(range(args.layers))
    acts = collect_fit_activations(model, splits.fit, layers, batch_size=16, device=torch.device("cpu"))
    default = make_bases(model, splits, layers, per_token_controls=0, acts=acts)
    extra = make_bases(model, splits, layers, per_token_controls=args.extra_controls, acts=acts)
    double_rank = make_bases(model, splits, layers, rank=8, per_token_controls=0, acts=acts)
    paper = make_bases(model, splits, layers, n_controls=20, acts=acts)
    tokens = splits.test.numel()
    device, precision = args.device, args.precision
    model.to(device)
    pipeline_pairs = PIPELINE_PAIR_BUDGET

    def ours(bases, pairs=pipeline_pairs):
        return lambda: anistat_collect(model, splits, layers, bases, args.batch_size, pairs, device, precision)

    runs = {
        "anistat": ours(default),
        "anistat_no_pair_sums": ours(default, 0),
        f"anistat_plus_{args.extra_controls}_controls": ours(extra),
        "anistat_rank_8": ours(double_rank),
        "naive": lambda: naive_collect(model, splits, layers, paper, args.batch_size, device),
        "floor": lambda: floor_collect(model, splits, layers, args.batch_size, device, precision),
        "floor_plus_moments": lambda: floor_plus_moments(model, splits, layers, args.batch_size, device, precision),
    }
    if args.skip_marginal:
        for name in ("anistat_no_pair_sums", f"anistat_plus_{args.extra_controls}_controls", "anistat_rank_8"):
            runs.pop(name)
    # warm-up (allocator, first-call dispatch) on the two kinds of pass
    floor_collect(model, splits, layers, args.batch_size, device, precision)
    ours(default)()
    times = {name: [] for name in runs}
    cpu_times = {name: [] for name in runs}
    outputs = {}
    for _ in range(args.repeats):  # interleaved, so background load hits every method alike
        for name, fn in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            outputs[name] = fn()
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - wall)
            cpu_times[name].append(time.process_time() - cpu)
    # agreement: the naive proxy energies equal anistat's
    measured, naive = outputs["anistat"], outputs["naive"]
    # (not the last block: the last returned hidden state is the final norm's *output*, so
    # retain_grad there yields the gradient w.r.t. a different tensor — the pitfall the
    # additive probe avoids)
    agreement = max(
        float(
            np.max(
                np.abs(measured[layer].energy[:, 0, 0] - naive[layer][:, 0])
                / np.maximum(np.abs(naive[layer][:, 0]), 1e-30)
            )
        )
        for layer in layers[:-1]
    )
    median = wall_median = {name: statistics.median(t) for name, t in times.items()}
    if args.clock == "cpu":  # process CPU time: the work done, whatever else the machine runs
        median = {name: statistics.median(t) for name, t in cpu_times.items()}
    floor = median["floor"]
    marginal = {}
    if not args.skip_marginal:
        marginal = {
            "ratio_to_floor_no_pair_sums": median["anistat_no_pair_sums"] / floor,
            "cost_per_extra_control_of_floor": (
                median[f"anistat_plus_{args.extra_controls}_controls"] - median["anistat"]
            )
            / args.extra_controls
            / floor,
            "cost_per_extra_rank_of_floor": (median["anistat_rank_8"] - median["anistat"]) / 4 / floor,
        }
    return {
        "config": {
            "device": device,
            "precision": precision,
            "arch": args.arch,
            "dim": args.dim,
            "layers": args.layers,
            "vocab": args.vocab,
            "seq_len": args.seq_len,
            "n_test": args.n_test,
            "batch_size": args.batch_size,
            "rank": 4,
            "per_token_controls": "none (haar/normal from the second moment at analysis time)",
            "naive_controls": "20 normal + 20 haar, projected per token",
            "sites": f"residual.0..{args.layers - 1}",
            "repeats": args.repeats,
            "tokens": tokens,
        },
        "seconds": median,
        "tokens_per_s": {k: tokens / v for k, v in median.items()},
        "wall_seconds": wall_median,
        "speedup_vs_naive": median["naive"] / median["anistat"],
        "ratio_to_floor": median["anistat"] / floor,
        # the two second moments alone, ÷ the floor; and anistat ÷ that lower bound
        "moments_only_ratio_to_floor": median["floor_plus_moments"] / floor,
        "ratio_to_floor_plus_moments": median["anistat"] / median["floor_plus_moments"],
        "naive_ratio_to_floor": median["naive"] / floor,
        **marginal,
        "max_relative_difference_vs_naive": agreement,
        "clock": args.clock,
        "threads": torch.get_num_threads(),
        "all_seconds": times,
        "all_cpu_seconds": cpu_times,
    }


def bench_p1(args) -> dict:
    from anistat.callbacks import TrainingMeter

    generator = torch.Generator().manual_seed(3)
    batches = [
        torch.randint(0, args.vocab, (args.train_batch, args.seq_len), generator=generator) for _ in range(args.steps)
    ]

    def train(measure: bool, out: str) -> list[float]:
        model = make_model(args.dim, args.layers, args.vocab, args.seq_len, seed=1, arch=args.arch)
        model.train()
        optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
        meter = None
        if measure:
            meter = TrainingMeter(
                model,
                out=out,
                fit_steps=[0],
                measure_steps=[0],
                window=args.steps,
                name="bench",
                report={"compile_pdf": False},
            )
        per_step = []
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        for step, batch in enumerate(batches):
            started = clock()
            if meter is not None:
                meter.begin(step)
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            if meter is not None:
                meter.end()
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
            per_step.append(clock() - started)
        # the unit closes itself (statistics finished, artifact written) inside the last timed step;
        # the bundle/report rendering of `meter.close()` is a one-off after training and not timed
        assert meter is None or len(meter.artifacts) == args.layers
        return per_step[2:]  # first steps: allocator warm-up, fitting the proxies (once)

    import tempfile

    plain, metered = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            plain.extend(train(False, ""))
            metered.extend(train(True, os.path.join(tmp, f"bundle{repeat}")))
    return {
        "config": {
            "dim": args.dim,
            "layers": args.layers,
            "vocab": args.vocab,
            "seq_len": args.seq_len,
            "train_batch": args.train_batch,
            "steps": args.steps,
            "repeats": args.repeats,
            "sites": f"residual.0..{args.layers - 1}",
            "rank": 4,
            "controls": "20 normal + 20 haar",
            "measured": "every step",
        },
        "seconds_per_step": {"plain": statistics.median(plain), "anistat": statistics.median(metered)},
        "ratio": statistics.median(metered) / statistics.median(plain),
        "ratio_of_means": statistics.fmean(metered) / statistics.fmean(plain),
        "clock": args.clock,
        "threads": torch.get_num_threads(),
    }


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as stream:
        for line in stream:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def p4_child(n_test: int, args) -> dict:
    """Peak RSS of the collection phase alone: after the (identical) setup, the kernel's RSS
    high-water mark is reset (`echo 5 > /proc/self/clear_refs`), so VmHWM afterwards is the
    peak reached while measuring — setup spikes (imports, fitting) cannot hide growth."""
    model = make_model(args.dim, args.layers, args.vocab, args.seq_len, arch=args.arch).eval()
    splits = make_splits(16, args.seq_len, args.vocab)
    layers = list(range(args.layers))
    bases = make_bases(model, splits, layers, per_token_controls=0)
    splits = make_splits(n_test, args.seq_len, args.vocab, tokens=args.tokens)
    import gc

    gc.collect()
    reset = True
    try:
        with open("/proc/self/clear_refs", "w") as stream:
            stream.write("5")
    except OSError:
        reset = False
    before = _status_kb("VmRSS")
    artifacts = anistat_collect(
        model,
        splits,
        layers,
        bases,
        args.batch_size,
        int(args.pair_budget_mb * 2**20),
        type_budget_bytes=args.type_budget_mb * 2**20,
    )
    first = artifacts[layers[0]]
    peak = _status_kb("VmHWM")
    return {
        "n_test": n_test,
        "tokens": n_test * args.seq_len,
        "peak_rss_kb": peak,
        "distinct_types": int((first.type_count > 0).sum()),
        "types_seen_twice": int((first.type_count >= 2).sum()),
        "types_kept": int(np.isfinite(first.type_rms_distance).sum()),
        "rss_before_collect_kb": before,
        "hwm_reset": reset,
        "process_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def bench_p4(args) -> dict:
    results = {}
    for factor in (1, 10):
        n_test = args.n_test * factor
        command = [
            sys.executable,
            __file__,
            "p4-child",
            "--n-test",
            str(n_test),
            "--dim",
            str(args.dim),
            "--arch",
            args.arch,
            "--layers",
            str(args.layers),
            "--vocab",
            str(args.vocab),
            "--seq-len",
            str(args.seq_len),
            "--batch-size",
            str(args.batch_size),
            "--pair-budget-mb",
            str(args.pair_budget_mb),
            "--type-budget-mb",
            str(args.type_budget_mb),
            "--tokens",
            args.tokens,
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[f"{factor}x"] = json.loads(done.stdout.strip().splitlines()[-1])
    one, ten = results["1x"], results["10x"]
    return {
        "runs": results,
        "ratio": ten["peak_rss_kb"] / one["peak_rss_kb"],
        "growth_above_setup_kb": {k: v["peak_rss_kb"] - v["rss_before_collect_kb"] for k, v in results.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["p1", "p2", "p4", "all", "p4-child"])
    parser.add_argument("--arch", choices=["gpt2", "gpt-neox"], default="gpt2")
    parser.add_argument("--extra-controls", type=int, default=20, help="P2: per-token controls added to price one")
    parser.add_argument("--skip-marginal", action="store_true", help="P2: skip the +controls / rank 8 / no-pairs runs")
    parser.add_argument("--device", default="cpu", help="P2: cpu or cuda")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="P2 on cuda: autocast")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-test", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pair-budget-mb",
        type=float,
        default=0.0,
        help="P4: memory for per-(sequence, type) sums (0: off, the constant-memory path; "
        "anistat run defaults to 1024 and then grows with the test split up to that cap)",
    )
    parser.add_argument(
        "--type-budget-mb",
        type=float,
        default=1024.0,
        help="P4: memory for per-type sums (data.type_statistics_memory_mb; inf: every type seen twice)",
    )
    parser.add_argument("--tokens", choices=["uniform", "zipf"], default="uniform", help="P4: test-split token ids")
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="P2: compare wall time, or process CPU time (steadier than wall time on a busy machine; "
        "use with --threads 1)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.what == "p4-child":
        print(json.dumps(p4_child(args.n_test, args)))
        return
    out = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
        }
    }
    if args.what in ("p1", "all"):
        out["P1"] = bench_p1(args)
        print("P1", json.dumps(out["P1"], indent=1), flush=True)
    if args.what in ("p2", "all"):
        out["P2"] = bench_p2(args)
        print("P2", json.dumps({k: v for k, v in out["P2"].items() if k != "all_seconds"}, indent=1), flush=True)
    if args.what in ("p4", "all"):
        out["P4"] = bench_p4(args)
        print("P4", json.dumps(out["P4"], indent=1), flush=True)
    out["machine"]["load_average_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(out, stream, indent=1)


if __name__ == "__main__":
    main()
