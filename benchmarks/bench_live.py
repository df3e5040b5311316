"""Cost of the live metrics (`anistat.live`) on a measured training step, as a ratio.

Run (from the repository root):

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/bench_live.py [--device cpu] [--json OUT]

A GPT-2-small-shaped model (d = 768, 12 blocks, 12 heads, vocabulary 50257, random weights,
nothing downloaded) trains with AdamW under a `TrainingMeter` measuring three residual streams
(blocks 0, 6, 11) at proxy ranks 8 and 32 with 20 normal controls, the live metrics going to a
no-op logger. Step 0 fits the proxies; steps 1 … n are measured. On each measured step the
benchmark times the whole step (forward, backward, the meter's statistics, optimiser step) and,
inside it, the live metrics alone (`TrainingMeter._publish_live`: the oracle's top eigenvalues
by one float32 `eigvalsh` per site, the proxies' traces; completing the second moments'
accumulated triangles is left out of it, as the unit's finishing does that anyway).
Reported: the median of live ÷ step over the measured steps (goal ≤ 0.02), and for scale one
float32 and one float64 `eigvalsh` of a 768 × 768 second moment. `--oracle-every n` passes
`live_oracle_every=n` (the oracle on every n-th measured step only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from anistat.callbacks import TrainingMeter


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=4, help="measured steps (after one fit step)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--oracle-every", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from transformers import GPT2Config, GPT2LMHeadModel

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=args.seq_len)).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, 50257, (args.batch, args.seq_len), generator=generator).to(device)
        for _ in range(args.steps + 1)
    ]
    with tempfile.TemporaryDirectory() as folder:
        meter = TrainingMeter(
            model,
            out=Path(folder) / "bundle",
            fit_steps=[0],
            measure_steps=range(1, args.steps + 1),
            verbose=False,
            logger=lambda name, value, step: None,
            live_oracle_every=args.oracle_every,
            sites={"kind": ["residual"], "layers": [0, 6, 11]},
            proxies={"ranks": [8, 32], "max_fit_tokens": 2048},
            controls={"kinds": ["normal"], "n": 20},
        )
        live_seconds: list[float] = []
        publish = meter._publish_live

        def timed_publish(step: int) -> None:
            # completing the accumulated triangles of the second moments is work the unit's
            # finishing does anyway (and then skips): done here untimed, so live = the extra cost
            for accumulator in (meter._open.accumulators if meter._open else {}).values():
                accumulator.grad  # noqa: B018 - the property completes the moments
            _sync(device)
            start = time.perf_counter()
            publish(step)
            _sync(device)
            live_seconds.append(time.perf_counter() - start)

        meter._publish_live = timed_publish  # type: ignore[method-assign]
        step_seconds = []
        for step, batch in enumerate(batches):
            _sync(device)
            start = time.perf_counter()
            with meter.step(step):
                model(input_ids=batch, labels=batch).loss.backward()
            optimiser.step()
            optimiser.zero_grad()
            _sync(device)
            if step > 0:
                step_seconds.append(time.perf_counter() - start)
        meter.close()
    ratios = [live / step for live, step in zip(live_seconds, step_seconds)]
    g = torch.randn(args.batch * args.seq_len, 768, device=device, dtype=torch.float64)
    moment = g.T @ g
    eigvalsh_seconds = {}
    for dtype in (torch.float32, torch.float64):
        matrix = moment.to(dtype)
        _sync(device)
        start = time.perf_counter()
        torch.linalg.eigvalsh(matrix)
        _sync(device)
        eigvalsh_seconds[str(dtype).removeprefix("torch.")] = time.perf_counter() - start
    report = {
        "machine": platform.processor() or platform.machine(),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "batch": args.batch,
        "seq_len": args.seq_len,
        "sites": 3,
        "ranks": [8, 32],
        "step_seconds": step_seconds,
        "live_seconds": live_seconds,
        "live_over_step": ratios,
        "median_live_over_step": statistics.median(ratios),
        "oracle_every": args.oracle_every,
        "one_eigvalsh_768_seconds": eigvalsh_seconds,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    sys.exit(main())
