"""anistat.geometry — the pure-math layer: proxies, controls and metrics.

Imports nothing else from anistat.  Conventions: points / activations / gradients are
``(n_samples, d)``; a basis is ``(d, k)`` with orthonormal columns; a stack of bases is
``(n, d, k)``.  Inputs may be torch tensors or numpy arrays; computation is float64 on the
input's device.
"""

from ._util import DegenerateMetricWarning
from .controls import CONTROL_KINDS, complement_basis, draw_controls, principal_subspace
from .frequency import (
    CentroidDistances,
    FrequencyCorrelation,
    ResampledCentroidDistance,
    ResampledTypeMeans,
    SequenceTypeSums,
    TypeMeanGeometry,
    centroid_distances,
    frequency_buckets,
    log_frequency_correlation,
    masked_correlations,
    sequence_type_sums,
    type_mean_geometry,
)
from .metrics import (
    DEFAULT_ZETA,
    anisotropy_capture,
    delta_isoscore_star,
    effective_rank,
    effective_rank_from_cov,
    energy_fraction,
    energy_fraction_from_moments,
    isoscore,
    isoscore_from_cov,
    isoscore_from_eigenvalues,
    isoscore_star,
    isoscore_star_from_cov,
    mean_cosine,
    oracle_fraction,
    participation_ratio,
    participation_ratio_from_cov,
)
from .moments import GradientMoments
from .random_subspaces import SpectralFrame, SubspaceTraces, isoscore_star_from_traces, random_subspace_traces
from .null_check import NullCheck, haar_energy_moments, haar_null_check, haar_token_fraction_law
from .proxies import (
    PROXY_METHODS, Proxy, ProxyMethod, center_default, fit_proxy, project, proxy_variants, register_proxy,
    top_activating,
)

__all__ = [
    "CONTROL_KINDS",
    "DEFAULT_ZETA",
    "PROXY_METHODS",
    "CentroidDistances",
    "DegenerateMetricWarning",
    "FrequencyCorrelation",
    "GradientMoments",
    "NullCheck",
    "Proxy",
    "ProxyMethod",
    "ResampledCentroidDistance",
    "ResampledTypeMeans",
    "SequenceTypeSums",
    "TypeMeanGeometry",
    "anisotropy_capture",
    "center_default",
    "centroid_distances",
    "complement_basis",
    "delta_isoscore_star",
    "draw_controls",
    "effective_rank",
    "effective_rank_from_cov",
    "energy_fraction",
    "energy_fraction_from_moments",
    "fit_proxy",
    "frequency_buckets",
    "haar_energy_moments",
    "haar_null_check",
    "SpectralFrame",
    "SubspaceTraces",
    "isoscore_star_from_traces",
    "random_subspace_traces",
    "haar_token_fraction_law",
    "isoscore",
    "isoscore_from_cov",
    "isoscore_from_eigenvalues",
    "isoscore_star",
    "isoscore_star_from_cov",
    "log_frequency_correlation",
    "masked_correlations",
    "mean_cosine",
    "oracle_fraction",
    "participation_ratio",
    "participation_ratio_from_cov",
    "principal_subspace",
    "project",
    "proxy_variants",
    "register_proxy",
    "sequence_type_sums",
    "top_activating",
    "type_mean_geometry",
]
