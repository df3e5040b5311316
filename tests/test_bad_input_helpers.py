"""Helpers (no tests) for the hardening suites: tiny local Hugging Face checkpoints (healthy or
deliberately broken) and a small synthetic corpus. Everything is built offline in ~1 s."""

from __future__ import annotations

from pathlib import Path

WORDS = [
    "the",
    "model",
    "reads",
    "text",
    "and",
    "the",
    "gradient",
    "flows",
    "back",
    "through",
    "every",
    "layer",
    "while",
    "the",
    "optimiser",
    "updates",
    "weights",
    "so",
    "that",
    "frequent",
    "tokens",
    "settle",
    "into",
    "a",
    "narrow",
    "cone",
    "of",
    "directions",
]


def corpus_text(n_words: int = 3000, seed: int = 0) -> str:
    """Deterministic word salad: enough tokens for a few dozen short sequences."""
    import random

    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    lines = [" ".join(words[k : k + 12]) + "." for k in range(0, n_words, 12)]
    return "\n".join(lines) + "\n"


def build_tiny_gpt2(
    directory: Path, *, hidden: int = 8, layers: int = 2, positions: int = 32, corrupt: str | None = None
) -> Path:
    """A `save_pretrained` GPT-2 (safetensors) with its tokenizer in `directory` (`positions`:
    the longest sequence it reads).

    corrupt: None (healthy); "nan_weights" (a NaN inside block 0: every activation is NaN);
    "inf_logits" (final layer-norm bias = +inf: residual activations stay finite, but the logits,
    the loss and so every gradient are NaN — the collector's NaN/Inf check must fire).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        [corpus_text()],
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<pad>", "<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(fast),
        n_positions=positions,
        n_embd=hidden,
        n_layer=layers,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        if corrupt == "nan_weights":
            model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
        elif corrupt == "inf_logits":
            model.transformer.ln_f.bias.fill_(float("inf"))
        elif corrupt is not None:
            raise ValueError(corrupt)
    directory = Path(directory)
    model.save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


def no_figures(monkeypatch) -> None:
    """Skip the (slow) matplotlib figures in tests about data and files, not pictures."""
    import anistat.report.render

    monkeypatch.setattr(anistat.report.render, "render_figures", lambda *args, **kwargs: ([], {}))


def local_protocol(
    name: str,
    model_path: Path,
    corpus: Path,
    *,
    ranks: str = "[2]",
    kinds: str = "[normal]",
    extra_model: str = "",
    extra: str = "",
) -> str:
    """A small protocol measuring one local checkpoint on a text corpus."""
    return (
        f"name: {name}\n"
        f"data: {{source: text, paths: ['{corpus}'], seq_len: 16, n_fit_sequences: 8, n_test_sequences: 8, "
        f"batch_size: 8}}\n"
        f"models: [{{name: m, source: local, path: '{model_path}'{extra_model}}}]\n"
        f"proxies: {{ranks: {ranks}, max_fit_tokens: 200, concept_card_tokens: 2}}\n"
        f"controls: {{kinds: {kinds}, n: 5}}\n"
        "stats: {n_bootstrap: 20, n_permutations: 20}\n"
        "report: {compile_pdf: false}\n" + extra
    )
