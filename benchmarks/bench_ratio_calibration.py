"""Fast sweep of empirical-likelihood calibrations of the energy-ratio interval over every scenario.

The energy ratio's EL interval is ``{θ : −2 ln R(θ) ≤ c}``, so it covers the true ratio ``θ₀``
exactly when ``−2 ln R(θ₀) ≤ c``: one statistic per study and adjustment, no interval search,
no Haar draws, no bootstrap. Each simulated study is drawn by ``anistat calibrate``'s own generator
(:func:`anistat.stats.calibrate._simulated_study`, the same laws, d = 24, k = 3), reduced to the
per-document sums ``p_u`` (proxy energy) and ``e_u = (k/d)·T_u`` (the haar reference), with the
population haar ratio ``θ₀ = E_pop/(k/d)`` as the truth. The random proxy and a planted ratio of
1, ``--studies`` each, per scenario and study size (a cell: ``2·studies`` studies).

Candidates = adjustment × critical value:

* adjustments: ``el`` (none), ``adjusted`` (Chen et al. 2008), ``balanced`` (Emerson & Owen 2009,
  ``s = 1.9``);
* critical values at 95 %: ``chi2`` (``χ²₁``, Wilks); ``bartlett`` (``χ²₁·(1 + â/n)``, the
  empirical Bartlett correction, ``â = μ₄/(2μ₂²) − μ₃²/(3μ₂³)`` of ``z = p − θ̂e``, DiCiccio, Hall &
  Romano 1991); and ``F(1, m − 1)`` (Owen 2001 §3.5's F calibration) with ``m`` = ``F_n``: ``n``;
  ``F_neff``: Kish's size of the denominators ``n_eff = (Σe)²/Σe²``; ``F_neff_pe``: the smaller
  of the Kish sizes of the denominators and the numerators; ``F_kurt``: the tail-weight size
  ``n_z = min(n, 3(Σz²)²/Σz⁴)``; ``F_m``: ``min(n_eff, n_z)``
  (:func:`anistat.stats.el_effective_size`, the shipped ``adjusted_el_f`` with ``adjusted``).

An earlier sweep also tried the balanced pseudo-units at the scale ``1.9·√(n/n_eff)`` (the
augmentation set from the concentration): 0.995–1.000 in ``skewed`` and ``heavy`` at 30 and 60
documents, so it is not among the candidates.

Usage: ``python benchmarks/bench_ratio_calibration.py [--studies 500] [--out /tmp/cal.npz]``
(one process, one thread; about 2–3 minutes at 500). ``--check N``: also compute the real
``balanced_el`` and ``adjusted_el_f`` intervals (:func:`anistat.stats.ratio_interval`) on the
first ``N`` studies of each condition and count the studies where the fast rule
(``stat(θ₀) ≤ c``) and the interval disagree.
"""

from __future__ import annotations

import argparse
import inspect
import time

import numpy as np
from scipy.stats import chi2, f

from anistat.stats import calibrate
from anistat.stats.energy import cluster_sums
from anistat.stats.ratio_intervals import (
    el_critical_value,
    el_effective_size,
    kish_effective_size,
    ratio_el_statistic,
    ratio_interval,
)

ADJUSTMENTS = ("el", "adjusted", "balanced")
CALIBRATIONS = ("chi2", "bartlett", "F_n", "F_neff", "F_neff_pe", "F_kurt", "F_m")
_ADJUSTMENT = {"el": "none", "adjusted": "adjusted", "balanced": "balanced"}
#: The per-study columns of :func:`_study`.
COLUMNS = (
    "n",
    "n_eff",
    "n_eff_numerator",
    "n_z",
    "bartlett",
    "m",
    *(f"stat_{a}" for a in ADJUSTMENTS),
    "interval_balanced_el",
    "interval_adjusted_el_f",
)


def bartlett_coefficient(z: np.ndarray) -> float:
    """The empirical Bartlett coefficient ``a = μ₄/(2μ₂²) − μ₃²/(3μ₂³)`` of ``z`` (DiCiccio, Hall
    & Romano 1991: ``E[−2 ln R] = 1 + a/n + O(n⁻²)`` for a mean)."""
    m2, m3, m4 = (float(np.mean(z**j)) for j in (2, 3, 4))
    return m4 / (2 * m2**2) - m3**2 / (3 * m2**3) if m2 > 0 else 0.0


def critical_value(calibration: str, row: dict, level: float = 0.95) -> float:
    """The critical value of one calibration for one study's row (``inf`` where ``m ≤ 1``)."""
    if calibration == "chi2":
        return float(chi2.ppf(level, 1))
    if calibration == "bartlett":
        return float(chi2.ppf(level, 1)) * (1.0 + row["bartlett"] / row["n"])
    if calibration == "F_m":
        return el_critical_value(level, "f_effective", row["m"])
    size = {
        "F_n": row["n"],
        "F_neff": row["n_eff"],
        "F_neff_pe": min(row["n_eff"], row["n_eff_numerator"]),
        "F_kurt": row["n_z"],
    }[calibration]
    return float(f.ppf(level, 1, size - 1.0)) if size > 1.0 else float("inf")


def _covers(p: np.ndarray, e: np.ndarray, method: str, truth: float, cap: float) -> float:
    interval = ratio_interval(p, e, method)
    return float(interval.ci_low <= truth <= min(interval.ci_high, cap))


def _study(rng: np.random.Generator, scenario: str, condition: str, cfg: dict, check: bool) -> list[float]:
    """One study's :data:`COLUMNS` (the real intervals' coverage NaN unless ``check``)."""
    p_seq, t_seq, _, sigma, u, doc_of_seq, clustered = calibrate._simulated_study(rng, scenario, condition, cfg)
    k, d = cfg["rank"], cfg["dim"]
    truth = float(np.trace(u.T @ sigma @ u) / np.trace(sigma)) / (k / d)
    sums, n = cluster_sums(np.stack([p_seq, k / d * t_seq], axis=1), doc_of_seq if clustered else None)
    p, e = sums[:, 0], sums[:, 1]
    z = p - p.sum() / e.sum() * e
    n_z = min(float(n), 3.0 * float(np.sum(z**2)) ** 2 / float(np.sum(z**4)))
    stats = [ratio_el_statistic(p, e, truth, _ADJUSTMENT[a]) for a in ADJUSTMENTS]
    real = [_covers(p, e, m, truth, d / k) if check else np.nan for m in ("balanced_el", "adjusted_el_f")]
    sizes = [kish_effective_size(e), kish_effective_size(p), n_z]
    return [float(n), *sizes, bartlett_coefficient(z), el_effective_size(p, e), *stats, *real]


def simulate(studies: int, sizes: tuple[int, ...], seed: int, check: int) -> dict[tuple[str, int], np.ndarray]:
    """``(scenario, documents)`` -> ``(2·studies, len(COLUMNS))``: the random proxy's studies,
    then those at a planted ratio of 1."""
    defaults = inspect.signature(calibrate.run_calibration).parameters
    cfg = {name: p.default for name, p in defaults.items() if p.default is not inspect.Parameter.empty}
    out = {}
    for si, scenario in enumerate(calibrate.SCENARIOS):
        for size in sizes:
            cell_cfg = {**cfg, "n_documents": size}
            rows = []
            for ci, condition in enumerate((calibrate.RANDOM_PROXY, "1.0")):
                for i in range(studies):
                    rng = np.random.default_rng(np.random.SeedSequence([seed, si, ci, size, i]))
                    rows.append(_study(rng, scenario, condition, cell_cfg, i < check))
            out[(scenario, size)] = np.array(rows)
    return out


def coverage(rows: np.ndarray, adjustment: str, calibration: str) -> np.ndarray:
    """Per-study coverage of one candidate: ``stat(θ₀) ≤ c``."""
    stat = rows[:, COLUMNS.index(f"stat_{adjustment}")]
    crit = np.array([critical_value(calibration, dict(zip(COLUMNS, row, strict=True))) for row in rows])
    return (stat <= crit).astype(float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=500, help="studies per scenario, size and condition")
    parser.add_argument("--documents", type=int, nargs="+", default=[30, 60, 200])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", type=int, default=0, help="studies per cell checked against the real interval")
    parser.add_argument("--out", default=None, help="save the per-study rows (npz)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    cells = simulate(args.studies, tuple(args.documents), args.seed, args.check)
    print(f"{args.studies} studies per scenario, size and condition; {time.perf_counter() - t0:.0f} s")
    candidates = [(a, c) for a in ADJUSTMENTS for c in CALIBRATIONS]
    print("scenario | documents | median n_eff | " + " | ".join(f"{a}/{c}" for a, c in candidates))
    inside = dict.fromkeys(candidates, 0)
    for (scenario, size), rows in cells.items():
        values = [float(coverage(rows, a, c).mean()) for a, c in candidates]
        for candidate, value in zip(candidates, values, strict=True):
            inside[candidate] += int(size != min(args.documents) and 0.93 <= value <= 0.97)
        print(" | ".join([scenario, str(size), f"{np.median(rows[:, 1]):.1f}", *(f"{v:.3f}" for v in values)]))
    print("cells in [0.93, 0.97] at the larger sizes: " + ", ".join(f"{a}/{c} {n}" for (a, c), n in inside.items()))
    if args.check:
        for method, (adjustment, calibration) in (
            ("balanced_el", ("balanced", "chi2")),
            ("adjusted_el_f", ("adjusted", "F_m")),
        ):
            real = np.concatenate([r[:, COLUMNS.index(f"interval_{method}")] for r in cells.values()])
            fast = np.concatenate([coverage(r, adjustment, calibration) for r in cells.values()])
            checked = np.isfinite(real)
            disagree = int(np.sum(real[checked] != fast[checked]))
            print(f"{method}: the interval and stat(θ₀) ≤ c disagree in {disagree} of {int(checked.sum())} studies")
    if args.out:
        np.savez(args.out, **{f"{s}_{n}": rows for (s, n), rows in cells.items()})


if __name__ == "__main__":
    main()
