"""The collector: activations for fitting proxies (phase 1) and true gradients (phase 2).

Phase 1 runs the fit split through each early-window checkpoint with forward hooks only and
keeps a capped, seeded sample of token activations per site. Phase 2 runs the test split
through every checkpoint, takes ∂L/∂h at every selected site in one backward pass (parameter
gradients switched off: post hoc they are never needed), and reduces the per-token gradients
to per-sequence sufficient statistics on the fly (see `artifact.py`). Tensors stay on the
collection device until a unit is finished.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..data import Splits, mask_for_mlm
from ..geometry import GradientMoments, SequenceTypeSums, TypeMeanGeometry, delta_isoscore_star, type_mean_geometry
from ..objective import count_targets, lm_loss
from ..seeding import derive_seed
from . import distributed
from .artifact import BasisColumn, UnitArtifact, UnitKey
from .progress import bar
from .sites import as_sites, probe


@dataclass
class BasisSet:
    """A frozen proxy basis and the controls projected per token, for one (site, method, rank).

    `controls` holds only kinds whose energies need per-token projections (no closed-form
    expectation, or `stats.energy_ratio_reference: drawn`); haar / normal controls are drawn
    at analysis time from the unit's gradient moments (see `anistat.geometry.SpectralFrame`)."""

    proxy: str
    rank: int
    basis: torch.Tensor  # (d, k)
    controls: dict[str, torch.Tensor]  # kind -> (n, d, k)
    reconstruction_error: float = float("nan")
    concept_cards: list[dict] = field(default_factory=list)


@dataclass
class FitSample:
    """Fit-split activations of one site, with where each row came from (for concept cards)."""

    activations: torch.Tensor  # (N, d) float32, CPU
    token_ids: torch.Tensor  # (N,)
    sequence_index: torch.Tensor  # (N,) index into the fit split
    position: torch.Tensor  # (N,)


def model_inputs(
    tokens: torch.Tensor, splits: Splits, objective: str, mlm_probability: float, seed: int, purpose: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels for the model's own loss; MLM masks are fixed by (seed, purpose) so
    every checkpoint and every model sharing the data sees the same masked positions."""
    if objective == "mlm":
        generator = torch.Generator().manual_seed(derive_seed(seed, purpose, "mask"))
        return mask_for_mlm(
            tokens, splits.mask_token_id, splits.vocab_size, mlm_probability, generator, splits.maskable
        )
    return tokens, tokens


def counted_positions(objective: str, seq_len: int) -> int:
    """Positions whose hidden state can influence the loss: CLM's last position predicts nothing
    (its gradient is exactly zero by causality), so CLM uses positions 0..T−2. Within these,
    rows whose gradient is exactly zero are not counted as evaluated tokens (see below)."""
    return seq_len - 1 if objective == "clm" else seq_len


@torch.no_grad()
def collect_fit_activations(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    sites,
    *,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
) -> dict:
    """Activations (n_seq, T, d) per site for the given inputs (CPU, float32).

    `sites`: block indices (residual stream), site names or `Site`s; the result is keyed alike.
    Holds every activation of `inputs` — for capped, streaming fit samples use `FitSampler`."""
    collected: dict = {}
    model.to(device)
    resolved = as_sites(model, sites)
    for start in range(0, inputs.shape[0], batch_size):
        batch = inputs[start : start + batch_size].to(device)
        with autocast(device, precision), probe(model, resolved, gradients=False) as record:
            model(input_ids=batch)
        for key in resolved:
            collected.setdefault(key, []).append(record.activations[key].float().cpu())
    return {key: torch.cat(chunks) for key, chunks in collected.items()}


class FitSampler:
    """A seeded sample of at most `max_tokens` fit activations per site, pooled over the early
    checkpoints, built while streaming: the kept row indices are drawn up front (the same
    `randperm` as `sample_fit_tokens` over the pooled rows), so only kept rows are ever stored —
    memory is bounded by the protocol's cap, not by the fit split. Under torchrun each rank
    fills the rows of its batches and `finish` all-reduces them (exact: rows are disjoint)."""

    def __init__(self, keys, *, n_checkpoints: int, token_ids: torch.Tensor, max_tokens: int, seeds: dict):
        self.keys = list(keys)
        self.token_ids = token_ids
        n_seq, seq_len = token_ids.shape
        self.n_seq, self.seq_len = n_seq, seq_len
        total = n_checkpoints * n_seq * seq_len
        self.keep: dict = {}
        for key in self.keys:
            if total > max_tokens:
                generator = torch.Generator().manual_seed(seeds[key])
                self.keep[key] = torch.randperm(total, generator=generator)[:max_tokens].sort().values
            else:
                self.keep[key] = torch.arange(total)
        self.rows: dict = {key: None for key in self.keys}
        self.filled = {key: torch.zeros(len(self.keep[key]), dtype=torch.bool) for key in self.keys}

    def add(self, key, checkpoint: int, start: int, activations: torch.Tensor) -> None:
        """Activations (B, T, d) of fit sequences start..start+B−1 at checkpoint index `checkpoint`."""
        batch, seq_len, dim = activations.shape
        keep = self.keep[key]
        first = (checkpoint * self.n_seq + start) * seq_len
        lo = torch.searchsorted(keep, first)
        hi = torch.searchsorted(keep, first + batch * seq_len)
        if self.rows[key] is None:
            self.rows[key] = torch.zeros(len(keep), dim, dtype=torch.float32)
        if hi > lo:
            local = keep[lo:hi] - first
            self.rows[key][lo:hi] = activations.reshape(-1, dim)[local.to(activations.device)].float().cpu()
            self.filled[key][lo:hi] = True

    def finish(self, key) -> FitSample:
        keep = self.keep[key]
        rows = self.rows[key]
        if distributed.active():
            # a rank that owned no fit batch has no rows yet: agree on the width first
            width = torch.tensor([0 if rows is None else rows.shape[1]], dtype=torch.int64)
            distributed.all_reduce_max_(width)
            if rows is None:
                rows = torch.zeros(len(keep), int(width.item()), dtype=torch.float32)
            distributed.all_reduce_sum_(rows)
        per_checkpoint = self.n_seq * self.seq_len
        within = keep % per_checkpoint
        return FitSample(
            activations=rows,
            token_ids=self.token_ids.reshape(-1)[within],
            sequence_index=within // self.seq_len,
            position=within % self.seq_len,
        )


def sample_fit_tokens(
    per_checkpoint: list[torch.Tensor], token_ids: torch.Tensor, max_tokens: int, seed: int
) -> FitSample:
    """Pool (n_seq, T, d) activations over the early checkpoints; keep a seeded sample of rows
    (in-memory reference for `FitSampler`, which keeps exactly the same rows while streaming)."""
    n_seq, seq_len, dim = per_checkpoint[0].shape
    pooled = torch.cat([a.reshape(-1, dim) for a in per_checkpoint])
    ids = token_ids.reshape(-1).repeat(len(per_checkpoint))
    seq_index = torch.arange(n_seq).repeat_interleave(seq_len).repeat(len(per_checkpoint))
    position = torch.arange(seq_len).repeat(n_seq).repeat(len(per_checkpoint))
    if pooled.shape[0] > max_tokens:
        generator = torch.Generator().manual_seed(seed)
        keep = torch.randperm(pooled.shape[0], generator=generator)[:max_tokens].sort().values
        pooled, ids, seq_index, position = pooled[keep], ids[keep], seq_index[keep], position[keep]
    return FitSample(activations=pooled, token_ids=ids, sequence_index=seq_index, position=position)


def concept_cards(
    sample: FitSample, basis: torch.Tensor, fit_tokens: torch.Tensor, decode, n_top: int, context: int = 4
) -> list[dict]:
    """For each proxy direction, the fit tokens that load on it most, with a short context.

    A direction's sign is arbitrary (PCA, QR), so it is oriented to make the largest-magnitude
    score positive; tokens are ranked by that oriented score."""
    if n_top == 0:
        return []
    centred = sample.activations.double() - sample.activations.double().mean(0)
    scores = centred @ basis.double().cpu()
    cards = []
    for direction in range(scores.shape[1]):
        column = scores[:, direction]
        sign = 1.0 if column.max() >= -column.min() else -1.0
        top = torch.topk(sign * column, min(n_top, column.shape[0])).indices
        tokens, contexts = [], []
        for row in top.tolist():
            sequence, position = int(sample.sequence_index[row]), int(sample.position[row])
            tokens.append(decode([int(sample.token_ids[row])]))
            left = fit_tokens[sequence, max(0, position - context) : position].tolist()
            right = fit_tokens[sequence, position + 1 : position + 1 + context].tolist()
            contexts.append(f"{decode(left)}[[{decode([int(sample.token_ids[row])])}]]{decode(right)}")
        cards.append({"direction": direction, "top_tokens": tokens, "contexts": contexts})
    return cards


def _basis_table(bases: list[BasisSet], dim: int, device: torch.device, dtype: torch.dtype):
    """Stack every basis' columns into one (d, C) matrix and an indicator (C, n_bases) that sums
    squared projections back per basis — all energies of a batch in two matrix products."""
    columns, owner, descriptors = [], [], []
    for basis_set in bases:
        entries = [("proxy", -1, basis_set.basis)]
        for kind, stack in basis_set.controls.items():
            entries.extend((kind, j, stack[j]) for j in range(stack.shape[0]))
        for control, draw, matrix in entries:
            owner.extend([len(descriptors)] * matrix.shape[1])
            columns.append(matrix)
            descriptors.append(BasisColumn(basis_set.proxy, basis_set.rank, control, draw))
    stacked = torch.cat([c.to(device=device, dtype=dtype) for c in columns], dim=1)
    indicator = torch.zeros(stacked.shape[1], len(descriptors), dtype=dtype, device=device)
    indicator[torch.arange(stacked.shape[1]), torch.tensor(owner)] = 1.0
    return stacked, indicator, descriptors


# ----------------------------------------------------------------------------------------------
# precision
# ----------------------------------------------------------------------------------------------
FP16_LOSS_SCALE = 2.0**12  # static scale so fp16 backward does not underflow; undone in fp32


def resolve_precision(device: torch.device, precision: str = "auto") -> str:
    """`auto`: bf16 autocast on CUDA where supported, fp32 everywhere else (the CPU path stays
    exact). Explicit bf16/fp16 are honoured on CUDA only; on CPU/MPS they fall back to fp32."""
    if device.type != "cuda":
        return "fp32"
    if precision == "auto":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return precision


def autocast(device: torch.device, precision: str):
    """Autocast context for the model's forward (and hence backward); statistics stay fp32/fp64."""
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        return torch.autocast("cuda", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    return contextlib.nullcontext()


def compute_dtype(device: torch.device) -> torch.dtype:
    """Per-batch products (projections, outer products) run in float32 on every device and are
    added into float64 running sums; per-batch centring keeps every statistic within ~1e-7
    relative of a float64 computation (tests/collect/test_collect_precision.py checks 1e-6)."""
    return torch.float32


#: column block of `add_gram_` on CPU: 64-wide blocks did the least work at d = 256–1024
#: (single-threaded CPU time of one batch's Gram, 1016 tokens × 768: 8.5 ms vs 14.4 ms for the
#: full product; benchmarks/README.md, "Collector at real model size")
GRAM_BLOCK = 64


def _add_second_moment_(out: torch.Tensor, rows: torch.Tensor, row_sum: torch.Tensor, *, upper_only: bool) -> None:
    """``out[0] += Σ x xᵀ`` over ``rows`` (N, d) with ``row_sum`` = Σx (float64): the product about
    the rows' own mean ``s`` in the rows' dtype, ``Σ(x − s)(x − s)ᵀ``, plus ``s(Σx − Ns)ᵀ + (Σx)sᵀ``
    in float64 (one rank-2 update), so a large mean never costs float32 digits."""
    shift = (row_sum / rows.shape[0]).to(rows.dtype)
    add_gram_(out, (rows - shift).unsqueeze(0), upper_only=upper_only)
    shift = shift.double()
    out[0].addmm_(torch.stack([shift, row_sum], dim=1), torch.stack([row_sum - rows.shape[0] * shift, shift]))


def add_gram_(out: torch.Tensor, rows: torch.Tensor, *, upper_only: bool) -> None:
    """``out += rowsᵀ rows`` for stacked clouds: ``out`` (c, d, d) float64, ``rows`` (c, N, d).

    Each product is taken in ``rows``' dtype and added in float64. ``upper_only``: only the
    upper triangle of ``out`` is updated (entries i ≤ j; the lower triangle is left stale and
    must be mirrored before use), block row by block row — ``X[:, a:a+b]ᵀ X[:, a:]`` — which
    skips the ~half of the multiply-adds that a full product spends on the mirror image. BLAS
    has no symmetric rank-k update for torch tensors; on CPU this is the cheaper path, on an
    accelerator one batched product is."""
    if not upper_only:
        out += torch.bmm(rows.transpose(1, 2), rows)
        return
    dim = rows.shape[2]
    for cloud in range(rows.shape[0]):
        x = rows[cloud]
        for start in range(0, dim, GRAM_BLOCK):
            stop = min(dim, start + GRAM_BLOCK)
            out[cloud, start:stop, start:] += x[:, start:stop].T @ x[:, start:]


# ----------------------------------------------------------------------------------------------
# per-site accumulation of sufficient statistics
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TypePlan:
    """Which token types get per-type activation statistics in a post-hoc pass, decided before
    it from the test split's own token ids (so every rank and every rerun keeps the same ones).

    ``occurrences`` (V,): how often each type occurs at the positions that enter the per-type
    statistics. Only types occurring at least twice are ever used (a centroid's spread needs two
    rows; the frequency analysis takes types with n ≥ 2), and of those the most frequent (ties:
    lower id first) that fit ``budget_bytes`` at ``(d + 3)·8`` bytes per type and site — so the
    tables' memory is bounded whatever the number of tokens. ``kept``: the kept type ids, sorted."""

    occurrences: torch.Tensor
    kept: torch.Tensor
    n_eligible: int

    @classmethod
    def from_tokens(
        cls, token_ids: torch.Tensor, mask: torch.Tensor | None, vocab_size: int, dim: int, budget_bytes: float
    ) -> TypePlan:
        ids = token_ids.reshape(-1) if mask is None else token_ids.reshape(-1)[mask.reshape(-1)]
        occurrences = torch.bincount(ids.long().cpu(), minlength=vocab_size)[:vocab_size]
        eligible = torch.nonzero(occurrences >= 2).flatten()
        capacity = min(eligible.shape[0], max(budget_bytes, 0) // ((dim + 3) * 8))  # budget may be inf
        if eligible.shape[0] > capacity:
            # most frequent first; a stable sort of the ascending ids keeps ties in id order
            order = torch.sort(occurrences[eligible], descending=True, stable=True).indices
            kept = eligible[order[: int(capacity)]].sort().values
        else:
            kept = eligible
        return cls(occurrences=occurrences, kept=kept, n_eligible=int(eligible.shape[0]))

    @property
    def note(self) -> str:
        """What the frequency analysis must say ('' when every usable type is kept)."""
        if self.kept.shape[0] >= self.n_eligible:
            return ""
        if self.kept.shape[0] == 0:
            return (
                f"no per-type statistics kept for the {self.n_eligible:,} types occurring at least twice "
                "(data.type_statistics_memory_mb is below one type's size)"
            )
        return (
            f"per-type statistics kept for the {self.kept.shape[0]:,} most frequent of the {self.n_eligible:,} "
            "types occurring at least twice (data.type_statistics_memory_mb)"
        )


class _TypeTable:
    """Per-token-type activation sums (count, Σa, Σ‖a‖², float64).

    Post hoc (``plan`` given): rows for exactly the planned types, allocated once; other types'
    rows are skipped. In training (``plan=None``, the batches are not known in advance): rows
    are given to types as they first occur (a vocabulary-sized index maps id → row), and the
    tables grow by doubling, so memory follows the number of distinct types seen — never more
    than a dense vocabulary table. The result is read back per vocabulary id, so row order
    never shows."""

    def __init__(self, vocab_size: int, dim: int, device: torch.device, plan: TypePlan | None = None):
        self.vocab_size, self.dim, self.device = vocab_size, dim, device
        self.row_of = torch.full((vocab_size,), -1, dtype=torch.int64, device=device)
        self.plan = plan
        self.n_rows = 0
        # Σa and the number of rows over every occurrence added: the global mean the type
        # distances refer to pools all tokens, not only the types with a row
        self.all_sum = torch.zeros(dim, dtype=torch.float64, device=device)
        self.all_count = torch.zeros((), dtype=torch.float64, device=device)
        if plan is None:
            self._allocate(0)
            return
        kept = plan.kept.to(device)
        self._allocate(int(kept.shape[0]))
        self.row_of[kept] = torch.arange(kept.shape[0], device=device)
        self.type_id[:] = kept
        self.n_rows = int(kept.shape[0])

    @property
    def global_mean(self) -> torch.Tensor:
        """Mean activation over every occurrence added (kept type or not): μ of `geometry`."""
        return self.all_sum / max(float(self.all_count), 1.0)

    def _allocate(self, capacity: int) -> None:
        f64: dict[str, Any] = dict(dtype=torch.float64, device=self.device)
        self.type_id = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        self.count, self.sq = torch.zeros(capacity, **f64), torch.zeros(capacity, **f64)
        self.sum = torch.zeros(capacity, self.dim, **f64)

    def _grow(self, needed: int) -> None:
        old = (self.type_id, self.count, self.sq, self.sum)
        self._allocate(max(needed, 2 * old[0].shape[0], 256))
        for new, part in zip((self.type_id, self.count, self.sq, self.sum), old):
            new[: self.n_rows] = part[: self.n_rows]

    def add(
        self, ids: torch.Tensor, act64: torch.Tensor, act_sq: torch.Tensor, act_sum: torch.Tensor | None = None
    ) -> None:
        """Add rows (float64) of the given vocabulary ids. `index_put_(accumulate=True)` rather
        than `index_add_`: same sums, in index order, ~30× faster for float64 rows on CPU."""
        self.all_sum += act64.sum(0) if act_sum is None else act_sum  # the caller's Σa when it has it
        self.all_count += act64.shape[0]
        rows = self.row_of[ids]
        if self.plan is not None:  # fixed rows: drop the types not planned
            planned = rows >= 0
            rows, act64, act_sq = rows[planned], act64[planned], act_sq[planned]
            self._scatter(rows, act64, act_sq)
            return
        unseen = rows < 0
        if bool(unseen.any()):
            new = torch.unique(ids[unseen])
            if self.n_rows + new.shape[0] > self.type_id.shape[0]:
                self._grow(self.n_rows + new.shape[0])
            self.row_of[new] = torch.arange(self.n_rows, self.n_rows + new.shape[0], device=self.device)
            self.type_id[self.n_rows : self.n_rows + new.shape[0]] = new
            self.n_rows += new.shape[0]
            rows = self.row_of[ids]
        self._scatter(rows, act64, act_sq)

    def _scatter(self, rows: torch.Tensor, act64: torch.Tensor, act_sq: torch.Tensor) -> None:
        self.count.index_put_((rows,), torch.ones_like(act_sq), accumulate=True)
        self.sum.index_put_((rows,), act64, accumulate=True)
        self.sq.index_put_((rows,), act_sq, accumulate=True)

    def dense(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(count, Σa, Σ‖a‖²) as vocabulary-sized tables."""
        f64: dict[str, Any] = dict(dtype=torch.float64, device=self.device)
        ids = self.type_id[: self.n_rows]
        count = torch.zeros(self.vocab_size, **f64).index_copy_(0, ids, self.count[: self.n_rows])
        sq = torch.zeros(self.vocab_size, **f64).index_copy_(0, ids, self.sq[: self.n_rows])
        total = torch.zeros(self.vocab_size, self.dim, **f64).index_copy_(0, ids, self.sum[: self.n_rows])
        return count, total, sq

    def all_reduce(self) -> None:
        """Planned: every rank holds the same rows, sum them. Otherwise ranks saw different types
        in a different order: sum dense tables, then keep the types any rank saw."""
        distributed.all_reduce_sum_(self.all_sum)
        distributed.all_reduce_sum_(self.all_count)
        if self.plan is not None:
            for tensor in (self.count, self.sum, self.sq):
                distributed.all_reduce_sum_(tensor)
            return
        count, total, sq = self.dense()
        for tensor in (count, total, sq):
            distributed.all_reduce_sum_(tensor)
        seen = torch.nonzero(count > 0).flatten()
        self.row_of.fill_(-1)
        self.n_rows = 0
        self._allocate(int(seen.shape[0]))
        self.row_of[seen] = torch.arange(seen.shape[0], device=self.device)
        self.type_id[:] = seen
        self.count[:], self.sq[:], self.sum[:] = count[seen], sq[seen], total[seen]
        self.n_rows = int(seen.shape[0])

    def geometry(self) -> tuple[torch.Tensor, TypeMeanGeometry]:
        """Per vocabulary id: occurrences, and `geometry.type_mean_geometry` of the types with
        rows — planned, or seen in training — (RMS spread, centroid distance from the global
        mean, centroid norm; NaN elsewhere)."""
        ids = self.type_id[: self.n_rows].cpu().numpy()
        seen = type_mean_geometry(
            self.count[: self.n_rows].cpu().numpy(),
            self.sum[: self.n_rows].cpu().numpy(),
            self.sq[: self.n_rows].cpu().numpy(),
            global_mean=self.global_mean.cpu().numpy(),
        )
        dense = {}
        for name in ("rms_spread", "mean_distance", "mean_norm"):
            values = np.full(self.vocab_size, np.nan)
            values[ids] = getattr(seen, name)
            dense[name] = values
        if self.plan is not None:  # every type's occurrences, kept or not
            count = self.plan.occurrences.to(device=self.device, dtype=torch.float64)
        else:
            count = torch.zeros(self.vocab_size, dtype=torch.float64, device=self.device).index_copy_(
                0, self.type_id[: self.n_rows], self.count[: self.n_rows]
            )
        return count, TypeMeanGeometry(**dense, global_mean=seen.global_mean)


def _add_bucket_moments_(
    out: torch.Tensor, grads: torch.Tensor, bucket: torch.Tensor, evaluated: torch.Tensor, *, upper_only: bool
) -> None:
    """Add each frequency bucket's Σ g gᵀ over its evaluated rows into ``out[b]`` (``out``:
    (n_buckets, d, d)), about the rows' own mean (`_add_second_moment_`)."""
    n_buckets, n_rows = out.shape[0], grads.shape[0]
    for b in range(n_buckets):
        rows_b = ((bucket == b) & evaluated).nonzero().squeeze(1) if n_buckets > 1 else evaluated.nonzero().squeeze(1)
        if rows_b.numel():
            grads_b = grads if rows_b.numel() == n_rows else grads.index_select(0, rows_b)
            _add_second_moment_(out[b : b + 1], grads_b, grads_b.sum(0, dtype=torch.float64), upper_only=upper_only)


class _PairTable:
    """Activation sums per (sequence, token type) pair — count, Σ‖a‖², Σa (`geometry.SequenceTypeSums`)
    — within a memory budget of `budget_bytes`: (d + 4)·8 bytes per pair, at most one pair per
    token; past the budget they are dropped and `note` says why. A budget of 0 keeps none."""

    def __init__(self, dim: int, device: torch.device, budget_bytes: int):
        self.dim, self.device, self.budget_bytes = dim, device, int(budget_bytes)
        self._chunks: list[tuple[torch.Tensor, ...]] = []
        self._bytes = 0  # what the pairs take (counted on past the budget, for the note)
        self._dropped = False

    def add(
        self,
        first_row: int,
        flat_ids: torch.Tensor,
        flat_act: torch.Tensor,
        act_sq: torch.Tensor,
        batch: int,
        rows: torch.Tensor,
    ) -> None:
        """Sums per (sequence, token type) pair of this batch (`rows`: each token's sequence row).
        A batch holds whole sequences, so its pairs never meet another batch's: they are kept as
        they come, in host memory (they are only read by the analysis, and on an accelerator
        they would take the memory the model needs)."""
        if self.budget_bytes <= 0:
            return
        pairs, inverse = torch.unique(flat_ids.long() * (first_row + batch) + rows, return_inverse=True)
        n_pairs = int(pairs.shape[0])
        self._bytes += n_pairs * (self.dim + 4) * 8
        if self._bytes > self.budget_bytes:
            self._chunks, self._dropped = [], True
        if self._dropped:
            return
        f64: dict[str, Any] = dict(dtype=torch.float64, device=self.device)
        self._chunks.append(
            tuple(
                part.cpu()
                for part in (
                    pairs % (first_row + batch),
                    pairs // (first_row + batch),
                    torch.zeros(n_pairs, **f64).index_put_(
                        (inverse,), torch.ones_like(act_sq, dtype=torch.float64), accumulate=True
                    ),  # = index_add_, much faster on CPU
                    torch.zeros(n_pairs, **f64).index_put_((inverse,), act_sq.double(), accumulate=True),
                    torch.zeros(n_pairs, self.dim, **f64).index_put_((inverse,), flat_act.double(), accumulate=True),
                )
            )
        )

    @property
    def note(self) -> str:
        """Why no per-(sequence, type) sums are kept ('' when they are)."""
        if self.budget_bytes <= 0:
            return "per-(sequence, type) sums not kept (data.frequency_ci_memory_mb is 0)"
        if self._dropped:
            return (
                f"no bootstrap CI: the per-(sequence, type) activation sums of this site need "
                f"{self._bytes / 2**20:.4g} MiB, over its {self.budget_bytes / 2**20:.4g} MiB share of "
                "data.frequency_ci_memory_mb"
            )
        return ""

    def take(self, n_sequences: int) -> SequenceTypeSums:
        """The kept sums, sorted by (type, sequence) so the artifact does not depend on batch or
        rank order. Hands the table over: it lets go of its chunks as each column is joined."""
        chunks: list[list[Any]] = [list(chunk) for chunk in self._chunks] or [self._empty()]
        self._chunks = []
        columns = []
        for k in range(len(chunks[0])):
            columns.append(torch.cat([chunk[k] for chunk in chunks]))
            for chunk in chunks:
                chunk[k] = None
        order = torch.from_numpy(np.lexsort((columns[0].numpy(), columns[1].numpy())))
        sequence, token_type, count, square, vector = (column.index_select(0, order).numpy() for column in columns)
        return SequenceTypeSums(
            sequence=sequence,
            token_type=token_type,
            count=count,
            square_sum=square,
            vector_sum=vector,
            n_sequences=n_sequences,
        )

    def all_reduce(self) -> None:
        """Ranks hold disjoint sequences: the budget applies to their pairs together, and the kept
        pairs are concatenated (then sorted by `take`, so rank order does not matter)."""
        if self.budget_bytes <= 0:
            return
        pair_bytes = torch.tensor([self._bytes], dtype=torch.int64)
        distributed.all_reduce_sum_(pair_bytes)
        self._bytes = int(pair_bytes.item())
        if self._bytes > self.budget_bytes:
            self._chunks, self._dropped = [], True
        else:
            parts = [torch.cat(columns) for columns in zip(*self._chunks)] if self._chunks else self._empty()
            self._chunks = [tuple(distributed.all_gather_rows(part) for part in parts)]

    def _empty(self) -> list[torch.Tensor]:
        return [
            torch.zeros(0, dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
            torch.zeros(0, dtype=torch.float64),
            torch.zeros(0, dtype=torch.float64),
            torch.zeros(0, self.dim, dtype=torch.float64),
        ]


class _SequenceEnergies:
    """Per sequence s and frequency bucket b: ``total[s, b]`` = Σ‖g_i‖², ``energy[s, b, B]`` =
    Σ‖Bᵀg_i‖² for every basis B (the proxy and each projected control), and ``n_tokens[s]``, the
    evaluated tokens (float64 sums; counts int64).

    With `n_seq` given the rows are preallocated (post hoc: row s is test sequence s, so sharded
    ranks fill disjoint rows); with `n_seq=None` each batch's rows are appended as it comes
    (inside training) and joined by `settle`."""

    def __init__(self, n_seq: int | None, n_buckets: int, n_bases: int, device: torch.device):
        self.growing = n_seq is None
        rows = 0 if n_seq is None else n_seq
        f64: dict[str, Any] = dict(dtype=torch.float64, device=device)
        self.total = torch.zeros(rows, n_buckets, **f64)
        self.energy = torch.zeros(rows, n_buckets, n_bases, **f64)
        self.n_tokens = torch.zeros(rows, dtype=torch.int64, device=device)
        self._chunks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @property
    def n_sequences(self) -> int:
        return int(self.total.shape[0]) + sum(int(c[0].shape[0]) for c in self._chunks)

    def add(
        self,
        start: int | None,
        squared: torch.Tensor,
        grad_sq: torch.Tensor,
        onehot: torch.Tensor,
        evaluated: torch.Tensor,
        shape: tuple[int, int],
    ) -> int | None:
        """One batch of `shape` (B, T): per row ‖Bᵀg_i‖² (N, n_bases) and ‖g_i‖² (N,), the bucket
        one-hot (N, K) and which rows are evaluated; `start`: its first sequence (post hoc, where
        it is required). Returns the batch's first row."""
        batch, length = shape
        energy = torch.einsum(
            "btn,btk->bkn", squared.reshape(batch, length, -1), onehot.reshape(batch, length, -1)
        ).double()
        total = torch.einsum("bt,btk->bk", grad_sq.reshape(batch, length), onehot.reshape(batch, length, -1)).double()
        count = evaluated.reshape(batch, length).sum(dim=1)
        first_row = self.n_sequences if self.growing else start
        if self.growing:
            self._chunks.append((total, energy, count))
        else:
            stop = start + batch
            self.energy[start:stop] += energy
            self.total[start:stop] += total
            self.n_tokens[start:stop] += count
        return first_row

    def settle(self) -> None:
        """Join the appended batches into `total`, `energy` and `n_tokens`."""
        if self._chunks:
            self.total = torch.cat([self.total] + [c[0] for c in self._chunks])
            self.energy = torch.cat([self.energy] + [c[1] for c in self._chunks])
            self.n_tokens = torch.cat([self.n_tokens] + [c[2] for c in self._chunks])
            self._chunks = []

    def all_reduce(self) -> None:
        """Sum over torchrun ranks (their rows are disjoint)."""
        self.settle()
        for tensor in (self.total, self.energy, self.n_tokens):
            distributed.all_reduce_sum_(tensor)


class _MomentSums:
    """The running moments of one site's two clouds — the evaluated gradient rows (`grad`) and
    every activation row (`act`): count, Σx and Σxxᵀ (`geometry.GradientMoments` views into
    float64 blocks), the gradients' Σggᵀ per frequency bucket (`bucket_outers`; the whole split's
    Σggᵀ is their sum, so it costs no extra product) and the sums of unit vectors Σx/‖x‖
    (`grad_unit`, `act_unit`).

    Each batch's Σxxᵀ is taken about the batch's own mean (`_add_second_moment_`), so a large
    mean never costs float32 digits. On CPU only the upper triangles are accumulated
    (`add_gram_`); `complete` mirrors them (and sums the buckets into the gradients' Σggᵀ) before
    anything reads the moments."""

    def __init__(self, dim: int, n_buckets: int, device: torch.device):
        f64: dict[str, Any] = dict(dtype=torch.float64, device=device)
        # both clouds' running sums in one (2, ...) block, so a batch updates them with one
        # batched operation each; `grad` and `act` are views into it
        self.sums = torch.zeros(2, dim, **f64)
        self.outers = torch.zeros(2, dim, dim, **f64)
        self.bucket_outers = torch.zeros(n_buckets, dim, dim, **f64)
        self._complete = True  # no triangle added since the last mirroring
        self.upper_only = device.type == "cpu"
        self.grad = GradientMoments(count=0, sum=self.sums[0], outer=self.outers[0])
        self.act = GradientMoments(count=0, sum=self.sums[1], outer=self.outers[1])
        self.grad_unit = torch.zeros(dim, **f64)
        self.act_unit = torch.zeros(dim, **f64)

    def add(
        self,
        flat_grad: torch.Tensor,
        flat_act: torch.Tensor,
        act64: torch.Tensor,
        act_sq: torch.Tensor,
        grad_norm: torch.Tensor,
        bucket: torch.Tensor,
        evaluated: torch.Tensor,
        n_evaluated: int,
        sums: torch.Tensor,
    ) -> None:
        """One batch's rows (N, d): gradients and activations in the compute dtype, activations in
        float64 with their squared norms, the gradients' norms, each row's frequency bucket,
        which rows are evaluated (and how many), and `sums` = (Σg, Σa) (2, d) float64."""
        self._complete = False
        _add_second_moment_(self.outers[1:], flat_act, sums[1], upper_only=self.upper_only)
        _add_bucket_moments_(self.bucket_outers, flat_grad, bucket, evaluated, upper_only=self.upper_only)
        self.sums += sums
        self.grad.count += n_evaluated
        self.act.count += flat_act.shape[0]
        inverse_norm = torch.where(evaluated, 1.0 / grad_norm.clamp(min=1e-30), torch.zeros_like(grad_norm))
        self.grad_unit += inverse_norm @ flat_grad  # Σ g_i/‖g_i‖ over evaluated rows
        act_norm = act_sq.sqrt()
        act_scale = torch.where(act_norm > 0, 1.0 / act_norm.clamp(min=1e-300), torch.zeros_like(act_norm))
        self.act_unit += act_scale @ act64  # Σ a_i/‖a_i‖ (zero rows add nothing)

    def complete(self) -> None:
        """Mirror the accumulated upper triangles of every Σxxᵀ into the lower ones, and set the
        gradients' Σggᵀ to the sum of the buckets' (idempotent; nothing to do until more is added)."""
        if self._complete:
            return
        self._complete = True
        if self.upper_only:
            for stack in (self.outers, self.bucket_outers):
                upper = torch.triu(stack)
                stack.copy_(upper + torch.triu(upper, diagonal=1).transpose(1, 2))
        torch.sum(self.bucket_outers, dim=0, out=self.outers[0])

    def all_reduce(self) -> None:
        """Sum the moments over torchrun ranks (completed first, so every rank adds whole matrices)."""
        self.complete()
        for tensor in (self.sums, self.outers, self.bucket_outers, self.grad_unit, self.act_unit):
            distributed.all_reduce_sum_(tensor)
        counts = torch.tensor([self.grad.count, self.act.count], dtype=torch.int64, device=self.sums.device)
        distributed.all_reduce_sum_(counts)
        self.grad.count, self.act.count = int(counts[0]), int(counts[1])


class SiteAccumulator:
    """Per-sequence sufficient statistics of one site, streamed batch by batch.

    A batch is checked (finite), projected on every basis, and handed to four parts: the
    per-sequence energies (`sequences`, a `_SequenceEnergies`), the moments (`moments`, a
    `_MomentSums`; `grad`, `act` and `bucket_outers` read them complete), the per-type sums
    (`types`, a `_TypeTable`) and the per-(sequence, type) sums (`pairs`, a `_PairTable`);
    `finish` turns them into the unit's artifact.

    With `n_seq` given, rows are preallocated (post-hoc collection: row s is test sequence s, so
    sharded ranks fill disjoint rows); with `n_seq=None` rows are appended as batches arrive
    (measurement inside training, where sequences are the training batches).

    `dtype` is the per-batch compute precision (projections, outer products); every running sum
    is float64. Default float32 on every device: the second moments are accumulated about each
    batch's own mean (Σ aaᵀ = Σ(a − s)(a − s)ᵀ + s(Σa − Ns)ᵀ + (Σa)sᵀ, the small correction in
    float64), so a large mean never costs float32 digits; sums of vectors, type sums and the
    squared norms behind them are float64. Everything stays on `device`.

    Token-type sums (count, Σa, Σ‖a‖² per type) are kept only for some types (`_TypeTable`),
    not for the whole vocabulary (at a 50k vocabulary a dense table costs 300 MB per site):
    post hoc, the types of `type_plan` (those occurring at least twice, the most frequent first
    within a memory budget, decided from the test split before the pass), so memory does not
    grow with the number of tokens; in training (`type_plan=None`), every type seen.

    `pair_budget_bytes` > 0 also keeps activation sums per (sequence, token type) pair
    (`_PairTable`), which the analysis needs to bootstrap the log-frequency vs centroid-distance
    correlation over sequences; without them the correlation is reported without a CI."""

    def __init__(
        self,
        bases: list[BasisSet],
        *,
        dim: int,
        n_seq: int | None,
        n_buckets: int,
        vocab_size: int,
        device: torch.device,
        dtype: torch.dtype | None = None,
        pair_budget_bytes: int = 0,
        type_plan: TypePlan | None = None,
    ):
        self.dim, self.n_buckets, self.vocab_size, self.device = dim, n_buckets, vocab_size, device
        self.dtype = dtype or compute_dtype(device)
        self.bases = bases
        self.stacked, self.indicator, self.descriptors = _basis_table(bases, dim, device, self.dtype)
        self.growing = n_seq is None
        self.sequences = _SequenceEnergies(n_seq, n_buckets, len(self.descriptors), device)
        # the gradients' per-bucket Σggᵀ is what a bucket's exact test reads (its spectrum)
        self.moments = _MomentSums(dim, n_buckets, device)
        self.types = _TypeTable(vocab_size, dim, device, type_plan)
        self.pairs = _PairTable(dim, device, pair_budget_bytes)
        self.failure = ""

    def add(
        self,
        grad: torch.Tensor,
        act: torch.Tensor,
        token_ids: torch.Tensor,
        bucket_onehot: torch.Tensor,
        start: int | None = None,
        where: str = "",
        type_mask: torch.Tensor | None = None,
    ) -> None:
        """One batch: gradients and activations (B, T, d), token ids (B, T), bucket one-hot (B, T, K).

        `type_mask` (B, T) bool: the positions that enter the per-type statistics (type centroids
        and the per-(sequence, type) sums); None = all. MLM leaves out positions whose input is
        not the text's own token ([MASK] or a random replacement): their activation represents
        the corrupted input, not the type."""
        if self.failure:
            return
        dim = self.dim
        flat_grad = grad.reshape(-1, dim).to(self.dtype)  # one contiguous copy (the inputs are slices)
        flat_input = act.reshape(-1, dim)
        # the one float64 copy (of the input, so float64 inputs lose nothing): type sums, pairs,
        # Σa and ‖a‖² are float64 — the per-type scatter Σ‖a‖² − ‖Σa‖²/n cancels digits
        act64 = flat_input.double()
        flat_act = flat_input.to(self.dtype)
        n_rows = flat_grad.shape[0]
        grad_norm = torch.linalg.vector_norm(flat_grad, dim=1)  # ‖g_i‖, no (N, d) temporary
        act_sq = torch.linalg.vector_norm(act64, dim=1).square()  # ‖a_i‖² (float64)
        grad_sq = grad_norm.square()
        # Gradient rows that are exactly zero carry no loss signal by construction (e.g.
        # unmasked positions after an encoder's last block): they are not evaluated tokens.
        evaluated = grad_sq > 0
        # one host sync per batch: a NaN/Inf anywhere in a row makes its norm NaN/Inf
        finite_grad, finite_act, n_eval = torch.stack(
            [torch.isfinite(grad_sq).all().long(), torch.isfinite(act_sq).all().long(), evaluated.sum()]
        ).tolist()
        if not (finite_grad and finite_act):
            self.failure = f"non-finite gradients or activations in {where}"
            return
        onehot = bucket_onehot.reshape(n_rows, -1).to(self.dtype)
        squared = (flat_grad @ self.stacked).square() @ self.indicator  # (N, n_bases) ‖Qᵀg_i‖²
        batch, length = grad.shape[0], grad.shape[1]
        first_row = self.sequences.add(start, squared, grad_sq, onehot, evaluated, (batch, length))
        # moments: Σx in float64; Σxxᵀ of the activations and, per frequency bucket, of the
        # evaluated gradient rows, each about its own batch mean (`_add_second_moment_`)
        sums = torch.stack([flat_grad.sum(0, dtype=torch.float64), act64.sum(0)])  # (2, d) Σg, Σa
        self.moments.add(flat_grad, flat_act, act64, act_sq, grad_norm, onehot.argmax(dim=1), evaluated, n_eval, sums)
        flat_ids = token_ids.reshape(-1).to(self.device)
        rows = torch.arange(first_row, first_row + batch, device=self.device).repeat_interleave(length)
        type_act, type_sq, type_sum = act64, act_sq, sums[1]
        if type_mask is not None:
            typed = type_mask.reshape(-1).to(self.device)
            flat_ids, type_act, type_sq, rows = flat_ids[typed], act64[typed], act_sq[typed], rows[typed]
            type_sum = None
        self.types.add(flat_ids, type_act, type_sq, type_sum)
        self.pairs.add(first_row, flat_ids, type_act, type_sq, batch, rows)

    @property
    def pair_note(self) -> str:
        """Why no per-(sequence, type) sums are kept ('' when they are)."""
        return self.pairs.note

    def pair_sums(self) -> SequenceTypeSums | None:
        """The kept per-(sequence, type) sums (`_PairTable.take`); None when not kept."""
        if self.pairs.note:
            return None
        self.sequences.settle()
        return self.pairs.take(int(self.sequences.total.shape[0]))

    @property
    def n_sequences(self) -> int:
        return self.sequences.n_sequences

    def all_reduce(self) -> None:
        """Sum every statistic over torchrun ranks (rows are disjoint per rank)."""
        if not distributed.active():
            return
        failed = torch.tensor([1 if self.failure else 0], dtype=torch.int64, device=self.device)
        distributed.all_reduce_max_(failed)
        if failed.item() and not self.failure:
            self.failure = "non-finite gradients or activations on another rank"
        self.sequences.all_reduce()
        self.moments.all_reduce()
        self.types.all_reduce()
        self.pairs.all_reduce()

    @property
    def grad(self) -> GradientMoments:
        """The gradient moments so far (evaluated rows), complete at any point of the stream."""
        self.moments.complete()
        return self.moments.grad

    @property
    def act(self) -> GradientMoments:
        """The activation moments so far, complete at any point of the stream."""
        self.moments.complete()
        return self.moments.act

    @property
    def bucket_outers(self) -> torch.Tensor:
        """``(n_buckets, d, d)``: the gradients' second moment per frequency bucket."""
        self.moments.complete()
        return self.moments.bucket_outers

    def finish(
        self,
        key: UnitKey,
        *,
        sequence_documents: np.ndarray,
        seconds: float,
        isoscore_c0: str,
        isoscore_zeta: float,
        extra: dict | None = None,
    ) -> UnitArtifact:
        """The unit's artifact (single-threaded on CPU, `_single_threaded`); a failed artifact
        when a batch was not finite (`failure`)."""
        with _single_threaded(self.device):
            return self._finish(key, sequence_documents, seconds, isoscore_c0, isoscore_zeta, extra)

    def _finish(
        self,
        key: UnitKey,
        sequence_documents: np.ndarray,
        seconds: float,
        isoscore_c0: str,
        isoscore_zeta: float,
        extra: dict | None,
    ) -> UnitArtifact:
        self.sequences.settle()
        self.moments.complete()
        dim, descriptors = self.dim, self.descriptors
        extra = dict(extra or {})
        plan = self.types.plan
        if plan is not None and plan.note:
            extra["type_statistics_note"] = plan.note
        kwargs = dict(
            key=key,
            dim=dim,
            bases=descriptors,
            n_tokens=self.sequences.n_tokens.cpu().numpy(),
            sequence_documents=np.asarray(sequence_documents, dtype=np.int64),
            seconds=seconds,
            extra=extra,
        )
        if self.failure:
            return _failed_artifact(
                f"{self.failure} at {key.site}",
                int(self.sequences.total.shape[0]),
                self.n_buckets,
                len(descriptors),
                self.vocab_size,
                **kwargs,
            )
        moments = self.moments.grad
        delta = _delta_isoscore_star(self.bases, descriptors, moments, dim, self.device, isoscore_c0, isoscore_zeta)
        # per type: Bessel-corrected RMS spread around its centroid (unbiased for the type's
        # variance whatever its count, see geometry.ResampledCentroidDistance), and the debiased
        # distance of its centroid from the global mean and norm (geometry.type_mean_geometry),
        # computed on the types with rows (planned, or seen in training) and spread back to
        # vocabulary-sized arrays
        count, types = self.types.geometry()
        return UnitArtifact(
            **kwargs,
            total_energy=_to_numpy(self.sequences.total),
            energy=_to_numpy(self.sequences.energy),
            delta_isoscore_star=delta,
            # per-bucket moments in float32, as stored: a fresh run and a resumed one read the same matrix
            gradient_moments={
                **_moments_dict(moments),
                "bucket_outer": _to_numpy(self.moments.bucket_outers).astype(np.float32),
            },
            activation_moments=_moments_dict(self.moments.act),
            gradient_unit_sum=_to_numpy(self.moments.grad_unit),
            activation_unit_sum=_to_numpy(self.moments.act_unit),
            type_count=_to_numpy(count).astype(np.int64),
            type_rms_distance=types.rms_spread,
            type_mean_distance=types.mean_distance,
            type_mean_norm=types.mean_norm,
            pair_sums=self.pair_sums(),
            pair_note=self.pair_note,
            proxy_bases={(bs.proxy, bs.rank): _to_numpy(bs.basis) for bs in self.bases},
        )


def _delta_isoscore_star(
    bases: list[BasisSet],
    descriptors: list[BasisColumn],
    moments: GradientMoments,
    dim: int,
    device: torch.device,
    isoscore_c0: str,
    isoscore_zeta: float,
) -> np.ndarray:
    """ΔIsoScore* of every projected basis (`descriptors` order) from the unit's gradient
    covariance; NaN where a rank leaves fewer than 2 dimensions in the complement."""
    delta = np.full(len(descriptors), np.nan)
    if bases and dim - max(bs.rank for bs in bases) >= 2:
        covariance = moments.covariance()  # once per unit; ΔIsoScore* is O(d²k) per basis from it
        for basis_set in bases:
            index = [i for i, b in enumerate(descriptors) if b.proxy == basis_set.proxy and b.rank == basis_set.rank]
            stack = torch.cat([basis_set.basis.unsqueeze(0)] + list(basis_set.controls.values())).to(device)
            delta[index] = _to_numpy(delta_isoscore_star(covariance, stack, C0=isoscore_c0, zeta=isoscore_zeta))
    return delta


def measure_checkpoint(
    model: torch.nn.Module,
    *,
    keys: dict,
    bases: dict,
    splits: Splits,
    objective: str,
    token_bucket: torch.Tensor,
    n_buckets: int,
    mlm_probability: float,
    seed: int,
    batch_size: int,
    device: torch.device,
    isoscore_c0: str,
    isoscore_zeta: float,
    precision: str = "fp32",
    progress_label: str = "",
    pair_budget_bytes: int = 0,
    loss_reduction: str = "global_mean",
    type_budget_bytes: float = math.inf,
) -> dict:
    """Phase 2 for one checkpoint: every selected site in one forward/backward per batch.

    `keys` maps any key (a block index, a site name) to the unit's `UnitKey`; the site probed is
    `UnitKey.site` (see `sites.py`). `bases` is keyed alike. Under torchrun, batches are
    sharded across ranks and the statistics all-reduced (see `distributed.py`).
    `pair_budget_bytes` and `type_budget_bytes` (per-type sums, see `TypePlan`) are shared
    equally by the sites (see `SiteAccumulator`). The loss is
    `lm_loss(..., loss_reduction)` with the normaliser of the whole test split (not of a batch)."""
    started = time.perf_counter()
    order = list(keys)
    sites = as_sites(model, {k: keys[k].site for k in order})
    compute = compute_dtype(device)
    precision = resolve_precision(device, precision)
    _frozen_on(model, device)
    inputs, labels = model_inputs(splits.test, splits, objective, mlm_probability, seed, "test")
    n_seq, seq_len = inputs.shape
    targets_per_sequence = float(count_targets(labels, objective).sum()) / n_seq
    used = counted_positions(objective, seq_len)
    acc = _site_accumulators(
        bases, order, splits, inputs, objective, used, n_buckets, device, compute, pair_budget_bytes, type_budget_bytes
    )
    bucket_of_token = token_bucket.to(device).clamp(min=0)  # unseen ids (-1) never occur in text
    scale = FP16_LOSS_SCALE if precision == "fp16" else 1.0
    starts = list(range(0, n_seq, batch_size))
    mine = [start for b, start in enumerate(starts) if distributed.owns(b)]
    progress = bar(len(mine), f"{progress_label} batches".strip(), unit="batch")
    tokens_done, clock = 0, time.perf_counter()
    for start in mine:
        stop = min(n_seq, start + batch_size)
        batch_inputs = inputs[start:stop].to(device)
        batch_labels = labels[start:stop].to(device)
        with torch.enable_grad(), autocast(device, precision), probe(model, sites, gradients=True) as record:
            loss = lm_loss(model, batch_inputs, batch_labels, objective, loss_reduction, targets_per_sequence)
            gradients = torch.autograd.grad(loss * scale if scale != 1.0 else loss, [record.deltas[k] for k in order])
        # frequency buckets and token types follow the text's own token (for MLM the masked
        # input shows <mask>, but the position still belongs to the original token)
        token_ids = splits.test[start:stop, :used].to(device)
        # ...but type centroids use only positions that show their own token (MLM: not [MASK] or a
        # random replacement; see SiteAccumulator.add)
        type_mask = (batch_inputs[:, :used] == token_ids) if objective == "mlm" else None
        onehot = torch.nn.functional.one_hot(bucket_of_token[token_ids], n_buckets)
        for k, gradient in zip(order, gradients):
            grad = gradient[:, :used].to(compute)
            if scale != 1.0:
                grad = grad / scale
            acc[k].add(
                grad,
                record.activations[k][:, :used],
                token_ids,
                onehot,
                start=start,
                where=f"sequences {start}-{stop - 1}",
                type_mask=type_mask,
            )
        tokens_done += (stop - start) * seq_len
        progress.update(1)
        progress.set_postfix_str(f"{tokens_done / max(time.perf_counter() - clock, 1e-9):,.0f} tok/s", refresh=False)
    progress.close()
    return {k: _finish_site(acc[k], keys[k], splits, started, isoscore_c0, isoscore_zeta) for k in order}


def _site_accumulators(
    bases: dict,
    order: list,
    splits: Splits,
    inputs: torch.Tensor,
    objective: str,
    used: int,
    n_buckets: int,
    device: torch.device,
    compute: torch.dtype,
    pair_budget_bytes: int,
    type_budget_bytes: float,
) -> dict:
    """One :class:`SiteAccumulator` per site (in `order`), sharing one token-type plan of the test
    split's first `used` positions; the pair and type memory budgets are split equally."""
    dim = next(iter(bases.values()))[0].basis.shape[0]
    typed_tokens = splits.test[:, :used]
    type_plan = TypePlan.from_tokens(
        typed_tokens,
        (inputs[:, :used] == typed_tokens) if objective == "mlm" else None,
        splits.vocab_size,
        dim,
        type_budget_bytes / len(order),
    )
    return {
        k: SiteAccumulator(
            bases[k],
            dim=dim,
            n_seq=inputs.shape[0],
            n_buckets=n_buckets,
            vocab_size=splits.vocab_size,
            device=device,
            dtype=compute,
            pair_budget_bytes=pair_budget_bytes // len(order),
            type_plan=type_plan,
        )
        for k in order
    }


def _frozen_on(model: torch.nn.Module, device: torch.device) -> None:
    """Move ``model`` to ``device`` in eval mode with its parameters frozen: post hoc, ∂L/∂h
    needs no parameter gradients."""
    model.to(device)
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)


def _finish_site(
    acc: SiteAccumulator, key: UnitKey, splits: Splits, started: float, isoscore_c0: str, isoscore_zeta: float
) -> UnitArtifact:
    """All-reduce one site's statistics over ranks and turn them into its artifact."""
    acc.all_reduce()
    return acc.finish(
        key,
        sequence_documents=splits.test_documents,
        seconds=time.perf_counter() - started,
        isoscore_c0=isoscore_c0,
        isoscore_zeta=isoscore_zeta,
    )


def _failed_artifact(note: str, n_seq: int, n_buckets: int, n_bases: int, vocab: int, **kwargs) -> UnitArtifact:
    dim = kwargs["dim"]
    nan = float("nan")
    empty = {"count": 0, "sum": np.full(dim, nan), "outer": np.full((dim, dim), nan)}
    return UnitArtifact(
        **kwargs,
        total_energy=np.full((n_seq, n_buckets), nan),
        energy=np.full((n_seq, n_buckets, n_bases), nan),
        delta_isoscore_star=np.full(n_bases, nan),
        gradient_moments=empty,
        activation_moments=dict(empty),
        gradient_unit_sum=np.full(dim, nan),
        activation_unit_sum=np.full(dim, nan),
        type_count=np.zeros(vocab, dtype=np.int64),
        type_rms_distance=np.full(vocab, nan),
        status="failed",
        note=note,
    )


@contextlib.contextmanager
def _single_threaded(device: torch.device):
    """The end-of-unit work (ΔIsoScore* traces of each basis, type geometry, pair sorting; no
    eigen-problem since the oracle fraction moved to analysis time) runs single-threaded on
    CPU: it is small (≈ 19 ms per unit at d = 768 on an idle core; 13 ms with 2 threads), and
    small linear algebra with several OpenMP threads thrashed on a busy 2-core VM (41 eigvalsh
    of 124×124: 0.02 s on 1 thread, 0.5–3.5 s on 2, when the finish still had them)."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _moments_dict(moments: GradientMoments) -> dict:
    return {"count": int(moments.count), "sum": _to_numpy(moments.sum), "outer": _to_numpy(moments.outer)}


def _to_numpy(tensor) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        return tensor.detach().to("cpu", torch.float64).numpy()
    return np.asarray(tensor, dtype=np.float64)
