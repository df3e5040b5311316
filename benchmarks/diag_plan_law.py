"""Which per-document law reproduces the data test's power in a calibration law?

At one cell (``--scenario``, planted ``--ratio``, ``--documents``) the real data test
(:func:`anistat.stats.studentized_ratio_test` with the small-sample expansion, over the plan's
bootstrap resamples, at ``α/m = --threshold``) is run on ``--studies`` simulated studies drawn
from (a) the calibration law itself, (b) normal documents with the law's relative SD ``τ`` (what
the plan assumed before), (a') documents resampled from one large study of the law (is the
per-document law the cause?), and (c1–c7) laws built only from what a pilot bundle gives (``τ``
and the Kish ``n_eff`` of the total energies, ``n/n_eff = 1 + cv_t²``; the stated inputs' ``cv_p``
and ``ρ`` for the correlated-gamma pair c4). The law's summaries come from one
``--law-documents`` study. (c7) is the plan's law (:func:`anistat.stats.power.document_law`).

Usage (from the repository root, ``PYTHONPATH=$PWD``):
``nice -n 10 python benchmarks/diag_plan_law.py [--scenario anisotropic --ratio 1.25 --documents 50]``
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from anistat.stats import bootstrap_weights, studentized_ratio_test
from anistat.stats.calibrate import _simulated_study
from anistat.stats.power import data_test_resamples
from benchmarks.bench_plan import RANK, config, document_sums

DIM = 32
KD = RANK / DIM


def true_documents(rng, scenario: str, ratio: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(proxy, total) document energies of one study of the calibration law."""
    p_seq, t_seq, _, _, _, doc_of_seq, clustered = _simulated_study(rng, scenario, ratio, config(n))
    return document_sums(p_seq, t_seq, doc_of_seq, clustered)


def summaries(p: np.ndarray, t: np.ndarray) -> dict:
    """τ, cv_p, cv_t, ρ, n/n_eff, and the skewness of the linearised residual."""
    r = p / p.mean() - t / t.mean()
    cv_p, cv_t = p.std(ddof=1) / p.mean(), t.std(ddof=1) / t.mean()
    rho = float(np.corrcoef(p, t)[0, 1])
    n_over_neff = t.size * (t**2).sum() / t.sum() ** 2
    skew = float(((r - r.mean()) ** 3).mean() / r.std() ** 3)
    return dict(tau=float(r.std(ddof=1)), cv_p=cv_p, cv_t=cv_t, rho=rho, n_over_neff=n_over_neff, skew_r=skew)


def power(draw, n: int, studies: int, threshold: float, seed: int) -> tuple[float, float]:
    """Rejection rate of the real data test at ``threshold`` over ``studies`` draws of ``draw(rng, n)``."""
    resamples = data_test_resamples(threshold, n)
    hits = []
    for i in range(studies):
        rng = np.random.default_rng(np.random.SeedSequence([seed, n, i]))
        p, t = draw(rng, n)
        weights = bootstrap_weights(n, resamples, seed=i)
        test = studentized_ratio_test(p, KD * t, weights, expand_units=n)
        hits.append(test.p_value <= threshold)
    rate = float(np.mean(hits))
    return rate, 1.96 * math.sqrt(rate * (1 - rate) / studies)


def laws(stats: dict, ratio: float) -> dict:
    """The candidate laws: name -> draw(rng, n) giving (p, t) with the population ratio ``ratio``."""
    tau, cv_t = stats["tau"], stats["cv_t"]
    f = ratio * KD
    sigma2 = math.log(stats["n_over_neff"])  # lognormal scale with the pilot's n/n_eff
    c_f = tau / math.sqrt(1.0 + cv_t**2)  # the proxy share's CV that gives τ under that scale

    def normal(rng, n):
        return f * (1.0 + tau * rng.standard_normal(n)), np.ones(n)

    def lognormal_normal(rng, n):
        s = np.exp(math.sqrt(sigma2) * rng.standard_normal(n) - sigma2 / 2)
        c = tau / math.sqrt(math.exp(sigma2))
        return s * f * (1.0 + c * rng.standard_normal(n)), s

    def lognormal_gamma(rng, n):
        s = np.exp(math.sqrt(sigma2) * rng.standard_normal(n) - sigma2 / 2)
        c = tau / math.sqrt(math.exp(sigma2))
        return s * f * rng.gamma(1 / c**2, c**2, n), s

    def gamma_gamma(rng, n):
        s = rng.gamma(1 / cv_t**2, cv_t**2, n)
        return s * f * rng.gamma(1 / c_f**2, c_f**2, n), s

    def gamma_pair(rng, n):
        # p = X0 + X1, t = (X0 + X2)/f: shared Gamma(a0), so cov = a0 θ², matched to cv_p, cv_t, ρ
        cv_p, rho = stats["cv_p"], stats["rho"]
        a_p, a_t = 1 / cv_p**2, 1 / cv_t**2  # total shapes (unit scale: means a_p, a_t)
        # scale t's components to p's mean: corr = a0 / sqrt(a_p a_t) for a common scale
        a0 = min(rho * math.sqrt(a_p * a_t), a_p, a_t) * 0.999
        x0 = rng.gamma(a0, 1.0, n)
        p = x0 + rng.gamma(a_p - a0, 1.0, n)
        t = x0 + rng.gamma(a_t - a0, 1.0, n)
        return f * p / a_p, t / a_t

    def scale_lognormal_complement(rng, n):
        k_ = tau**2 / (1.0 - f) ** 2
        one_s2 = max(1.0 + cv_t**2 - tau**2, 1.0)
        y2 = math.log(1.0 + k_ / one_s2)
        s2 = math.log(one_s2)
        s = np.exp(math.sqrt(s2) * rng.standard_normal(n) - s2 / 2)
        b = (1 - f) * np.exp(math.sqrt(y2) * rng.standard_normal(n) - y2 / 2)
        return s * f, s * (f + b)

    def scale_parts(rng, n, equal):
        # p = S A, t = S (A + B): A, B independent gammas (proxy and complement energy), S lognormal
        k_ = tau**2 / (1.0 - f) ** 2
        if equal:  # cv_A = cv_B = v
            one_s2 = max(1.0 + cv_t**2 - (f**2 + (1 - f) ** 2) * k_ / 2, 1.0)
            x = y = k_ / 2 / one_s2
        else:  # A constant: all of the share's noise in the complement
            one_s2 = max(1.0 + cv_t**2 - tau**2, 1.0)
            x, y = 0.0, k_ / one_s2
        s2 = math.log(one_s2)
        s = np.exp(math.sqrt(s2) * rng.standard_normal(n) - s2 / 2)
        a = f * (rng.gamma(1 / x, x, n) if x > 0 else np.ones(n))
        b = (1 - f) * rng.gamma(1 / y, y, n)
        return s * a, s * (a + b)

    return {
        "(c5) lognormal scale x (gamma proxy + gamma complement), equal CVs": lambda r, n: scale_parts(r, n, True),
        "(c6) lognormal scale x (constant proxy + gamma complement)": lambda r, n: scale_parts(r, n, False),
        "(c7) lognormal scale x (constant proxy + lognormal complement)": scale_lognormal_complement,
        "(b) normal, same tau": normal,
        "(c1) lognormal scale x normal share": lognormal_normal,
        "(c2) lognormal scale x gamma share": lognormal_gamma,
        "(c3) gamma scale x gamma share": gamma_gamma,
        "(c4) correlated gamma pair (cv_p, cv_t, rho)": gamma_pair,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="anisotropic")
    parser.add_argument("--ratio", type=float, default=1.25)
    parser.add_argument("--documents", type=int, default=50)
    parser.add_argument("--studies", type=int, default=500)
    parser.add_argument("--threshold", type=float, default=0.005)
    parser.add_argument("--law-documents", type=int, default=4000)
    parser.add_argument("--tau-draws", type=int, default=0, help="only print τ̂ of this many --law-documents studies")
    args = parser.parse_args()
    if args.tau_draws:
        taus = []
        for i in range(args.tau_draws):
            rng = np.random.default_rng(np.random.SeedSequence([77, i]))
            taus.append(summaries(*true_documents(rng, args.scenario, args.ratio, args.law_documents))["tau"])
        print(
            f"{args.scenario}, R = {args.ratio}: tau_hat of {args.tau_draws} studies of {args.law_documents} documents"
        )
        print(np.round(taus, 3), f"mean {np.mean(taus):.3f}")
        return
    p, t = true_documents(np.random.default_rng(1), args.scenario, args.ratio, args.law_documents)
    stats = summaries(p, t)
    print(f"{args.scenario}, R = {args.ratio}, n = {args.documents}, threshold {args.threshold}: ")
    print("law summaries: " + ", ".join(f"{k} {v:.3f}" for k, v in stats.items()))

    def truth(rng, n):
        return true_documents(rng, args.scenario, args.ratio, n)

    def pool(rng, n):
        pick = rng.integers(0, p.size, n)
        return p[pick], t[pick]

    candidates = {
        "(a) the calibration law": truth,
        "(a') documents resampled from the law's large study": pool,
        **laws(stats, args.ratio),
    }
    for name, draw in candidates.items():
        rate, margin = power(draw, args.documents, args.studies, args.threshold, seed=29)
        big = draw(np.random.default_rng(2), args.law_documents)
        s = summaries(*big)
        print(
            f"| {name} | {rate:.3f} ± {margin:.3f} | tau {s['tau']:.3f}, cv_t {s['cv_t']:.3f}, "
            f"rho {s['rho']:.3f}, skew(r) {s['skew_r']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
