"""anistat.stats — the statistics engine (pure numpy / scipy / statsmodels).

Numpy in, small frozen dataclasses out. Resampling is vectorised over a weights matrix
``W (B, S)`` of unit multiplicities (documents, else sequences, are the sampling unit). Entry points:

* :func:`analyze_energy` — everything for one proxy vs one control kind (exact Haar
  Monte-Carlo p-value, the paper's control p-value, the studentized bootstrap data test,
  bootstrap CIs of named estimands, effect sizes); :func:`analyze_metric_vs_controls` for one-value metrics.
* :func:`monte_carlo_pvalue`, :func:`sign_flip_test`, :func:`sequence_bootstrap`
  (:func:`sequence_bootstrap_columns` for several statistics from one resample).
* :func:`adjust_pvalues`, :func:`adjust_in_families`, :func:`min_controls_needed`,
  :func:`resolution_warning`.
* :func:`ratio_interval` (bootstrap-t, BCa and variance-stabilised on the log scale; plain,
  adjusted and balanced augmented empirical likelihood, and adjusted EL F-calibrated on the
  effective size, :func:`el_effective_size`) for a ratio of means under skew, and
  :func:`kish_effective_size`, how concentrated the units' energies are.
* :func:`random_effects_meta`, :func:`trend_test`.
* :func:`run_calibration` (its files: :func:`anistat.calibration_report.write_calibration_report`);
  :func:`p_value_uniformity` (a run's own null check, on the p-values' own grid).
* :mod:`anistat.stats.power`: power and sample size of the data test, the exact test and the
  energy ratio's interval (``solve_power`` for the missing one of documents, effect and power /
  half-width; ``anistat plan`` calls it).
"""

from ._validation import DegenerateStatisticWarning
from .bootstrap import (
    BootstrapResult,
    StudentizedTest,
    bootstrap_weights,
    ci_from_replicates,
    expanded_pvalue,
    expanded_tail,
    iter_bootstrap_weights,
    jackknife_weights,
    ratio_se,
    sequence_bootstrap,
    sequence_bootstrap_columns,
    studentized_ratio_test,
)
from .calibrate import CalibrationResult, run_calibration
from .effects import (
    anisotropy_capture,
    energy_ratio,
    hedges_correction,
    hedges_g_paired,
    log2_energy_ratio,
    per_sequence_differences,
    z_score,
)
from .energy import (
    CLOSED_FORM_KINDS,
    DATA_TEST,
    EXACT_TEST,
    METRICS,
    MIN_RESAMPLING_UNITS,
    SIGN_FLIP_TEST,
    ControlComparison,
    ControlMoments,
    EnergyAnalysis,
    ExactTestResult,
    MetricResult,
    analyze_energy,
    analyze_metric_vs_controls,
    cluster_sums,
    control_energy_moments,
    expected_control_energy,
)
from .fallbacks import FALLBACK_CODES
from .meta import MetaResult, TrendResult, random_effects_meta, trend_test
from .montecarlo import SequentialMonteCarlo, min_attainable_pvalue, monte_carlo_pvalue, sequential_monte_carlo_pvalue
from .multiplicity import adjust_in_families, adjust_pvalues, min_controls_needed, resolution_warning
from .permutation import PermutationResult, sign_flip_null, sign_flip_pvalues, sign_flip_test
from .ratio_intervals import (
    RATIO_INTERVAL_METHODS,
    RatioInterval,
    calibrated_concentration,
    el_critical_value,
    el_effective_size,
    empirical_likelihood_statistic,
    kish_effective_size,
    ratio_el_interval,
    ratio_el_statistic,
    ratio_interval,
)
from .uniformity import UniformityCheck, p_value_grid, p_value_uniformity

__all__ = [
    "CLOSED_FORM_KINDS",
    "DATA_TEST",
    "EXACT_TEST",
    "MIN_RESAMPLING_UNITS",
    "SIGN_FLIP_TEST",
    "cluster_sums",
    "expected_control_energy",
    "StudentizedTest",
    "expanded_pvalue",
    "expanded_tail",
    "studentized_ratio_test",
    "ControlMoments",
    "ExactTestResult",
    "FALLBACK_CODES",
    "control_energy_moments",
    "BootstrapResult",
    "CalibrationResult",
    "UniformityCheck",
    "p_value_grid",
    "p_value_uniformity",
    "ControlComparison",
    "DegenerateStatisticWarning",
    "EnergyAnalysis",
    "METRICS",
    "MetaResult",
    "MetricResult",
    "PermutationResult",
    "TrendResult",
    "adjust_in_families",
    "adjust_pvalues",
    "analyze_energy",
    "analyze_metric_vs_controls",
    "anisotropy_capture",
    "bootstrap_weights",
    "ci_from_replicates",
    "energy_ratio",
    "hedges_correction",
    "hedges_g_paired",
    "iter_bootstrap_weights",
    "jackknife_weights",
    "log2_energy_ratio",
    "min_attainable_pvalue",
    "min_controls_needed",
    "monte_carlo_pvalue",
    "per_sequence_differences",
    "random_effects_meta",
    "ratio_se",
    "SequentialMonteCarlo",
    "sequential_monte_carlo_pvalue",
    "resolution_warning",
    "run_calibration",
    "sequence_bootstrap",
    "sequence_bootstrap_columns",
    "sign_flip_null",
    "sign_flip_pvalues",
    "sign_flip_test",
    "trend_test",
    "z_score",
    "RATIO_INTERVAL_METHODS",
    "RatioInterval",
    "calibrated_concentration",
    "el_critical_value",
    "el_effective_size",
    "empirical_likelihood_statistic",
    "kish_effective_size",
    "ratio_el_interval",
    "ratio_el_statistic",
    "ratio_interval",
]
