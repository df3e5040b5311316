"""The model's own training loss, shared by training (`models`) and measurement (`collect`).

It lives below both so that the collection stage does not import the model-loading stage
(see ARCHITECTURE.md, "Layers").
"""

from __future__ import annotations

import torch

LOSS_REDUCTIONS = ("global_mean", "per_sequence_mean")


def count_targets(labels: torch.Tensor, objective: str) -> torch.Tensor:
    """Targets per sequence (B,): CLM predicts positions 1..T−1 (labels are shifted inside the
    loss); MLM predicts the positions whose label is not −100."""
    shifted = labels[:, 1:] if objective == "clm" else labels
    return (shifted != -100).sum(dim=1)


def lm_loss(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    objective: str,
    reduction: str = "global_mean",
    targets_per_sequence: float | None = None,
) -> torch.Tensor:
    """The model's own token cross-entropy, reduced so no sequence's gradient depends on its batch.

    ℓ_{s,t} is the CE of target t of sequence s (CLM: next-token CE over positions 0..T−2, labels
    shifted inside; MLM: CE over masked positions), m_s the number of targets of sequence s.

    * ``global_mean`` (default): ``L = Σ_{s,t} ℓ_{s,t} / m̄`` with ONE normaliser ``m̄`` — the mean
      number of targets per sequence over the whole measured split (``targets_per_sequence``;
      when omitted, this batch's own mean). Every target token then has the same gradient
      weight 1/m̄, exactly as in the training loss (the mean over all targets, which is
      ``L / n_sequences``); the factor n_sequences keeps gradient magnitudes those of one
      sequence's loss (headroom for fp16/bf16) and cancels in every energy fraction. Because
      m̄ is fixed for the split, batch size, sharding and resumption never change the numbers.
    * ``per_sequence_mean``: ``L = Σ_s (1/m_s) Σ_t ℓ_{s,t}`` — each token weighted 1/m_s, so a
      sequence with few masked tokens weighs each of them more (the reduction anistat used
      before; for CLM, where every m_s = T − 1, the two reductions are identical).
    """
    if reduction not in LOSS_REDUCTIONS:
        raise ValueError(f"reduction must be one of {LOSS_REDUCTIONS}, got {reduction!r}")
    logits = model(input_ids=inputs).logits.float()
    if objective == "clm":
        logits = logits[:, :-1]
        labels = labels[:, 1:]
    token_loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).view(labels.shape)
    counted = (labels != -100).sum(dim=1)
    if reduction == "per_sequence_mean":
        return (token_loss.sum(dim=1) / counted.clamp(min=1)).sum()
    if targets_per_sequence is None:
        targets_per_sequence = float(counted.sum()) / counted.shape[0]
    return token_loss.sum() / max(float(targets_per_sequence), 1e-300)
