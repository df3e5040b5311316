"""Collection stage: hooks at named sites, fit activations, true gradients → UnitArtifact."""

from .artifact import BasisColumn, UnitArtifact, UnitKey
from .collector import (
    BasisSet,
    FitSample,
    FitSampler,
    SiteAccumulator,
    TypePlan,
    autocast,
    collect_fit_activations,
    concept_cards,
    measure_checkpoint,
    model_inputs,
    resolve_precision,
    sample_fit_tokens,
)
from .sites import (
    SITE_KINDS,
    Site,
    find_blocks,
    list_sites,
    probe,
    residual_probe,
    resolve_layers,
    resolve_site,
    site_name,
    sites_from_spec,
)

__all__ = [
    "BasisColumn", "BasisSet", "FitSample", "FitSampler", "SITE_KINDS", "Site", "SiteAccumulator", "TypePlan", "UnitArtifact",
    "UnitKey", "autocast", "collect_fit_activations", "concept_cards", "find_blocks", "list_sites",
    "measure_checkpoint", "model_inputs", "probe", "residual_probe", "resolve_layers", "resolve_precision",
    "resolve_site", "sample_fit_tokens", "site_name", "sites_from_spec",
]
