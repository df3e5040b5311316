"""The one fit core: a site's fit activations → its frozen (or refitted) proxies and controls.

`anistat run` (after streaming the fit split through the early checkpoints), `TrainingMeter`
and `AnistatCallback` (after their fit steps, and at every unit with `proxies.refit`) all fit
through `fit_site_bases`, so the same protocol gives the same proxy variants (`proxies.methods`
× `proxies.center` × `proxies.ranks`, `geometry.proxy_variants`), the same refitted proxies
(`proxies.refit`, labelled `METHOD@refit`) and the same derived seeds on the same activations.

Seeds: the proxy of (model, site, variant label, rank) is fitted with
``derive_seed(seed, model, site_key, label, rank, "proxy", *refit_tag)`` and its controls of
a kind drawn with ``derive_seed(seed, model, site_key, label, rank, kind, *refit_tag)``, where
``site_key`` is the block index of a residual site and the site name otherwise (`site_seed_key`)
and ``refit_tag`` is ``("refit", checkpoint label)`` for a refitted proxy, empty for a frozen one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import AnistatInputError
from ..geometry import draw_controls, fit_proxies, proxy_variants
from ..protocol import Protocol, control_problem
from ..seeding import derive_seed
from .collector import BasisSet
from .sites import Site

#: The suffix of a proxy refitted on a checkpoint's (or a measured step's) own activations.
REFIT_SUFFIX = "@refit"


def site_seed_key(site: Site) -> int | str:
    """The label a site contributes to derived seeds: the block index of a residual site (so its
    draws are those of the residual-only collector), the site name otherwise."""
    return site.layer if site.kind == "residual" else site.name


def fits_frozen(protocol: Protocol) -> bool:
    """Whether the run fits frozen proxies once (`proxies.refit` frozen or both)."""
    return protocol.proxies.refit != "per_checkpoint"


def fits_per_unit(protocol: Protocol) -> bool:
    """Whether every checkpoint (every measured unit) also gets proxies refitted on its own
    activations (`proxies.refit` per_checkpoint or both)."""
    return protocol.proxies.refit != "frozen"


def check_fit_sample(activations: torch.Tensor, protocol: Protocol, where: str, site: str, data: str) -> None:
    """The fit sample of one site can fit every proxy and control: its width d admits the ranks and
    control kinds (`protocol.control_problem`; a module site's width is known only here) and
    every activation is finite. `where` starts the message (``models.NAME``, ``TrainingMeter``);
    `data` names the activations (``the fit split``, ``the fit steps``)."""
    dim = int(activations.shape[1])
    problem = control_problem(protocol.controls, protocol.proxies.ranks, dim)
    if problem:
        raise AnistatInputError(f"{where}: site {site} (dimension {dim}): {problem}")
    if not bool(torch.isfinite(activations).all()):
        raise AnistatInputError(
            f"{where}: the model produces non-finite (NaN/Inf) activations at site {site} on {data}, so no "
            "proxy can be fitted; check the checkpoint's weights"
        )


def fit_site_bases(
    activations: torch.Tensor,
    protocol: Protocol,
    *,
    model: str,
    site_key: int | str,
    device: torch.device | str = "cpu",
    refit_label: str | None = None,
    cards: Callable[[torch.Tensor], list[dict[str, Any]]] | None = None,
    broadcast: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor,
) -> list[BasisSet]:
    """One site's proxies — every method, centring variant (`proxies.center`) and rank — fitted on
    its fit activations (N, d), each with the projected controls of `protocol.projected_control_kinds`
    (seeds: module docstring).

    ``refit_label`` (a checkpoint label, e.g. ``step40``): the proxies are refitted ones, labelled
    ``METHOD@refit`` and seeded with the label, without concept cards. ``cards(basis)``: the concept
    cards of a frozen basis (the largest rank's serve every rank whose basis is its prefix, as PCA's
    are); None: no cards. ``broadcast``: applied to every basis and control stack (under torchrun,
    rank 0's copy, so GPU nondeterminism cannot split the ranks)."""
    seed, ranks = protocol.seed, protocol.proxies.ranks
    refit_tag = () if refit_label is None else ("refit", refit_label)
    sample = activations.to(device)
    sets = []
    for method in protocol.proxies.methods:
        for label, options in proxy_variants(method, protocol.proxies.center.get(method)):
            proxies = fit_proxies(
                sample,
                method,
                ranks,
                {rank: derive_seed(seed, model, site_key, label, rank, "proxy", *refit_tag) for rank in ranks},
                **options,
            )
            largest = proxies[max(ranks)].basis
            widest_cards = None
            for rank in ranks:
                proxy = proxies[rank]
                controls = {
                    kind: draw_controls(
                        kind,
                        proxy.basis,
                        protocol.controls.n,
                        seed=derive_seed(seed, model, site_key, label, rank, kind, *refit_tag),
                        activations=sample,
                        pca_span_dim=protocol.controls.pca_span_dim,
                    )
                    for kind in protocol.projected_control_kinds
                }
                basis = broadcast(proxy.basis.contiguous())
                controls = {kind: broadcast(stack.contiguous()) for kind, stack in controls.items()}
                found: list[dict[str, Any]] = []
                if cards is not None and refit_label is None:
                    if torch.equal(proxy.basis, largest[:, :rank]):  # nested (pca): the same directions
                        widest_cards = cards(largest) if widest_cards is None else widest_cards
                        found = widest_cards[:rank]
                    else:
                        found = cards(basis)
                name = label if refit_label is None else label + REFIT_SUFFIX
                sets.append(BasisSet(name, rank, basis, controls, proxy.reconstruction_error, found))
    return sets
