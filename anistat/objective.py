"""The model's own training loss, shared by training (`models`) and measurement (`collect`).

It lives below both so that the collection stage does not import the model-loading stage
(see ARCHITECTURE.md, "Layers").
"""

from __future__ import annotations

import torch


def lm_loss(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, objective: str) -> torch.Tensor:
    """Sum over sequences of each sequence's mean token cross-entropy.

    CLM: next-token CE over positions 0..T−2 (labels shifted inside); MLM: CE over masked
    positions. Summing per-sequence means (instead of one batch mean) makes a sequence's
    gradient independent of which other sequences share its batch — so batch size, sharding
    across processes and resumption never change the numbers.
    """
    logits = model(input_ids=inputs).logits.float()
    if objective == "clm":
        logits = logits[:, :-1]
        labels = labels[:, 1:]
    token_loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).view(labels.shape)
    counted = (labels != -100).sum(dim=1).clamp(min=1)
    return (token_loss.sum(dim=1) / counted).sum()
