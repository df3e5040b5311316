"""Why does a planned half-width miss? τ, the interval's effective size and log R̂'s real spread.

At one cell (``--scenario``, planted ``--ratio``, ``--documents`` n) of ``bench_plan.py``'s
half-width check: (1) the law's relative SD ``τ = SD(p/μ_p − t/μ_t)`` from ``--law-studies``
further studies of ``--law-documents`` documents (the benchmark plans with one); (2) over
``--studies`` studies of n documents, ``√n · SD(log R̂)`` (what ``τ`` promises, delta method) with
its SE ``√n · SD/√(2(S − 1))``, and the means of the F-calibrated EL interval's effective size
``m = min(n_eff, n_z)`` (:func:`anistat.stats.el_effective_size`), Kish's ``n_eff`` of the totals
and the tail-weight size ``n_z = 3(Σz²)²/Σz⁴`` of ``z = p − θ̂ t``; (3) the plan's simulated
half-width (:func:`anistat.stats.power.small_sample_half_width`, the law's ``cv_t``) at each ``τ``.

Usage (from the repository root, ``PYTHONPATH=$PWD``):
``nice -n 10 python benchmarks/diag_plan_width.py [--scenario anisotropic --ratio 1.1 --documents 98]``
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from anistat import plan
from anistat.stats import el_effective_size, kish_effective_size, power
from anistat.stats.calibrate import _simulated_study
from benchmarks.bench_plan import config, document_sums


def documents(seed, scenario: str, ratio: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(proxy, total) document energies of one seeded study of the calibration law."""
    rng = np.random.default_rng(seed)
    p_seq, t_seq, _, _, _, doc_of_seq, clustered = _simulated_study(rng, scenario, ratio, config(n))
    return document_sums(p_seq, t_seq, doc_of_seq, clustered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="anisotropic")
    parser.add_argument("--ratio", type=float, default=1.1)
    parser.add_argument("--documents", type=int, default=98)
    parser.add_argument("--studies", type=int, default=400)
    parser.add_argument("--law-documents", type=int, default=4000)
    parser.add_argument("--law-studies", type=int, default=3)
    args = parser.parse_args()
    taus, cvs = [], []
    for seed in range(args.law_studies):
        p, t = documents(100 + seed, args.scenario, args.ratio, args.law_documents)
        taus.append(float(np.std(p / p.mean() - t / t.mean(), ddof=1)))
        cvs.append(math.sqrt(max(t.size / kish_effective_size(t) - 1.0, 0.0)))
    n = args.documents
    logs, m, kish, n_z = [], [], [], []
    for i in range(args.studies):
        p, t = documents(np.random.SeedSequence([9, n, i]), args.scenario, args.ratio, n)
        logs.append(math.log(p.sum() / t.sum()))
        z = p - p.sum() / t.sum() * t
        m.append(el_effective_size(p, t))
        kish.append(kish_effective_size(t))
        n_z.append(3.0 * float(z @ z) ** 2 / float((z**4).sum()))
    spread = float(np.std(logs, ddof=1)) * math.sqrt(n)
    print(f"{args.scenario} R = {args.ratio:g}, n = {n}, {args.studies} studies")
    print("tau per law study:", ", ".join(f"{v:.3f}" for v in taus), "; cv_t:", ", ".join(f"{v:.3f}" for v in cvs))
    print(f"sqrt(n) SD(log R_hat) = {spread:.3f} ± {spread / math.sqrt(2 * (args.studies - 1)):.3f}")
    print(f"mean m = {np.mean(m):.1f}, Kish n_eff = {np.mean(kish):.1f}, n_z = {np.mean(n_z):.1f}")
    cv_t = float(np.mean(cvs))
    for tau in (*taus, spread):
        width = power.small_sample_half_width(n, tau, args.ratio, 0.95, plan.DEFAULT_CI_METHOD, cv_t)
        print(f"plan's half-width at tau = {tau:.3f}, cv_t = {cv_t:.3f}: {width:.4f}")


if __name__ == "__main__":
    main()
