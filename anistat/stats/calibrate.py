"""Calibration simulation: does the engine hold its level and cover its CIs under the nulls
users meet?

Synthetic per-token gradients (numpy), in three scenarios:

* ``isotropic``   — population second moment ``Σ = I``; each sequence its own document;
* ``anisotropic`` — a spectrum like a trained decoder's (``λ_j ∝ j^-2``: the top 3 of 24
  directions hold ≈ 85 % of the energy); each sequence its own document;
* ``clustered``   — the anisotropic spectrum, and sequences cut from shared documents: a
  document draws 1 + Poisson(3) sequences that share its scale and a random rank-2 "topic"
  subspace (so its sequences are dependent), on top of each sequence's own topic;
* ``hot``         — ``clustered`` with "hot" documents of 5× energy that put 3× the energy
  share in the proxy's span (planted conditions; in a random subspace independent of the proxy
  for the random-proxy condition, so the exact test's null holds), the others 0.2×: at a planted
  ratio of 1 the shares are 0.30 and 0.028 and the population ratio stays exactly 1; the targets
  are the mixture's population quantities. Documents are i.i.d.: each is hot with probability
  :data:`HOT_SHARE` = 0.1 (so a study's number of hot documents is binomial, as in a corpus
  sampled at random), and the population second moment weighs the hot and the other documents'
  laws by ``HOT_SHARE`` and ``1 − HOT_SHARE``. (A fixed 10 % of every study's documents — a
  stratified sample — made every interval over-cover, 0.97–0.98, and the data test never reject.)
* ``skewed``      — ``clustered`` with heavy-tailed document scales: each document's gradient
  scale ``c_doc`` is lognormal with log-SD ``skewed_document_sd`` (default
  :data:`SKEWED_DOCUMENT_SD` = 0.75, so its energy ``c_doc²`` is lognormal with σ = 1.5) instead
  of ``scale_sd``: a few documents carry most of the energy. Measured at 60 documents (200
  studies per condition, benchmarks/README.md): 95 % coverage of the studentized energy-ratio
  interval 0.923 and the data test's level 0.068 (an independent audit of this law: 0.926 and
  0.061); with gradient log-SD 1.5 (energy σ = 3) 0.83 and 0.11. The interval methods side by
  side under this and the other laws: ``benchmarks/bench_ratio_intervals.py``.
* ``heavy``       — ``skewed`` with document gradient log-SD :data:`HEAVY_DOCUMENT_SD` = 1.25
  (energy lognormal with σ = 2.5): ``E[c⁴]/E[c²]² = e^{σ²} ≈ 518`` against ≈ 9.5 at σ = 1.5, so
  even at 200 documents one or two documents usually hold most of the energy (Kish's effective
  number of documents is typically below 10). The same family as ``skewed`` with only the tail
  weight changed: the stress case where no interval of a ratio of means can hold its level and
  the per-row concentration diagnostic must say so.

Beside the analysis' own interval every study also computes the energy ratio's (haar, document
unit) interval by each of :data:`anistat.stats.ratio_intervals.RATIO_INTERVAL_METHODS` on the same
per-document sums and resamples (columns ``cover_method_<name>``), and Kish's effective number of
documents ``n_eff = (Σ T_u)²/Σ T_u²`` of the per-document total energies ``T_u`` and the ratio's
effective size ``m_eff`` (``min(n_eff, n_z)``, :func:`anistat.stats.el_effective_size`); coverage and
the data test's level by ``m_eff`` level are :func:`concentration_rows`.

Tokens: ``g_i = c_doc c_seq L (√ρ_d B_docᵀ f_i + √ρ_s B_seqᵀ f'_i + √(1 − ρ_d − ρ_s) e_i)``
with ``LLᵀ = Σ``, ``B`` rows i.i.d. ``N(0, 1/m)`` (so ``E BᵀB = I`` and the population second
moment is ``∝ Σ`` whatever the clustering), ``f, e`` standard normal.

Conditions (per scenario):

* ``random`` — an *uninformative proxy*: ``U`` Haar, independent of the gradients. The null
  of the exact test. Rejection rate at ``alpha`` of the primary test (Haar Monte-Carlo,
  :data:`EXACT_TEST`) and of the paper's convention (``normal`` controls drawn in U's
  complement, ``p = (1 + #)/(1 + n)`` with ``n = 20`` and 99) — the latter is not exact under
  anisotropy, and its inflation is reported, not hidden.
* planted ratios ``ρ`` (``1.0, 1.5, 2.0``): ``U`` fixed with population energy fraction
  ``E_pop(U) = ρ k/d`` (``Σ`` restricted to span U is ``s I_k``, its complement keeps the
  scenario's spectrum). ``ρ = 1`` is the null of the sign-flip test (population ratio to the
  expected Haar-control energy = 1).

In every condition the CIs target the population quantities for the fixed ``U``:
``E_pop(U) = tr(UᵀΣU)/tr Σ``, ``R_haar = E_pop/(k/d)``, ``R_normal = E_pop/(k/(d−k)·(1 −
E_pop))`` — the estimands :func:`anistat.stats.analyze_energy` names. Each simulated study goes
through ``analyze_energy`` (the same entry point as real data) with the default resampling
unit (documents) and, for contrast, with sequences (ignoring the documents).

Tests reported: the exact test with all ``n_null`` draws and with sequential stopping
(``stop_after``, the default of real runs); the paper's convention; the data test (the
studentized bootstrap test of ratio 1, :func:`anistat.stats.studentized_ratio_test`) and, beside
it, the sign-flip test it replaced. Coverage is measured at ``n_documents`` (the goals) and at
``coverage_documents`` (reported). Holm's family-wise error and BH's false discovery rate with
draws shared by many units: :mod:`anistat.stats.family_calibration`.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .. import vocabulary as vocab
from ._validation import check_choice
from .bootstrap import bootstrap_weights
from .energy import CI_METHODS, analyze_energy, cluster_sums, expected_control_energy
from .montecarlo import monte_carlo_pvalue, sequential_monte_carlo_pvalue
from .permutation import sign_flip_test
from .ratio_intervals import (
    BOOTSTRAP_RATIO_METHODS,
    RATIO_INTERVAL_METHODS,
    el_effective_size,
    kish_effective_size,
    ratio_interval,
)

GOALS = {"type1": (0.04, 0.06), "coverage": (0.94, 0.96)}
#: The scenarios (:data:`anistat.vocabulary.SCENARIOS`).
SCENARIOS = tuple(vocab.SCENARIOS)
#: Heavier document laws run on request (not by default), ``clustered`` with another law of the
#: document's energy scale: ``t3`` — a t₃ scale mixture (energy ``c_doc² = 3/χ²₃``, mean 3,
#: infinite variance: each document's gradients are multivariate t₃); ``two_point`` — each document
#: with probability :data:`TWO_POINT_SHARE` = 0.05 at :data:`TWO_POINT_ENERGY` = 20× the energy.
#: A scalar scale leaves the population's energy shares (the targets) unchanged.
HEAVIER_SCENARIOS = ("t3", "two_point")
#: Scenarios whose sequences are cut from shared documents.
DOCUMENT_SCENARIOS = (*vocab.DOCUMENT_SCENARIOS, *HEAVIER_SCENARIOS)
#: ``t3``: degrees of freedom of the document scale mixture; ``two_point``: share and energy multiple.
T3_DF, TWO_POINT_SHARE, TWO_POINT_ENERGY = 3, 0.05, 20.0
#: ``hot``: the share of hot documents, their energy multiple, and the factors by which hot and
#: other documents scale the energy in the tilted subspace (at a planted ratio of 1 and k/d = 1/8:
#: shares 0.30 and 0.028, energy-weighted mixture exactly k/d).
HOT_SHARE, HOT_ENERGY, HOT_TILT, COLD_TILT = 0.1, 5.0, 3.0, 0.2
#: Log-scale SD of the per-document gradient scale in the ``skewed`` scenario (energy: twice this).
SKEWED_DOCUMENT_SD = 0.75
#: Log-scale SD of the per-document gradient scale in the ``heavy`` scenario (energy σ = 2.5).
HEAVY_DOCUMENT_SD = 1.25
#: Effective-size levels (lower edges of ``m_eff``, the ratio's effective number of documents) by
#: which coverage and the data test's level are reported (:func:`concentration_rows`).
EFFECTIVE_SIZE_EDGES = (1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 80.0, 120.0)
#: Levels (lower edges) of a study's energy spread ``n/n_eff = 1 + cv_t²`` (its documents' total
#: energies' mean square over their squared mean) by which the data test's level is reported
#: (:func:`spread_rows`).
SPREAD_EDGES = (1.0, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0)
#: Scenario-independent condition names besides planted ratios.
RANDOM_PROXY = vocab.RANDOM


@dataclass(frozen=True, kw_only=True)
class CalibrationResult:
    """Summary of :func:`run_calibration`.

    Attributes
    ----------
    settings : dict
        The study's settings (the arguments of :func:`run_calibration`, normalised).
    conditions : tuple of dict
        One dict per (scenario, condition) with rates, binomial standard errors and coverages.
    checks : dict
        Goal name -> :func:`goal_check`'s dict (value, band, Monte-Carlo margin, verdict met /
        NOT met / unresolved) for every default method in every scenario.
    elapsed_s : float
        Wall-clock seconds of the study.
    simulations : dict
        ``"scenario/condition"`` -> the per-simulation columns, with ``keep_simulations``; else
        empty.
    concentration : tuple of dict
        Coverage of every ratio-interval method and the data test's level by ``m_eff``
        level, pooled over scenarios, conditions and study sizes (:func:`concentration_rows`).
    spread : tuple of dict
        The data test's level by the documents' energy spread ``n/n_eff``, pooled likewise
        (:func:`spread_rows`).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> result = stats.run_calibration(2, seed=0, scenarios=('isotropic',), planted_ratios=(1.0,), n_documents=12, dim=8, rank=2, n_bootstrap=50, n_null=19, n_test_resamples=49)
    >>> type(result).__name__, len(result.conditions) > 0
    ('CalibrationResult', True)
    """

    settings: dict
    conditions: tuple
    checks: dict
    elapsed_s: float
    simulations: dict = field(default_factory=dict, repr=False)
    concentration: tuple = ()
    spread: tuple = ()

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(list(self.conditions))

    def condition(self, scenario: str, condition) -> dict:
        for row in self.conditions:
            if row["scenario"] == scenario and row["condition"] == str(condition):
                return row
        raise KeyError((scenario, condition))


def _haar(rng, lead, d, k):
    q, r = np.linalg.qr(rng.standard_normal(lead + (d, k)))
    return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def _spectrum(scenario: str, d: int) -> np.ndarray:
    if scenario == "isotropic":
        return np.ones(d)
    return 1.0 / np.arange(1, d + 1) ** 2


def _population(rng, scenario, condition, d, k):
    """(Σ (d, d), U (d, k)) for one study."""
    lam = _spectrum(scenario, d)
    if condition == RANDOM_PROXY:
        rotation = _haar(rng, (), d, d)
        return (rotation * lam) @ rotation.T, _haar(rng, (), d, k)
    planted = float(condition)
    full = _haar(rng, (), d, d)
    u, complement = full[:, :k], full[:, k:]
    lam_c = lam[: d - k]
    target = planted * k / d
    s = target / (1.0 - target) * lam_c.sum() / k
    sigma = s * (u @ u.T) + (complement * lam_c) @ complement.T
    return sigma, u


def _simulate_one(rng, scenario, condition, cfg):
    """One simulated study and the statistics engine's tests and intervals on it: a row of ``_COLS``."""
    d, k = cfg["dim"], cfg["rank"]
    p_seq, t_seq, second, sigma, u, doc_of_seq, clustered = _simulated_study(rng, scenario, condition, cfg)
    total = np.trace(second)
    observed = float(np.trace(u.T @ second @ u) / total)
    # the primary test's null: Haar draws on the same data; the paper's: normal draws in U's complement
    haar = _haar(rng, (cfg["n_null"],), d, k)
    null = np.einsum("ndk,de,nek->n", haar, second, haar) / total
    zc = rng.standard_normal((99, d, k))
    zc -= u @ (u.T @ zc)
    normal_q = _haar_from(zc)
    normal = np.einsum("ndk,de,nek->n", normal_q, second, normal_q) / total
    # population targets for this fixed U
    e_pop = float(np.trace(u.T @ sigma @ u) / np.trace(sigma))
    truth = {"fraction": e_pop, vocab.HAAR: e_pop / (k / d), vocab.NORMAL: e_pop / (k / (d - k) * (1.0 - e_pop))}
    common = dict(
        rank=k,
        dim=d,
        null_fractions=null,
        observed_fraction=observed,
        n_bootstrap=cfg["n_bootstrap"],
        ci_level=cfg["ci_level"],
        ci_method=cfg["ci_method"],
        n_test_resamples=cfg["n_test_resamples"],
        # a fresh resampling stream per simulated study (one shared weights matrix would
        # bias every study's coverage the same way)
        seed=int(rng.integers(2**62)),
        # the intervals themselves at every study size, including those below the
        # analysis's MIN_RESAMPLING_UNITS (where a run withholds them)
        min_resampling_units=2,
    )
    out = {"p_exact": 0.0, "p_exact_sequential": sequential_monte_carlo_pvalue(observed, null, cfg["stop_after"])[0]}
    for kind in (vocab.HAAR, vocab.NORMAL):
        reference = expected_control_energy(kind, p_seq, t_seq, k, d)
        for unit, groups in (("document", doc_of_seq if clustered else None), ("sequence", None)):
            if unit == "sequence" and not clustered:
                continue
            res = analyze_energy(
                p_seq,
                t_seq,
                reference,
                group_ids=groups,
                control_kind=kind,
                control_fractions=normal if kind == vocab.NORMAL else None,
                **common,
            )
            ratio, fraction = res["energy_ratio"], res["energy_fraction"]
            out[f"cover_ratio_{kind}_{unit}"] = float(ratio.ci_low <= truth[kind] <= ratio.ci_high)
            if kind == vocab.HAAR:
                out[f"cover_fraction_{unit}"] = float(fraction.ci_low <= e_pop <= fraction.ci_high)
                out[f"p_data_{unit}"] = res.data_test.p_value
                sums, _ = cluster_sums(np.stack([p_seq, reference], axis=1), groups)
                out[f"p_sign_flip_{unit}"] = sign_flip_test(
                    sums[:, 0] - sums[:, 1], cfg["n_test_resamples"], common["seed"]
                ).p_value
            out["p_exact"] = res.p_value
    for unit in ("sequence",):
        if not clustered:  # sequences are the documents: the same analysis
            out[f"cover_ratio_haar_{unit}"] = out["cover_ratio_haar_document"]
            out[f"cover_ratio_normal_{unit}"] = out["cover_ratio_normal_document"]
            out[f"cover_fraction_{unit}"] = out["cover_fraction_document"]
            out[f"p_sign_flip_{unit}"] = out["p_sign_flip_document"]
            out[f"p_data_{unit}"] = out["p_data_document"]
    out.update(_interval_methods(p_seq, t_seq, doc_of_seq if clustered else None, truth[vocab.HAAR], k, d, common))
    out["p_paper_normal_20"] = monte_carlo_pvalue(observed, normal[:20])
    out["p_paper_normal_99"] = monte_carlo_pvalue(observed, normal)
    out["p_paper_haar_20"] = monte_carlo_pvalue(observed, null[:20])
    return [out[c] for c in _COLS]


def _simulated_study(rng, scenario, condition, cfg):
    """One simulated study's data: token gradients of documents of sequences drawn from the
    scenario's population (topics shared within a sequence and a document, per-sequence and
    per-document energy scales, hot documents tilted towards a subspace), reduced to the
    per-sequence proxy and total energies and the tokens' second moment.

    Returns ``(p_seq, t_seq, second, sigma, u, doc_of_seq, clustered)``: ``sigma`` is the
    population second moment (the hot mixture's in the ``hot`` scenario) and ``u`` the proxy."""
    d, k, n_docs = cfg["dim"], cfg["rank"], cfg["n_documents"]
    sigma, u = _population(rng, scenario, condition, d, k)
    ev, vec = np.linalg.eigh(sigma)
    root = (vec * np.sqrt(np.clip(ev, 0, None))) @ vec.T
    clustered = scenario in DOCUMENT_SCENARIOS
    per_doc = 1 + rng.poisson(cfg["sequences_per_document"] - 1, size=n_docs) if clustered else np.ones(n_docs, int)
    doc_of_seq = np.repeat(np.arange(n_docs), per_doc)
    s = doc_of_seq.size
    tmin, tmax = cfg["tokens_per_sequence"]
    length = rng.integers(tmin, tmax + 1, size=s)
    m = cfg["topic_rank"]
    rho_doc = cfg["document_correlation"] if clustered else 0.0
    rho_seq = cfg["within_correlation"]
    doc_topic = rng.standard_normal((n_docs, m, d)) / np.sqrt(m)
    seq_topic = rng.standard_normal((s, m, d)) / np.sqrt(m)
    z = np.sqrt(rho_seq) * (rng.standard_normal((s, tmax, m)) @ seq_topic)
    z += np.sqrt(rho_doc) * (rng.standard_normal((s, tmax, m)) @ doc_topic[doc_of_seq])
    z += np.sqrt(1.0 - rho_doc - rho_seq) * rng.standard_normal((s, tmax, d))
    z *= (np.arange(tmax)[None, :] < length[:, None])[:, :, None]
    scale = np.exp(cfg["scale_sd"] * rng.standard_normal(s))
    if clustered:
        document_sd = {
            "skewed": cfg.get("skewed_document_sd", SKEWED_DOCUMENT_SD),
            "heavy": cfg.get("heavy_document_sd", HEAVY_DOCUMENT_SD),
        }.get(scenario, cfg["scale_sd"])
        scale *= np.exp(document_sd * rng.standard_normal(n_docs))[doc_of_seq]
        scale *= _heavier_document_scale(rng, scenario, n_docs)[doc_of_seq]
    if scenario == "hot":
        tilted = _haar(rng, (), d, k) if condition == RANDOM_PROXY else u
        hot_docs = rng.random(n_docs) < HOT_SHARE  # i.i.d. documents: each hot with probability HOT_SHARE
        (root_hot, sigma_hot), (root_cold, sigma_cold) = (_tilted(sigma, tilted, t) for t in (HOT_TILT, COLD_TILT))
        hot = hot_docs[doc_of_seq]
        scale = scale * np.where(hot, np.sqrt(HOT_ENERGY), 1.0)
        zs = z * scale[:, None, None]
        g = np.where(hot[:, None, None], zs @ root_hot, zs @ root_cold).reshape(-1, d)
        # the population mixture's second moment (HOT_SHARE, not this study's sample share)
        sigma = HOT_ENERGY * HOT_SHARE * sigma_hot + (1.0 - HOT_SHARE) * sigma_cold
    else:
        g = (z * scale[:, None, None]).reshape(-1, d) @ root  # root symmetric
    p_seq = ((g @ u) ** 2).sum(axis=1).reshape(s, tmax).sum(axis=1)
    t_seq = (g * g).sum(axis=1).reshape(s, tmax).sum(axis=1)
    second = g.T @ g
    return p_seq, t_seq, second, sigma, u, doc_of_seq, clustered


def _heavier_document_scale(rng, scenario, n_docs) -> np.ndarray:
    """The documents' gradient scale factors of :data:`HEAVIER_SCENARIOS` (ones otherwise): ``√W``
    with ``W = ν/χ²_ν`` (``t3``), or ``√20`` for a 5 % share of documents (``two_point``)."""
    if scenario == "t3":
        return np.sqrt(T3_DF / rng.chisquare(T3_DF, size=n_docs))
    if scenario == "two_point":
        return np.where(rng.random(n_docs) < TWO_POINT_SHARE, np.sqrt(TWO_POINT_ENERGY), 1.0)
    return np.ones(n_docs)


def _interval_methods(p_seq, t_seq, groups, truth, k, d, common) -> dict:
    """Coverage of the haar energy ratio ``truth`` by every ratio-interval method on the study's
    resampling units (the analysis' resamples, tails expanded as it does), the units' Kish
    ``n_eff`` of their total energies and the ratio's effective size ``m_eff``
    (:func:`~anistat.stats.ratio_intervals.el_effective_size`, what the analysis reports)."""
    sums, n_units = cluster_sums(np.stack([p_seq, k / d * t_seq, t_seq], axis=1), groups)
    weights = bootstrap_weights(n_units, max(common["n_bootstrap"], common["n_test_resamples"]), common["seed"])
    out = {"n_eff": kish_effective_size(sums[:, 2]), "m_eff": el_effective_size(sums[:, 0], sums[:, 1])}
    for method in RATIO_INTERVAL_METHODS:
        bootstrap = method in BOOTSTRAP_RATIO_METHODS
        interval = ratio_interval(
            sums[:, 0],
            sums[:, 1],
            method,
            weights if bootstrap else None,
            common["ci_level"],
            expand_units=n_units if bootstrap else None,
        )
        low, high = interval.ci_low, min(interval.ci_high, d / k)  # the haar ratio's range [0, d/k]
        out[f"cover_method_{method}"] = float(low <= truth <= high)
    return out


def _tilted(sigma, subspace, factor):
    """(symmetric root, matrix) of ``D Σ D`` with ``D = √factor P + (I − P)`` (``P`` the projection
    on ``subspace``), rescaled to the trace of ``Σ``."""
    d = sigma.shape[0]
    projection = subspace @ subspace.T
    tilt = np.sqrt(factor) * projection + (np.eye(d) - projection)
    matrix = tilt @ sigma @ tilt
    matrix *= np.trace(sigma) / np.trace(matrix)
    ev, vec = np.linalg.eigh(matrix)
    return (vec * np.sqrt(np.clip(ev, 0, None))) @ vec.T, matrix


def _haar_from(z):
    q, r = np.linalg.qr(z)
    return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


_COLS = (
    "p_exact",
    "p_exact_sequential",
    "p_paper_normal_20",
    "p_paper_normal_99",
    "p_paper_haar_20",
    "p_data_document",
    "p_data_sequence",
    "p_sign_flip_document",
    "p_sign_flip_sequence",
    "cover_fraction_document",
    "cover_ratio_haar_document",
    "cover_ratio_normal_document",
    "cover_fraction_sequence",
    "cover_ratio_haar_sequence",
    "cover_ratio_normal_sequence",
    *(f"cover_method_{method}" for method in RATIO_INTERVAL_METHODS),
    "n_eff",
    "m_eff",
)


def _run_block(args):
    scenario_index, condition_index, scenario, condition, sims, cfg = args
    out = np.empty((len(sims), len(_COLS)))
    for row, i in enumerate(sims):
        rng = np.random.default_rng(np.random.SeedSequence([cfg["seed"], scenario_index, condition_index, i]))
        out[row] = _simulate_one(rng, scenario, condition, cfg)
    return scenario_index, condition_index, sims, out


def goal_check(value: float, band: tuple[float, float], n: int) -> dict:
    """Whether a simulated rate meets its goal band, judged at the simulation's own precision.

    ``value`` is a rate over ``n`` independent simulated studies (a rejection rate or a
    coverage). Its Monte-Carlo standard error under the goal is ``se = √(c(1 − c)/n)`` at the
    band's centre ``c``, and ``margin = 1.96·se``. Verdicts:

    * ``NOT met`` — the value lies outside the band by more than the margin (the simulation
      excludes the band), or outside it at all when the simulation can resolve the band;
    * ``unresolved`` — the margin is wider than the band's half-width, so the simulation cannot
      tell a rate inside the band from one outside it (``needed``: the fewest simulations that
      can; 20 simulations give ± 0.096 around 0.05, far wider than [0.04, 0.06]);
    * ``met`` — the value is inside the band and the simulation resolves it.

    Returns ``{"value", "low", "high", "n", "se", "margin", "needed", "verdict", "passed"}``
    (``passed`` = met)."""
    low, high = float(band[0]), float(band[1])
    centre, half = (low + high) / 2, (high - low) / 2
    se = float(np.sqrt(centre * (1 - centre) / max(int(n), 1)))
    margin = 1.96 * se
    needed = int(np.ceil(1.96**2 * centre * (1 - centre) / half**2))
    outside = max(low - value, value - high, 0.0) if np.isfinite(value) else np.inf
    if outside > margin:
        verdict = "NOT met"
    elif margin > half:
        verdict = "unresolved"
    else:
        verdict = "met" if outside == 0 else "NOT met"
    return {
        "value": value,
        "low": low,
        "high": high,
        "n": int(n),
        "se": se,
        "margin": margin,
        "needed": needed,
        "verdict": verdict,
        "passed": verdict == "met",
    }


def describe_goal(name: str, check: dict) -> str:
    """One line for a goal check (the `anistat calibrate` output)."""
    band = f"[{check['low']:g}, {check['high']:g}]"
    measured = f"{check['value']:.4f} ± {check['margin']:.4f} at {check['n']} simulated studies"
    if check["verdict"] == "unresolved":
        return (
            f"goal {name}: unresolved ({measured}: this Monte-Carlo error cannot resolve {band}; "
            f"it needs at least {check['needed']})"
        )
    return f"goal {name}: {check['verdict']} ({measured}, goal {band})"


def _rate(x):
    x = np.asarray(x, dtype=float)
    m = float(x.mean())
    return m, float(np.sqrt(m * (1 - m) / x.size))


_P_COLUMNS = tuple(c for c in _COLS if c.startswith("p_"))
_COVER_COLUMNS = tuple(c for c in _COLS if c.startswith("cover_"))


def run_calibration(
    n_simulations: int = 2000,
    seed: int = 0,
    *,
    scenarios=SCENARIOS,
    planted_ratios=(1.0, 1.5, 2.0),
    n_documents: int = 60,
    coverage_documents=(),
    sequences_per_document: float = 4.0,
    dim: int = 24,
    rank: int = 3,
    tokens_per_sequence=(4, 16),
    within_correlation: float = 0.3,
    document_correlation: float = 0.3,
    topic_rank: int = 2,
    scale_sd: float = 0.25,
    skewed_document_sd: float = SKEWED_DOCUMENT_SD,
    heavy_document_sd: float = HEAVY_DOCUMENT_SD,
    n_null: int = 999,
    stop_after: int = 10,
    n_bootstrap: int = 1000,
    n_test_resamples: int = 999,
    alpha: float = 0.05,
    ci_level: float = 0.95,
    ci_method: str = vocab.DEFAULT_CI_METHOD,
    n_jobs: int = 1,
    keep_simulations: bool = False,
    n_permutations: int | None = None,
) -> CalibrationResult:
    """Run the calibration study (see the module docstring). Deterministic given ``seed``.

    Parameters
    ----------
    n_simulations : int, default 2000
        Simulated studies per (scenario, condition), at least 1.
    seed : int, default 0
        Seed of the whole study.
    scenarios : sequence of {"isotropic", "anisotropic", "clustered", "skewed", "heavy", "hot"}
        The scenarios run (default: all of :data:`SCENARIOS`).
    planted_ratios : sequence of float, default (1.0, 1.5, 2.0)
        The planted population ratios ``ρ``, each in ``(0, dim/rank)``; the ``random`` condition
        is always run.
    n_documents : int, default 60
        Documents per simulated study; the goals are judged at this size.
    coverage_documents : sequence of int, default ()
        Other study sizes (e.g. ``(30, 200)``) run the same way and reported beside them.
    sequences_per_document : float, default 4.0
        Mean sequences per document in the document scenarios (``1 + Poisson(mean − 1)``).
    dim : int, default 24
        The dimension ``d`` of the gradients.
    rank : int, default 3
        The rank ``k`` of the proxy (``2 k <= d``, for the normal controls).
    tokens_per_sequence : tuple of (int, int), default (4, 16)
        The least and most tokens of a sequence (uniform).
    within_correlation : float, default 0.3
        ``ρ_s``, the energy share of a sequence's own rank-``topic_rank`` topic.
    document_correlation : float, default 0.3
        ``ρ_d``, the energy share of the document's shared topic (document scenarios only).
    topic_rank : int, default 2
        The rank ``m`` of the topic subspaces.
    scale_sd : float, default 0.25
        Log-scale SD of the per-sequence (and, in ``clustered`` and ``hot``, per-document)
        gradient scale.
    skewed_document_sd : float, default SKEWED_DOCUMENT_SD
        Log-scale SD of the per-document gradient scale in the ``skewed`` scenario.
    heavy_document_sd : float, default HEAVY_DOCUMENT_SD
        Log-scale SD of the per-document gradient scale in the ``heavy`` scenario.
    n_null : int, default 999
        Haar draws of the exact Monte-Carlo test.
    stop_after : int, default 10
        Exceedances that stop the sequential exact test (:class:`SequentialMonteCarlo`).
    n_bootstrap : int, default 1000
        Bootstrap resamples of the confidence intervals.
    n_test_resamples : int, default 999
        Resamples of the data test and of the sign-flip test beside it.
    alpha : float, default 0.05
        The level of the rejection rates.
    ci_level : float, default 0.95
        The intervals' nominal coverage.
    ci_method : str, default "adjusted_el_f"
        The analysis' interval method (one of the energy analysis' ``CI_METHODS``; the default is
        the analysis' default).
    n_jobs : int, default 1
        Processes; ``n_jobs > 1`` spreads simulations over processes with identical results.
    keep_simulations : bool, default False
        Keep the per-simulation columns in :attr:`CalibrationResult.simulations`.
    n_permutations : int, optional
        The earlier name of ``n_test_resamples`` (overrides it when given).

    Returns
    -------
    CalibrationResult
        The settings, the per-condition rates and coverages, and the goal checks.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> result = stats.run_calibration(2, seed=0, scenarios=('isotropic',), planted_ratios=(1.0,), n_documents=12, dim=8, rank=2, n_bootstrap=50, n_null=19, n_test_resamples=49)
    >>> sorted(result.settings)[:3]
    ['alpha', 'ci_level', 'ci_method']
    """
    scenarios = tuple(scenarios)
    if not scenarios or any(s not in SCENARIOS + HEAVIER_SCENARIOS for s in scenarios):
        raise ValueError(f"scenarios must be among {SCENARIOS + HEAVIER_SCENARIOS}, got {scenarios}")
    planted_ratios = tuple(float(x) for x in planted_ratios)
    if any(pr * rank >= dim or pr <= 0 for pr in planted_ratios):
        raise ValueError(f"planted ratios must be in (0, dim/rank) = (0, {dim / rank:g})")
    if int(n_simulations) < 1:
        raise ValueError("n_simulations must be >= 1")
    check_choice("ci_method", ci_method, CI_METHODS)
    if not 2 * rank <= dim:
        raise ValueError("normal controls need 2 rank <= dim")
    sizes = [int(n_documents)] + [int(n) for n in coverage_documents if int(n) != int(n_documents)]
    cfg = dict(
        n_simulations=int(n_simulations),
        seed=int(seed),
        scenarios=list(scenarios),
        planted_ratios=list(planted_ratios),
        n_documents=int(n_documents),
        coverage_documents=sizes[1:],
        sequences_per_document=float(sequences_per_document),
        dim=int(dim),
        rank=int(rank),
        tokens_per_sequence=[int(x) for x in tokens_per_sequence],
        within_correlation=float(within_correlation),
        document_correlation=float(document_correlation),
        topic_rank=int(topic_rank),
        scale_sd=float(scale_sd),
        skewed_document_sd=float(skewed_document_sd),
        heavy_document_sd=float(heavy_document_sd),
        n_null=int(n_null),
        stop_after=int(stop_after),
        n_bootstrap=int(n_bootstrap),
        n_test_resamples=int(n_permutations or n_test_resamples),
        alpha=float(alpha),
        ci_level=float(ci_level),
        ci_method=ci_method,
    )
    t0 = time.perf_counter()
    results = {size: _simulate_all({**cfg, "n_documents": size}, scenarios, n_jobs) for size in sizes}
    rows, checks = _summarise(results, cfg, scenarios)
    return CalibrationResult(
        settings=cfg,
        conditions=tuple(rows),
        checks=checks,
        elapsed_s=float(time.perf_counter() - t0),
        simulations=_kept_simulations(results[sizes[0]], scenarios, cfg) if keep_simulations else {},
        concentration=tuple(concentration_rows(list(results.values()), _conditions(cfg), float(alpha))),
        spread=tuple(spread_rows(results, _conditions(cfg), float(alpha))),
    )


def _kept_simulations(table: np.ndarray, scenarios, cfg) -> dict:
    """``"scenario/condition"`` -> the per-simulation columns of one study size."""
    return {
        f"{scenario}/{condition}": dict(zip(_COLS, table[si, ci].T))
        for si, scenario in enumerate(scenarios)
        for ci, condition in enumerate(_conditions(cfg))
    }


def concentration_rows(tables, conditions, alpha: float) -> list[dict]:
    """Coverage and the data test's level by the energy ratio's effective number of documents.

    Every simulated study (of every scenario, condition and size in ``tables``) falls in the
    level ``[EFFECTIVE_SIZE_EDGES[i], EFFECTIVE_SIZE_EDGES[i + 1])`` of its ``m_eff`` (the haar
    ratio's :func:`~anistat.stats.ratio_intervals.el_effective_size`: the smaller of Kish's
    ``n_eff`` of the denominators and the estimating function's tail-weight size); per level:
    the studies, each ratio-interval method's coverage (``coverage_<method>``, ``_se`` its
    binomial SE) and, from the studies at a planted ratio of 1 (the data test's null), its
    rejection rate at ``alpha``.

    Parameters
    ----------
    tables : sequence of ndarray
        ``(scenario, condition, simulation, column)`` arrays of :data:`_COLS` columns.
    conditions : sequence
        The conditions of the tables' second axis.
    alpha : float
        The data test's level.

    Returns
    -------
    list of dict
        One row per level with any study (``m_eff_low``, ``m_eff_high``, ``studies``, …).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat.stats import calibrate
    >>> table = np.zeros((1, 1, 4, len(calibrate._COLS)))
    >>> table[..., calibrate._COLS.index("m_eff")] = [3.0, 5.5, 6.0, 50.0]
    >>> [r["studies"] for r in calibrate.concentration_rows([table], (1.0,), 0.05)]
    [1, 2, 1]
    """
    size_at, p_at = _COLS.index("m_eff"), _COLS.index("p_data_document")
    flat = np.concatenate([t.reshape(-1, len(_COLS)) for t in tables])
    null = np.concatenate(
        [np.broadcast_to(np.array([c == 1.0 for c in conditions])[None, :, None], t.shape[:3]).ravel() for t in tables]
    )
    edges = np.array([*EFFECTIVE_SIZE_EDGES, np.inf])
    rows = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        inside = (flat[:, size_at] >= low) & (flat[:, size_at] < high)
        if not inside.any():
            continue
        row = {"m_eff_low": float(low), "m_eff_high": float(high), "studies": int(inside.sum())}
        for method in RATIO_INTERVAL_METHODS:
            values = flat[inside, _COLS.index(f"cover_method_{method}")]
            row[f"coverage_{method}"], row[f"coverage_{method}_se"] = _rate(values)
        tested = inside & null
        row["data_test_studies"] = int(tested.sum())
        row["rejection_data"], row["rejection_data_se"] = (
            _rate(flat[tested, p_at] <= alpha) if tested.any() else (np.nan, np.nan)
        )
        rows.append(row)
    return rows


def spread_rows(tables: dict, conditions, alpha: float) -> list[dict]:
    """The data test's level by the documents' energy spread ``n/n_eff``.

    ``n/n_eff = n Σ T_u² / (Σ T_u)² = 1 + cv_t²`` (``cv_t`` the CV of the ``n`` documents' total
    energies ``T_u``, with the ``1/n`` variance) measures how heavy-tailed the document energies
    are, whatever the study's size; the bootstrap-t's level error under skewed documents follows
    it rather than the effective count (``benchmarks/README.md``). Every study at a planted ratio
    of 1 falls in the level ``[SPREAD_EDGES[i], SPREAD_EDGES[i + 1])`` of its spread; per level
    the studies and the rejection rate at ``alpha`` with its binomial SE.

    Parameters
    ----------
    tables : dict
        Study size ``n`` -> its table, as one of :func:`concentration_rows`' ``tables``.
    conditions, alpha
        As in :func:`concentration_rows`.

    Returns
    -------
    list of dict
        One row per level with any study (``spread_low``, ``spread_high``, ``studies``,
        ``rejection_data``, ``rejection_data_se``).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat.stats import calibrate
    >>> table = np.zeros((1, 1, 3, len(calibrate._COLS)))
    >>> table[..., calibrate._COLS.index("n_eff")] = [30.0, 10.0, 2.0]  # spreads 1, 3 and 15
    >>> [r["spread_low"] for r in calibrate.spread_rows({30: table}, (1.0,), 0.05)]
    [1.0, 3.0, 12.0]
    """
    n_eff_at, p_at = _COLS.index("n_eff"), _COLS.index("p_data_document")
    null = np.array([c == 1.0 for c in conditions])
    spread = np.concatenate([size / table[:, null, :, n_eff_at].ravel() for size, table in tables.items()])
    rejected = np.concatenate([table[:, null, :, p_at].ravel() <= alpha for table in tables.values()])
    edges = np.array([*SPREAD_EDGES, np.inf])
    rows = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        inside = (spread >= low) & (spread < high)
        if inside.any():
            rate, se = _rate(rejected[inside])
            rows.append(
                {
                    "spread_low": float(low),
                    "spread_high": float(high),
                    "studies": int(inside.sum()),
                    "rejection_data": rate,
                    "rejection_data_se": se,
                }
            )
    return rows


def _conditions(cfg) -> tuple:
    return (RANDOM_PROXY,) + tuple(cfg["planted_ratios"])


def _simulate_all(cfg, scenarios, n_jobs) -> np.ndarray:
    """``(scenario, condition, simulation, column)`` results at ``cfg["n_documents"]``."""
    n_simulations, conditions, block = cfg["n_simulations"], _conditions(cfg), 50
    tasks = [
        (si, ci, scenario, condition, list(range(a, min(a + block, n_simulations))), cfg)
        for si, scenario in enumerate(scenarios)
        for ci, condition in enumerate(conditions)
        for a in range(0, n_simulations, block)
    ]
    results = np.empty((len(scenarios), len(conditions), n_simulations, len(_COLS)))
    if n_jobs > 1:
        with ProcessPoolExecutor(max_workers=int(n_jobs)) as pool:
            for si, ci, sims, out in pool.map(_run_block, tasks):
                results[si, ci, sims] = out
    else:
        for task in tasks:
            si, ci, sims, out = _run_block(task)
            results[si, ci, sims] = out
    return results


def _summarise(results: dict, cfg, scenarios) -> tuple[list[dict], dict]:
    """One row per (documents, scenario, condition); the goal checks at the main size."""
    rows, checks = [], {}
    n_simulations, alpha, main = cfg["n_simulations"], cfg["alpha"], cfg["n_documents"]
    for size, table in results.items():
        for si, scenario in enumerate(scenarios):
            for ci, condition in enumerate(_conditions(cfg)):
                r = dict(zip(_COLS, table[si, ci].T))
                row = {
                    "documents": size,
                    "scenario": scenario,
                    "condition": str(condition),
                    "n_simulations": int(n_simulations),
                }
                for name in _P_COLUMNS:
                    row[f"rejection_{name[2:]}"], row[f"rejection_{name[2:]}_se"] = _rate(r[name] <= alpha)
                for name in _COVER_COLUMNS:
                    row[f"coverage_{name[6:]}"], row[f"coverage_{name[6:]}_se"] = _rate(r[name])
                row["n_eff_median"] = float(np.median(r["n_eff"]))
                row["m_eff_median"] = float(np.median(r["m_eff"]))
                rows.append(row)
                if size != main:
                    continue
                if condition == RANDOM_PROXY:
                    for column, label in (
                        ("rejection_exact", "the exact test (all draws)"),
                        ("rejection_exact_sequential", "the exact test (sequential)"),
                    ):
                        checks[f"{scenario}: type-I error of {label}"] = goal_check(
                            row[column], GOALS["type1"], n_simulations
                        )
                if condition == 1.0:
                    checks[f"{scenario}: type-I error of the data test"] = goal_check(
                        row["rejection_data_document"], GOALS["type1"], n_simulations
                    )
            cover = [row for row in rows if row["scenario"] == scenario and row["documents"] == main]
            for name, label in (
                ("coverage_fraction_document", "energy fraction"),
                ("coverage_ratio_haar_document", "energy ratio (haar)"),
                ("coverage_ratio_normal_document", "energy ratio (normal)"),
            ):
                if size != main:
                    continue
                # the mean coverage over the scenario's conditions: len(cover) × n_simulations studies
                checks[f"{scenario}: {cfg['ci_level']:.0%} CI coverage, {label}"] = goal_check(
                    float(np.mean([c[name] for c in cover])), GOALS["coverage"], len(cover) * n_simulations
                )
    return rows, checks


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return None if not np.isfinite(obj) else float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj
