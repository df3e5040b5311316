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
    SequenceTypeSums,
    centroid_distances,
    frequency_buckets,
    log_frequency_correlation,
    masked_correlations,
    sequence_type_sums,
)
from .metrics import (
    DEFAULT_ZETA,
    anisotropy_capture,
    delta_isoscore_star,
    delta_isoscore_star_from_traces,
    effective_rank,
    effective_rank_from_cov,
    energy_fraction,
    energy_fraction_from_moments,
    isoscore,
    isoscore_from_cov,
    isoscore_from_eigenvalues,
    isoscore_from_trace_frobenius,
    isoscore_star,
    isoscore_star_from_cov,
    mean_cosine,
    oracle_fraction,
    oracle_fractions,
    participation_ratio,
    participation_ratio_from_cov,
    removal_traces,
    removal_traces_in_eigenbasis,
    shrunk_trace_frobenius,
)
from .moments import GradientMoments
from .null_check import NullCheck, haar_energy_moments, haar_null_check, haar_token_fraction_law
from .proxies import PROXY_METHODS, Proxy, ProxyMethod, fit_proxy, project, register_proxy, top_activating

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
    "SequenceTypeSums",
    "anisotropy_capture",
    "centroid_distances",
    "complement_basis",
    "delta_isoscore_star",
    "delta_isoscore_star_from_traces",
    "draw_controls",
    "effective_rank",
    "effective_rank_from_cov",
    "energy_fraction",
    "energy_fraction_from_moments",
    "fit_proxy",
    "frequency_buckets",
    "haar_energy_moments",
    "haar_null_check",
    "haar_token_fraction_law",
    "isoscore",
    "isoscore_from_cov",
    "isoscore_from_eigenvalues",
    "isoscore_from_trace_frobenius",
    "isoscore_star",
    "isoscore_star_from_cov",
    "log_frequency_correlation",
    "masked_correlations",
    "mean_cosine",
    "oracle_fraction",
    "oracle_fractions",
    "participation_ratio",
    "participation_ratio_from_cov",
    "principal_subspace",
    "project",
    "register_proxy",
    "removal_traces",
    "removal_traces_in_eigenbasis",
    "sequence_type_sums",
    "shrunk_trace_frobenius",
    "top_activating",
]
