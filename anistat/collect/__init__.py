"""Collection stage: hooks at named sites, fit activations, true gradients → UnitArtifact."""

from .artifact import BasisColumn, UnitArtifact, UnitKey
from .collector import (
    BasisSet,
    FitSample,
    collect_fit_activations,
    concept_cards,
    measure_checkpoint,
    model_inputs,
    sample_fit_tokens,
)
from .sites import find_blocks, residual_probe, resolve_layers, site_name

__all__ = [
    "BasisColumn", "BasisSet", "FitSample", "UnitArtifact", "UnitKey", "collect_fit_activations",
    "concept_cards", "find_blocks", "measure_checkpoint", "model_inputs", "residual_probe",
    "resolve_layers", "sample_fit_tokens", "site_name",
]
