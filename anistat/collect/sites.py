"""Sites: named places in a model where activations are read and true gradients taken.

One naming scheme across architectures (GPT-2, GPT-NeoX/Pythia, Llama/OLMo/SmolLM2, BERT,
ModernBERT, and anything else whose blocks can be found):

=========================  =========================================================================
name                       what it is (the tensor the model actually consumes next)
=========================  =========================================================================
``embed``                  the embedding output: the hidden state block 0 receives (after the
                           embedding LayerNorm / dropout, where the architecture has them)
``attn.{l}``               the attention sub-layer's output in block l, as added to the residual
                           stream (BERT-style post-LN blocks: the attention output projection
                           ``attention.output.dense``, before dropout + residual + LayerNorm)
``mlp.{l}``                the MLP sub-layer's output in block l (BERT-style: ``output.dense``)
``residual.{l}``           the residual stream *after* block l (0-based): what block l+1 (or the
                           final norm / head) consumes — the default site kind
``module:{qualified}``     the output of any module by its qualified name, e.g.
                           ``module:transformer.h.0.mlp.c_proj`` (the protocol also accepts
                           fnmatch patterns such as ``transformer.h.*.mlp.c_proj``)
=========================  =========================================================================

`anistat sites MODEL` lists what exists for a model.

Gradients are taken with an **additive probe**: the site's tensor ``h`` is replaced by
``h + δ`` where ``δ`` is a zero tensor with ``requires_grad=True``. The rest of the model
consumes exactly that tensor, so ``∂L/∂δ = ∂L/∂h`` — the true gradient of the loss w.r.t. the
hidden state the model actually uses (never a view or tuple element that autograd ignores, as
with ``retain_grad`` on a returned hidden state), and it works with every parameter gradient
switched off (post hoc) or alongside the training step's own backward (``δ.grad`` is filled by
the same ``loss.backward()``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import AnistatInputError

SITE_KINDS = ("residual", "embed", "attn", "mlp", "module")

# Attribute paths of the block list in common transformers architectures, most specific first.
BLOCK_PATHS = (
    "transformer.h",  # GPT-2, GPT-J, Falcon-style
    "gpt_neox.layers",  # GPT-NeoX / Pythia
    "model.layers",  # Llama, OLMo, SmolLM2, Mistral, Qwen, ModernBERT
    "model.decoder.layers",  # OPT
    "bert.encoder.layer",  # BERT MLM
    "roberta.encoder.layer",
    "electra.encoder.layer",
    "model.encoder.layers",
    "encoder.layer",  # BertModel (e.g. all-MiniLM-L6-v2 without a head)
    "layers",
    "h",
)
ATTN_CHILDREN = ("attn", "self_attn", "attention", "self_attention", "mixer")
MLP_CHILDREN = ("mlp", "feed_forward", "ffn", "block_sparse_moe")


@dataclass(frozen=True)
class Site:
    """A resolved site: its public name, kind, block index (−1 outside the blocks), the
    qualified name of the hooked module, and whether its output or its input is probed."""

    name: str
    kind: str
    layer: int
    module: str
    hook: str = "output"  # "output" (forward hook) | "input" (forward pre-hook, first argument)
    description: str = ""


def _get_path(root: torch.nn.Module, path: str):
    current = root
    for part in path.split("."):
        if not hasattr(current, part):
            return None
        current = getattr(current, part)
    return current


def find_blocks_path(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """(qualified name, ModuleList) of the model's transformer blocks."""
    for path in BLOCK_PATHS:
        blocks = _get_path(model, path)
        if isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0:
            return path, blocks
    # fall back: the longest ModuleList of identical modules
    candidates = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) > 0 and len({type(b) for b in m}) == 1
    ]
    if not candidates:
        raise AnistatInputError(
            f"cannot find the transformer blocks of {type(model).__name__}; use 'module:NAME' sites"
        )
    return max(candidates, key=lambda item: len(item[1]))


def find_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of transformer blocks (its residual-stream layers)."""
    return find_blocks_path(model)[1]


def num_blocks(model: torch.nn.Module) -> int:
    return len(find_blocks(model))


def resolve_layers(layers: list[int] | str, num_layers: int, model_name: str) -> list[int]:
    """Protocol layer selection → sorted, unique, non-negative block indices."""
    if layers == "all":
        return list(range(num_layers))
    resolved = []
    for layer in layers:
        index = layer + num_layers if layer < 0 else layer
        if not 0 <= index < num_layers:
            raise AnistatInputError(f"sites.layers: layer {layer} does not exist in {model_name} ({num_layers} layers)")
        resolved.append(index)
    return sorted(set(resolved))


def site_name(layer: int, kind: str = "residual") -> str:
    return "embed" if kind == "embed" else f"{kind}.{layer}"


def _sublayer(block: torch.nn.Module, kind: str) -> str | None:
    """Relative name of the attention / MLP module whose output enters the residual stream."""
    children = dict(block.named_children())
    bert_style = "intermediate" in children and hasattr(children.get("output"), "dense")
    if bert_style:
        if kind == "mlp":
            return "output.dense"
        attention = children.get("attention")
        if attention is not None and hasattr(getattr(attention, "output", None), "dense"):
            return "attention.output.dense"
        return None
    for name in ATTN_CHILDREN if kind == "attn" else MLP_CHILDREN:
        if name in children:
            return name
    return None


_DESCRIPTIONS = {
    "embed": "embedding output (input of block 0)",
    "attn": "attention output added to the residual stream",
    "mlp": "MLP output added to the residual stream",
    "residual": "residual stream after the block",
}


def standard_site(model: torch.nn.Module, kind: str, layer: int) -> Site:
    """The `kind` site of block `layer` (kind in residual / embed / attn / mlp)."""
    path, blocks = find_blocks_path(model)
    if kind == "embed":
        return Site("embed", "embed", -1, f"{path}.0", "input", _DESCRIPTIONS["embed"])
    if not 0 <= layer < len(blocks):
        raise AnistatInputError(f"site {kind}.{layer}: {type(model).__name__} has {len(blocks)} blocks")
    if kind == "residual":
        return Site(f"residual.{layer}", "residual", layer, f"{path}.{layer}", "output", _DESCRIPTIONS["residual"])
    if kind in ("attn", "mlp"):
        relative = _sublayer(blocks[layer], kind)
        if relative is None:
            raise AnistatInputError(
                f"site {kind}.{layer}: no {kind} sub-module recognised in {type(blocks[layer]).__name__}; "
                "use a 'module:NAME' site (see `anistat sites MODEL`)"
            )
        return Site(f"{kind}.{layer}", kind, layer, f"{path}.{layer}.{relative}", "output", _DESCRIPTIONS[kind])
    raise AnistatInputError(f"unknown site kind '{kind}' (expected one of {', '.join(SITE_KINDS)})")


def _layer_of_module(model: torch.nn.Module, qualified: str) -> int:
    path, _ = find_blocks_path(model)
    match = re.match(re.escape(path) + r"\.(\d+)(\.|$)", qualified)
    return int(match.group(1)) if match else -1


def module_site(model: torch.nn.Module, qualified: str) -> Site:
    modules = dict(model.named_modules())
    if qualified not in modules or not qualified:
        raise AnistatInputError(
            f"site module:{qualified}: {type(model).__name__} has no module named '{qualified}' "
            "(see `anistat sites MODEL`)"
        )
    return Site(
        f"module:{qualified}",
        "module",
        _layer_of_module(model, qualified),
        qualified,
        "output",
        f"output of {type(modules[qualified]).__name__}",
    )


def resolve_site(model: torch.nn.Module, name: str) -> Site:
    """Parse a site name (see the module docstring) against a model."""
    name = name.strip()
    if name.startswith("module:"):
        return module_site(model, name[len("module:") :])
    if name == "embed":
        return standard_site(model, "embed", -1)
    match = re.fullmatch(r"(residual|attn|mlp)\.(-?\d+)", name)
    if not match:
        raise AnistatInputError(
            f"unknown site name '{name}' (expected embed, residual.L, attn.L, mlp.L or module:NAME)"
        )
    layer = int(match.group(2))
    if layer < 0:
        layer += num_blocks(model)
    return standard_site(model, match.group(1), layer)


def list_sites(model: torch.nn.Module) -> list[Site]:
    """Every standard site of a model, in forward order (embed, then attn/mlp/residual per block)."""
    _, blocks = find_blocks_path(model)
    sites = [standard_site(model, "embed", -1)]
    for layer in range(len(blocks)):
        for kind in ("attn", "mlp"):
            if _sublayer(blocks[layer], kind) is not None:
                sites.append(standard_site(model, kind, layer))
        sites.append(standard_site(model, "residual", layer))
    return sites


def sites_from_spec(model: torch.nn.Module, spec: Any, model_name: str) -> list[Site]:
    """Protocol `sites` section → ordered, de-duplicated sites of this model.

    `spec.names` (explicit site names) wins; otherwise every kind in `spec.kind` at the selected
    `spec.layers` (`embed` once), and for kind `module` every module matching `spec.modules`."""
    names = list(getattr(spec, "names", None) or [])
    sites: list[Site] = []
    if names:
        sites = [resolve_site(model, name) for name in names]
    else:
        kinds = spec.kind if isinstance(spec.kind, (list, tuple)) else [spec.kind]
        layers = resolve_layers(spec.layers, num_blocks(model), model_name)
        for kind in kinds:
            if kind == "embed":
                sites.append(standard_site(model, "embed", -1))
            elif kind == "module":
                sites.extend(match_modules(model, list(getattr(spec, "modules", []) or []), model_name))
            else:
                sites.extend(standard_site(model, kind, layer) for layer in layers)
    unique: dict[str, Site] = {}
    for site in sites:
        unique.setdefault(site.name, site)
    return list(unique.values())


def match_modules(model: torch.nn.Module, patterns: list[str], model_name: str) -> list[Site]:
    if not patterns:
        raise AnistatInputError("sites.kind 'module' needs sites.modules (module names or fnmatch patterns)")
    names = [n for n, _ in model.named_modules() if n]
    found: list[Site] = []
    for pattern in patterns:
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise AnistatInputError(f"sites.modules: no module of {model_name} matches '{pattern}'")
        found.extend(module_site(model, n) for n in matched)
    return found


def as_sites(model: torch.nn.Module, items: Iterable[Any] | Mapping[Any, Any]) -> dict[Any, Site]:
    """Normalise what callers pass (block indices → residual sites, names, Sites) to {key: Site}."""
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = [(item, item) for item in items]
    out = {}
    for key, value in pairs:
        if isinstance(value, Site):
            out[key] = value
        elif isinstance(value, int):
            out[key] = standard_site(model, "residual", value)
        elif isinstance(value, str):
            out[key] = resolve_site(model, value)
        else:
            raise TypeError(f"cannot interpret {value!r} as a site")
    return out


# ----------------------------------------------------------------------------------------------
# the probe
# ----------------------------------------------------------------------------------------------
def _hidden_of(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _replace_hidden(output, hidden):
    if isinstance(output, torch.Tensor):
        return hidden
    return type(output)([hidden, *output[1:]]) if isinstance(output, list) else (hidden,) + tuple(output[1:])


@dataclass
class ProbeRecord:
    """What the forward passes left at the probed sites (keyed like the caller's sites).

    `activations[key]` / `deltas[key]` hold the latest forward pass; with `accumulate=True`
    every pass appends to `all_activations[key]` / `all_deltas[key]` (gradient accumulation)."""

    activations: dict[Any, torch.Tensor]
    deltas: dict[Any, torch.Tensor]
    all_activations: dict[Any, list[torch.Tensor]] | None = None
    all_deltas: dict[Any, list[torch.Tensor]] | None = None


@contextlib.contextmanager
def probe(
    model: torch.nn.Module,
    sites: Iterable[Any] | Mapping[Any, Any],
    *,
    gradients: bool,
    activations: bool = True,
    accumulate: bool = False,
) -> Iterator[ProbeRecord]:
    """Hook the given sites for the duration of the context.

    With `gradients=True` each site tensor `h` is replaced by `h + δ` (δ a zero leaf that
    requires grad), so `torch.autograd.grad(loss, record.deltas.values())` — or `δ.grad` after
    the training step's own `loss.backward()` — is ∂L/∂h. Activations are recorded detached.
    Under `torch.no_grad()` no δ is created. Hooks are removed on exit, also on error.
    """
    resolved = as_sites(model, sites)
    modules = dict(model.named_modules())
    record = ProbeRecord(
        activations={},
        deltas={},
        all_activations={k: [] for k in resolved} if accumulate else None,
        all_deltas={k: [] for k in resolved} if accumulate else None,
    )

    def store(key, hidden: torch.Tensor) -> torch.Tensor:
        differentiable = gradients and torch.is_grad_enabled()
        if activations:
            record.activations[key] = hidden.detach()
            # accumulated lists pair activations with deltas: a no-grad forward (e.g. an
            # evaluation inside a gradient-probed step) is not accumulated
            if accumulate and (differentiable or not gradients):
                record.all_activations[key].append(record.activations[key])
        if not differentiable:
            return hidden
        delta = torch.zeros_like(hidden, requires_grad=True)
        record.deltas[key] = delta
        if accumulate:
            record.all_deltas[key].append(delta)
        return hidden + delta

    def output_hook(key, site):
        def hook(module, inputs, output):
            hidden = _hidden_of(output)
            if hidden is None:
                raise AnistatInputError(
                    f"site {site.name}: module output of type {type(output).__name__} is not a tensor"
                )
            new = store(key, hidden)
            return None if new is hidden else _replace_hidden(output, new)

        return hook

    def input_hook(key, site):
        def hook(module, args, kwargs):
            if args and isinstance(args[0], torch.Tensor):
                new = store(key, args[0])
                return None if new is args[0] else ((new, *args[1:]), kwargs)
            if isinstance(kwargs.get("hidden_states"), torch.Tensor):
                new = store(key, kwargs["hidden_states"])
                return None if new is kwargs["hidden_states"] else (args, {**kwargs, "hidden_states": new})
            raise AnistatInputError(f"site {site.name}: cannot find the hidden state among the block's inputs")

        return hook

    handles = []
    try:
        for key, site in resolved.items():
            module = modules.get(site.module)
            if module is None:
                raise AnistatInputError(f"site {site.name}: module '{site.module}' not found")
            if site.hook == "input":
                handles.append(module.register_forward_pre_hook(input_hook(key, site), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(output_hook(key, site)))
        yield record
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def residual_probe(model: torch.nn.Module, layers: list[int], *, gradients: bool) -> Iterator[ProbeRecord]:
    """`probe` at the residual stream after each block in `layers` (records keyed by layer)."""
    with probe(
        model, {layer: standard_site(model, "residual", layer) for layer in layers}, gradients=gradients
    ) as record:
        yield record


# ----------------------------------------------------------------------------------------------
# other hooks: every module hook anistat registers is registered in this module
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def site_calls(model: torch.nn.Module, sites: Mapping[Any, Site], on_call: Any) -> Iterator[None]:
    """``on_call(key)`` each time the module of ``sites[key]`` fires during a forward (a forward
    pre-hook for an input site, a forward hook for an output site, as `probe` hooks them: entered
    after a `probe`, its hooks run after the probe's). An exception ``on_call`` raises ends the
    forward. Hooks are removed on exit, also on error."""
    modules = dict(model.named_modules())
    handles = []
    try:
        for key, site in sites.items():
            module = modules[site.module]
            if site.hook == "input":
                handles.append(module.register_forward_pre_hook(lambda *_args, key=key: on_call(key)))
            else:
                handles.append(module.register_forward_hook(lambda *_args, key=key: on_call(key)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def forward_inputs(model: torch.nn.Module, on_forward: Any) -> Iterator[None]:
    """``on_forward(args, kwargs)`` at the start of every forward of ``model`` itself (a forward
    pre-hook with keyword arguments: what the caller passed, e.g. ``input_ids``). Removed on exit."""
    handle = model.register_forward_pre_hook(lambda _module, args, kwargs: on_forward(args, kwargs), with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
