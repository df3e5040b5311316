"""Set-ups shared by several test files (imported as ``from _helpers import …``; pytest puts
tests/ on the path). Only torch and transformers here: each test file imports the anistat
modules it exercises itself, so tests/project/test_tiers.py sees what the fast tier reaches."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

# ----------------------------------------------------------------------------------------------
# measuring inside a training loop: a tiny GPT-2, its batches, a Trainer
# ----------------------------------------------------------------------------------------------
#: Meter / callback settings small enough for a test: two sites, one rank-2 proxy, four controls.
SETTINGS: dict[str, Any] = dict(
    sites={"kind": ["residual", "mlp"], "layers": [0]},
    proxies={"ranks": [2], "max_fit_tokens": 80},
    controls={"kinds": ["normal"], "n": 4},
    stats={"n_bootstrap": 20, "n_permutations": 20},
)
#: A meter's schedule for a test: proxies fitted at steps 0 and 1, measured at steps 1 and 3 over
#: 2-step gradient windows, under the run name "plain".
PLAIN_SCHEDULE: dict[str, Any] = dict(fit_steps=[0, 1], measure_steps=[1, 3], window=2, name="plain")

VOCAB = 48


def tiny_gpt2(seed: int = 0, *, layers: int = 2, heads: int = 2, inner: int = 32):
    """A GPT-2 of width 16 over a 48-token vocabulary, without dropout (the same forward twice)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=16,
        n_embd=16,
        n_layer=layers,
        n_head=heads,
        n_inner=inner,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(config)


def batches(n: int, batch: int = 4, length: int = 12) -> list[torch.Tensor]:
    """`n` seeded batches of token ids (batch, length)."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (batch, length), generator=generator) for _ in range(n)]


class Tokens(torch.utils.data.Dataset):
    """The training batches of `batches(6)` as a Trainer dataset (labels = inputs)."""

    def __init__(self):
        self.rows = torch.cat(batches(6))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return {"input_ids": self.rows[index], "labels": self.rows[index]}


def tiny_trainer(folder: Path, callbacks: list, *, model=None, max_steps: int = 5, **arguments):
    """A CPU `transformers.Trainer` of `tiny_gpt2()` (or `model`) on `Tokens()`: batches of 4,
    `max_steps` steps at learning rate 0.01, seed 0, nothing saved or logged, its output in
    `folder/trainer`; `arguments` add to or replace the `TrainingArguments`."""
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    from transformers import Trainer, TrainingArguments

    settings: dict[str, Any] = dict(
        output_dir=str(folder / "trainer"),
        per_device_train_batch_size=4,
        max_steps=max_steps,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    args = TrainingArguments(**{**settings, **arguments})
    return Trainer(
        model=model if model is not None else tiny_gpt2(), args=args, train_dataset=Tokens(), callbacks=callbacks
    )


# ----------------------------------------------------------------------------------------------
# post-hoc collection
# ----------------------------------------------------------------------------------------------
def measure_arguments(splits, **changes: Any) -> dict[str, Any]:
    """The `measure_checkpoint` keywords the collection tests share — one frequency bucket, MLM
    masking 0.15, seed 0, batches of 4 on CPU, ΔIsoScore* against the scaled identity (ζ = 0.1)
    — with `changes` (keys, bases, objective, …) added or replacing them."""
    return {
        "splits": splits,
        "token_bucket": torch.zeros(splits.vocab_size, dtype=torch.long),
        "n_buckets": 1,
        "mlm_probability": 0.15,
        "seed": 0,
        "batch_size": 4,
        "device": torch.device("cpu"),
        "isoscore_c0": "scaled_identity",
        "isoscore_zeta": 0.1,
        **changes,
    }


def add_corpus(accumulator, rng, ids, activations, **options: Any) -> None:
    """All of `ids` (n_seq, length) with their `activations` as one batch at row 0 of a
    `SiteAccumulator`: standard normal gradients drawn from `rng`, one frequency bucket;
    `options` (e.g. ``type_mask``) go to `SiteAccumulator.add`."""
    n_seq, length = ids.shape
    accumulator.add(
        torch.as_tensor(rng.normal(size=(n_seq, length, accumulator.dim))),
        torch.as_tensor(activations),
        torch.as_tensor(ids),
        torch.ones(n_seq, length, 1),
        start=0,
        **options,
    )


# ----------------------------------------------------------------------------------------------
# a report in headless Chromium
# ----------------------------------------------------------------------------------------------
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def run_chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with a fresh profile directory, no network, GPU, sync or first-run
    chores, logging to stderr; `args` say what to load and dump (120 s at most)."""
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


# ----------------------------------------------------------------------------------------------
# tampering with a written bundle
# ----------------------------------------------------------------------------------------------
def edit_a_number(bundle: Path) -> None:
    """Change one estimate in the bundle's results.csv by hand (the first energy_ratio row's
    becomes 123.456), leaving manifest.json and results.parquet as they were."""
    lines = (bundle / "results.csv").read_text().splitlines()
    header = lines[0].split(",")
    column = header.index("estimate")
    row = next(i for i, line in enumerate(lines[1:], 1) if ",energy_ratio," in line)
    cells = lines[row].split(",")
    cells[column] = "123.456"
    lines[row] = ",".join(cells)
    (bundle / "results.csv").write_text("\n".join(lines) + "\n")
