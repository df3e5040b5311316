"""Sites: named places in a model where activations are read and gradients taken.

One naming scheme across architectures: `residual.{l}` is the residual stream *after* block l
(0-based), i.e. the hidden state the next block consumes.

Gradients are taken with an additive probe: the block's output `h` is replaced by `h + δ`
where `δ` is a zero tensor with `requires_grad=True`. The rest of the model consumes exactly
that tensor, so `∂L/∂δ = ∂L/∂h` — the true gradient of the loss w.r.t. the hidden state the
model actually uses (no view that autograd ignores, unlike `retain_grad` on a tuple element),
and it works with parameter gradients switched off entirely.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from ..errors import AnistatInputError

# Attribute paths of the block list in common transformers architectures, most specific first.
BLOCK_PATHS = (
    "transformer.h",  # GPT-2
    "gpt_neox.layers",  # GPT-NeoX / Pythia
    "model.layers",  # Llama, OLMo, SmolLM2, Mistral, Qwen
    "bert.encoder.layer",  # BERT MLM
    "roberta.encoder.layer",
    "model.encoder.layers",
    "encoder.layer",
    "layers",
)


def _get_path(root: torch.nn.Module, path: str):
    current = root
    for part in path.split("."):
        if not hasattr(current, part):
            return None
        current = getattr(current, part)
    return current


def find_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of transformer blocks (its residual-stream layers)."""
    for path in BLOCK_PATHS:
        blocks = _get_path(model, path)
        if isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0:
            return blocks
    # fall back: the longest ModuleList in the model
    candidates = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not candidates:
        raise AnistatInputError(f"cannot find the transformer blocks of {type(model).__name__}")
    return max(candidates, key=len)


def resolve_layers(layers: list[int] | str, num_layers: int, model_name: str) -> list[int]:
    """Protocol layer selection → sorted, unique, non-negative block indices."""
    if layers == "all":
        return list(range(num_layers))
    resolved = []
    for layer in layers:
        index = layer + num_layers if layer < 0 else layer
        if not 0 <= index < num_layers:
            raise AnistatInputError(
                f"sites.layers: layer {layer} does not exist in {model_name} ({num_layers} layers)"
            )
        resolved.append(index)
    return sorted(set(resolved))


def site_name(layer: int) -> str:
    return f"residual.{layer}"


def _hidden_of(output):
    return output[0] if isinstance(output, tuple) else output


def _replace_hidden(output, hidden):
    if isinstance(output, tuple):
        return (hidden,) + tuple(output[1:])
    return hidden


@dataclass
class ProbeRecord:
    """What one forward pass left at the probed sites (keyed by layer index)."""

    activations: dict[int, torch.Tensor]
    deltas: dict[int, torch.Tensor]


@contextlib.contextmanager
def residual_probe(model: torch.nn.Module, layers: list[int], *, gradients: bool) -> Iterator[ProbeRecord]:
    """Hook the residual stream after each selected block for the duration of the context.

    With `gradients=True` each block output `h` is replaced by `h + δ` (δ a zero leaf that
    requires grad), so `torch.autograd.grad(loss, record.deltas.values())` returns ∂L/∂h.
    Activations are always recorded (detached). Hooks are removed on exit, also on error.
    """
    blocks = find_blocks(model)
    record = ProbeRecord(activations={}, deltas={})
    handles = []

    def make_hook(layer: int):
        def hook(module, inputs, output):
            hidden = _hidden_of(output)
            record.activations[layer] = hidden.detach()
            if not gradients:
                return None
            delta = torch.zeros_like(hidden, requires_grad=True)
            record.deltas[layer] = delta
            return _replace_hidden(output, hidden + delta)

        return hook

    try:
        for layer in layers:
            handles.append(blocks[layer].register_forward_hook(make_hook(layer)))
        yield record
    finally:
        for handle in handles:
            handle.remove()
