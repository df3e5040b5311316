"""Every user-facing choice of anistat, named once: proxy methods, control kinds, interval methods
(and the default), multiplicity procedures, metrics and calibration scenarios.

Each choice is a frozen record of its ``name`` (the string a protocol, the command line and the
results use), its ``label`` (words, for text and HTML), its ``latex`` label and the ``sentence``
the report's methods text uses. The protocol's ``Literal`` types, the command line's choices and
help, the report's labels, the planner and the calibration read these tables; the
implementations register by name (dispatch tables keyed by these names), and
``tests/protocol/test_vocabulary.py`` checks that every name is written out here only and that every
dispatch table covers its vocabulary. A layer-0 module of constants: no behaviour, no imports
from anistat.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Choice:
    """One user-facing choice: its name, its label in words and in LaTeX, and the report's
    sentence for it."""

    name: str
    label: str
    latex: str
    sentence: str


@dataclass(frozen=True, kw_only=True)
class IntervalMethod(Choice):
    """An interval method; ``resamples``: whether it reads bootstrap resamples (the empirical
    likelihood intervals do not)."""

    resamples: bool = True


@dataclass(frozen=True, kw_only=True)
class ControlKind(Choice):
    """A control kind. ``sentence_latex``: the sentence with LaTeX math; ``closed_form``: the words
    for its closed-form expected energy (empty when it has none and its draws are projected per
    token); ``needs_activations``: its draws are shaped by the fit activations."""

    sentence_latex: str
    closed_form: str = ""
    needs_activations: bool = False


@dataclass(frozen=True, kw_only=True)
class ProxyKind(Choice):
    """A built-in proxy method. ``data_free``: its basis is drawn, not fitted on activations
    (the methods text then says "drawn as" its sentence)."""

    data_free: bool = False


@dataclass(frozen=True, kw_only=True)
class Correction(Choice):
    """A multiplicity procedure; ``short`` prefixes "adjusted p" in the report's answer."""

    short: str


def _by_name(*choices):
    return {choice.name: choice for choice in choices}


# ------------------------------------------------------------------ interval methods

PERCENTILE, BCA, STUDENTIZED = "percentile", "bca", "studentized"
BCA_LOG, VARIANCE_STABILISED = "bca_log", "variance_stabilised"
EL, ADJUSTED_EL, BALANCED_EL, ADJUSTED_EL_F = "el", "adjusted_el", "balanced_el", "adjusted_el_f"
#: The bootstrap intervals of the frequency correlations (besides :data:`PERCENTILE`).
BASIC, NORMAL_INTERVAL = "basic", "normal"

#: The energy estimands' interval methods (the protocol's ``stats.ci_method``), in the protocol's order.
CI_METHODS: dict[str, IntervalMethod] = _by_name(
    IntervalMethod(name=PERCENTILE, label="percentile bootstrap", latex="percentile bootstrap", sentence=PERCENTILE),
    IntervalMethod(name=BCA, label="BCa bootstrap", latex="BCa bootstrap", sentence=BCA),
    IntervalMethod(
        name=STUDENTIZED,
        label="studentized bootstrap",
        latex="studentized bootstrap",
        sentence="studentized: bootstrap-t on the log scale with the delta-method SE of a ratio of sums, tails "
        "expanded for the number of resampling units",
    ),
    IntervalMethod(
        name=BCA_LOG,
        label="BCa bootstrap on the log scale",
        latex="BCa bootstrap on the log scale",
        sentence="BCa on the log scale, tails expanded for the number of resampling units",
    ),
    IntervalMethod(
        name=VARIANCE_STABILISED,
        label="variance-stabilised bootstrap-t",
        latex="variance-stabilised bootstrap-$t$",
        sentence="variance-stabilised bootstrap-t (Tibshirani 1988), tails expanded for the number of resampling units",
    ),
    IntervalMethod(
        name=EL,
        label="empirical likelihood",
        latex="empirical likelihood",
        sentence="empirical likelihood of the ratio of means",
        resamples=False,
    ),
    IntervalMethod(
        name=ADJUSTED_EL,
        label="adjusted empirical likelihood",
        latex="adjusted empirical likelihood",
        sentence="adjusted empirical likelihood (Chen, Variyath & Abraham 2008) of the ratio of means",
        resamples=False,
    ),
    IntervalMethod(
        name=BALANCED_EL,
        label="balanced augmented empirical likelihood",
        latex="balanced augmented empirical likelihood",
        sentence="balanced augmented empirical likelihood (Emerson & Owen 2009) of the ratio of means",
        resamples=False,
    ),
    IntervalMethod(
        name=ADJUSTED_EL_F,
        label="adjusted empirical likelihood, F-calibrated on the effective size",
        latex="adjusted empirical likelihood, $F$-calibrated on the effective size",
        sentence="adjusted empirical likelihood (Chen, Variyath & Abraham 2008) of the ratio of means, "
        "calibrated by F(1, m − 1) on the effective number of resampling units m (Kish's, and the estimating "
        "function's tail weight)",
        resamples=False,
    ),
)
#: The interval of the energy estimands when the protocol names none (and of ``analyze_energy``,
#: ``anistat plan`` and ``anistat calibrate``).
DEFAULT_CI_METHOD = ADJUSTED_EL_F
#: The bootstrap intervals of the frequency correlations that are not energy-estimand methods.
FREQUENCY_INTERVALS: dict[str, IntervalMethod] = _by_name(
    IntervalMethod(name=BASIC, label="basic bootstrap", latex="basic bootstrap", sentence=BASIC),
    IntervalMethod(
        name=NORMAL_INTERVAL,
        label="normal bootstrap (estimate \u00b1 z \u00d7 bootstrap SE)",
        latex=r"normal bootstrap (estimate $\pm z \times$ bootstrap SE)",
        sentence=NORMAL_INTERVAL,
    ),
)

# ------------------------------------------------------------------ control kinds

NORMAL, HAAR, PCA_SPAN, COV_MATCHED = "normal", "haar", "pca_span", "cov_matched"

#: The matched-rank random control subspaces (the protocol's ``controls.kinds``).
CONTROL_KINDS: dict[str, ControlKind] = _by_name(
    ControlKind(
        name=NORMAL,
        label="normal",
        latex="normal",
        sentence="QR of (I \u2212 UU\u1d40)Z with Gaussian Z: random directions in the orthogonal "
        "complement of the proxy (the paper's control)",
        sentence_latex=r"QR of $(I - UU^{\top})Z$ with Gaussian $Z$: random directions in the orthogonal "
        r"complement of the proxy (the paper's control)",
        closed_form="k/(d − k) of the energy outside the proxy for normal",
    ),
    ControlKind(
        name=HAAR,
        label="haar",
        latex="haar",
        sentence="QR of a Gaussian Z: uniform over all k-dimensional subspaces",
        sentence_latex=r"QR of a Gaussian $Z$: uniform over all $k$-dimensional subspaces",
        closed_form="k/d of the gradient energy for haar",
    ),
    ControlKind(
        name=PCA_SPAN,
        label="pca_span",
        latex=r"pca\_span",
        sentence="a random k-subspace inside the top-m principal subspace of the activations "
        "(a hard control: does the proxy beat any high-variance direction?)",
        sentence_latex=r"a random $k$-subspace inside the top-$m$ principal subspace of the activations "
        r"(a hard control: does the proxy beat any high-variance direction?)",
        needs_activations=True,
    ),
    ControlKind(
        name=COV_MATCHED,
        label="cov_matched",
        latex=r"cov\_matched",
        sentence="QR of \u03a3_A^{1/2} Z: random directions shaped like the activation covariance",
        sentence_latex=r"QR of $\Sigma_A^{1/2} Z$: random directions shaped like the activation covariance",
        needs_activations=True,
    ),
)
#: The kinds whose expected energy has a closed form (drawn at analysis time from the moments).
CLOSED_FORM_KINDS: tuple[str, ...] = tuple(kind.name for kind in CONTROL_KINDS.values() if kind.closed_form)
#: The kinds a protocol compares against when it names none.
DEFAULT_CONTROL_KINDS: tuple[str, ...] = (NORMAL, HAAR)

# ------------------------------------------------------------------ proxy methods

PCA, SEMI_NMF, NMF, ICA, RANDOM = "pca", "semi_nmf", "nmf", "ica", "random"

#: The built-in proxy methods (a user's own ``register_proxy`` adds more, named by their code).
PROXY_KINDS: dict[str, ProxyKind] = _by_name(
    ProxyKind(
        name=PCA, label="PCA", latex="PCA", sentence="PCA (the top-k right singular vectors of the centred activations)"
    ),
    ProxyKind(
        name=SEMI_NMF,
        label="semi-NMF",
        latex="semi-NMF",
        sentence="semi-NMF (non-negative codes, free dictionary; Ding et al.), QR-orthonormalised",
    ),
    ProxyKind(name=NMF, label="NMF", latex="NMF", sentence="NMF of the ReLU'd activations, QR-orthonormalised"),
    ProxyKind(name=ICA, label="ICA", latex="ICA", sentence="ICA, QR-orthonormalised"),
    ProxyKind(
        name=RANDOM,
        label="random",
        latex="random",
        sentence="uniformly random subspaces (uninformative proxies, for null checks; no activation shapes them)",
        data_free=True,
    ),
)
#: The proxy a protocol fits when it names none.
DEFAULT_PROXY_METHOD = PCA

# ------------------------------------------------------------------ multiplicity

HOLM, FDR_BH, BONFERRONI, NO_CORRECTION = "holm", "fdr_bh", "bonferroni", "none"

#: The multiplicity procedures (the protocol's ``stats.multiplicity``), corrections first.
MULTIPLICITY: dict[str, Correction] = _by_name(
    Correction(name=HOLM, label="Holm", latex="Holm", sentence="Holm's step-down procedure", short="Holm"),
    Correction(
        name=FDR_BH,
        label="Benjamini\u2013Hochberg",
        latex="Benjamini--Hochberg",
        sentence="Benjamini and Hochberg's false-discovery-rate procedure",
        short="BH",
    ),
    Correction(
        name=BONFERRONI, label="Bonferroni", latex="Bonferroni", sentence="Bonferroni's correction", short="Bonferroni"
    ),
    Correction(name=NO_CORRECTION, label="no", latex="no", sentence="no correction", short=""),
)
#: The procedures that adjust p-values (every entry of :data:`MULTIPLICITY` but ``none``).
CORRECTIONS: tuple[str, ...] = tuple(name for name in MULTIPLICITY if name != NO_CORRECTION)
DEFAULT_MULTIPLICITY = HOLM

# ------------------------------------------------------------------ metrics

#: The metrics of a fitted proxy's energy against its controls (one row each per proxy × rank ×
#: control kind in results.csv).
ENERGY_METRICS: tuple[str, ...] = (
    "energy_fraction",
    "energy_ratio",
    "log2_energy_ratio",
    "z",
    "hedges_g",
    "anisotropy_capture",
)
#: Every metric that describes a fitted proxy (its ``proxy`` column names it): the energy metrics
#: and the change in isotropy when the proxy is removed.
PROXY_METRICS: tuple[str, ...] = (*ENERGY_METRICS, "delta_isoscore_star")
#: The report's labels of the metrics it names, in words and in LaTeX.
METRIC_LABELS: dict[str, str] = {
    "energy_fraction": "energy fraction E(U)",
    "energy_ratio": "energy ratio R",
    "log2_energy_ratio": "log\u2082 energy ratio",
    "oracle_fraction": "oracle fraction E*\u2096",
    "anisotropy_capture": "anisotropy capture",
    "delta_isoscore_star": "\u0394IsoScore*",
    "hedges_g": "Hedges\u2019 g",
    "z_score": "z",
}
METRIC_LABELS_TEX: dict[str, str] = {
    "energy_fraction": r"energy fraction $E(U)$",
    "energy_ratio": r"energy ratio $R$",
    "log2_energy_ratio": r"$\log_2$ energy ratio",
    "oracle_fraction": r"oracle fraction $E^{*}_{k}$",
    "anisotropy_capture": r"anisotropy capture",
    "delta_isoscore_star": r"$\Delta$IsoScore$^{*}$",
    "hedges_g": r"Hedges' $g$",
    "z_score": r"$z$",
}

# ------------------------------------------------------------------ calibration scenarios

#: The simulated scenarios of ``anistat calibrate`` (:func:`anistat.stats.run_calibration`).
SCENARIOS: dict[str, Choice] = _by_name(
    Choice(
        name="isotropic", label="isotropic", latex="isotropic", sentence="second moment I, one sequence per document"
    ),
    Choice(
        name="anisotropic",
        label="anisotropic",
        latex="anisotropic",
        sentence="a trained decoder's spectrum, one sequence per document",
    ),
    Choice(
        name="clustered",
        label="clustered",
        latex="clustered",
        sentence="anisotropic, sequences cut from shared documents",
    ),
    Choice(name="skewed", label="skewed", latex="skewed", sentence="document energies lognormal, \u03c3 = 1.5"),
    Choice(name="heavy", label="heavy", latex="heavy", sentence="\u03c3 = 2.5"),
    Choice(
        name="hot",
        label="hot",
        latex="hot",
        sentence="10 % documents with 5\u00d7 energy, concentrated in the proxy's span",
    ),
)
#: The scenarios whose sequences are cut from shared documents.
DOCUMENT_SCENARIOS: tuple[str, ...] = ("clustered", "skewed", "heavy", "hot")


# ------------------------------------------------------------------ rules a user meets

#: The fewest resampling units (documents, else sequences) for which intervals and the data test
#: are computed; below it they are NaN with the reason in the note. Calibrated with
#: :func:`anistat.stats.run_calibration` (clustered and anisotropic nulls, 200 studies per cell):
#: at 10 documents coverage is 0.945–0.985 and the data test's level 0.03–0.045 with power
#: 0.905–0.94 at ratio 2; at 5 coverage is 0.985–1.00 with power 0.325–0.35, and at 2 the interval
#: covers 0.275–0.355 of the time (``benchmarks/README.md``, "The fewest resampling units for an
#: interval").
MIN_RESAMPLING_UNITS = 10
