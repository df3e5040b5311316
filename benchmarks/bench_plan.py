"""`anistat plan` validated by simulation: does a study run at the planned size keep the promise?

For each of the calibration's laws (``anistat.stats.calibrate``: isotropic, anisotropic,
clustered, skewed, hot; ``d = 32``, ``k = 4``) and each planted ratio (1.1, 1.25, 1.5):

1. the per-document law: ``τ`` and ``cv_t`` from one large simulated study of the law
   (``--law-documents`` documents; the sample SD of ``p_i/μ_p − t_i/μ_t`` over documents, and
   ``√(n/n_eff − 1)`` of the total energies, as a pilot row's ``n_eff`` gives it), the population ratio, and
   the Haar null's SD as pilots of 20 documents measure it (the mean over 20 such pilots: a
   pilot bundle's ``control_sd``, from its sample second moment);
2. the plan (:mod:`anistat.plan`) for a CI half-width of ``--half-width``, and for power
   ``--power`` of the data test and of the exact test at ``α/m`` (α = 0.05, ``m = --family-size``);
3. ``--studies`` simulated studies at each planned size, analysed with the real functions
   (:func:`anistat.stats.analyze_energy`: the interval ``--ci-method`` over documents — the
   protocol's default unless told —, the data test,
   the exact Monte-Carlo test with the plan's Haar draws), and the achieved mean half-width and
   rejection rates compared with the promise within the Monte-Carlo margin (1.96 standard errors).

Where the exact test cannot reach the threshold at the stated ratio (the plan's empty count), its
rejection rate is reported at the data test's planned size beside the plan's predicted power there.

A second part checks the trust statement: ``--pilots`` pilots of ``--pilot-documents`` documents
per law (ratio 1.25) estimate ``τ`` the way a pilot bundle does (√n · se / estimate of the
energy fraction row, studentized interval) and plan the data test; the share of pilots whose
plan (point and upper 0.8 limit) reaches the target power under the true law is computed from
the t formula (plan and power alike, so only the error of ``τ̂`` is measured).

Usage: ``nice -n 10 python benchmarks/bench_plan.py [--studies 500]`` (one thread).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from anistat import plan
from anistat.stats import analyze_energy, cluster_sums, control_energy_moments, expected_control_energy, power
from anistat.stats.calibrate import DOCUMENT_SCENARIOS, SCENARIOS, _simulated_study

DIM, RANK = 32, 4
RATIOS = (1.1, 1.25, 1.5)
ALPHA = 0.05
#: The exact test's null SD is what pilots of this many documents measure (mean of this many).
PILOT_DOCUMENTS, PILOT_SAMPLES = 20, 20
#: Mean tokens per sequence of the simulated studies (uniform on 4..16).
TOKENS = 10.0


def config(n_documents: int) -> dict:
    """The calibration's simulation settings at ``d = 32``, ``k = 4`` and ``n_documents``."""
    return dict(
        dim=DIM,
        rank=RANK,
        n_documents=n_documents,
        sequences_per_document=4.0,
        tokens_per_sequence=(4, 16),
        within_correlation=0.3,
        document_correlation=0.3,
        topic_rank=2,
        scale_sd=0.25,
    )


def document_sums(p_seq, t_seq, doc_of_seq, clustered):
    sums, _ = cluster_sums(np.stack([p_seq, t_seq], axis=1), doc_of_seq if clustered else None)
    return sums[:, 0], sums[:, 1]


def pilot_null_sd(scenario: str, ratio: float, seed: int, index: int) -> float:
    """The Haar null's SD a pilot of ``PILOT_DOCUMENTS`` documents measures (its sample second
    moment's, as a pilot bundle's ``control_sd``)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7, index]))
    second = _simulated_study(rng, scenario, ratio, config(PILOT_DOCUMENTS))[2]
    trace = float(np.trace(second))
    return control_energy_moments("haar", RANK, DIM, 1.0, float((second * second).sum()) / trace**2).sd


def population_law(scenario: str, ratio: float, n_documents: int, seed: int) -> dict:
    """τ, cv_t, the population ratio, the Haar null's SD and sequences per document of a law."""
    rng = np.random.default_rng(seed)
    p_seq, t_seq, _, sigma, u, doc_of_seq, clustered = _simulated_study(rng, scenario, ratio, config(n_documents))
    p, t = document_sums(p_seq, t_seq, doc_of_seq, clustered)
    tau = float(np.std(p / p.mean() - t / t.mean(), ddof=1))
    total_cv = math.sqrt(max(t.size * float((t * t).sum()) / float(t.sum()) ** 2 - 1.0, 0.0))
    null_sd = float(np.mean([pilot_null_sd(scenario, ratio, seed, i) for i in range(PILOT_SAMPLES)]))
    true_ratio = float(np.trace(u.T @ sigma @ u) / np.trace(sigma)) * DIM / RANK
    return dict(tau=tau, total_cv=total_cv, null_sd=null_sd, ratio=true_ratio, spd=p_seq.size / p.size)


def haar_null(rng, second: np.ndarray, n_draws: int) -> np.ndarray:
    """Energy fractions of ``n_draws`` Haar rank-k subspaces in ``second``: ``diag(P) @ λ/Σλ`` in
    its eigenbasis (a Haar projection's diagonal has one law in every frame), with
    ``diag(P) = diag(Z (ZᵀZ)⁻¹ Zᵀ)`` for Gaussian ``Z`` — the law the analysis' stream draws from."""
    lam = np.linalg.eigvalsh(second)
    z = rng.standard_normal((n_draws, DIM, RANK))
    gram_inverse = np.linalg.inv(np.einsum("ndk,ndl->nkl", z, z))
    diagonal = np.einsum("ndk,nkl,ndl->nd", z, gram_inverse, z)
    return diagonal @ (lam / lam.sum())


def analyse_study(p_seq, t_seq, doc_of_seq, clustered, null_fractions, *, n_bootstrap: int, seed: int, **options):
    """anistat's energy analysis of one simulated study against Haar controls at rank ``RANK`` in
    ``DIM`` coordinates, resampling documents when the study is clustered (2 units suffice)."""
    return analyze_energy(
        p_seq,
        t_seq,
        expected_control_energy("haar", p_seq, t_seq, RANK, DIM),
        rank=RANK,
        dim=DIM,
        null_fractions=null_fractions,
        group_ids=doc_of_seq if clustered else None,
        n_bootstrap=n_bootstrap,
        seed=seed,
        min_resampling_units=2,
        **options,
    )


def one_study(
    rng, scenario: str, ratio: float, n_documents: int, n_draws: int, n_resamples: int, ci_method: str
) -> tuple:
    """(half-width, covered, data-test p, exact p) of one simulated study analysed by anistat."""
    p_seq, t_seq, second, sigma, u, doc_of_seq, clustered = _simulated_study(rng, scenario, ratio, config(n_documents))
    null = haar_null(rng, second, n_draws)
    observed = float(np.trace(u.T @ second @ u) / np.trace(second))
    result = analyse_study(
        p_seq,
        t_seq,
        doc_of_seq,
        clustered,
        null,
        n_bootstrap=n_resamples,
        seed=int(rng.integers(2**62)),
        observed_fraction=observed,
        n_test_resamples=n_resamples,
        ci_method=ci_method,
    )
    row = result["energy_ratio"]
    truth = float(np.trace(u.T @ sigma @ u) / np.trace(sigma)) * DIM / RANK
    return (
        (row.ci_high - row.ci_low) / 2.0,
        float(row.ci_low <= truth <= row.ci_high),
        result.data_test.p_value,
        result.p_value,
    )


def studies(scenario, ratio, n_documents, n_studies, n_draws, n_resamples, seed, ci_method) -> np.ndarray:
    out = np.empty((n_studies, 4))
    for i in range(n_studies):
        rng = np.random.default_rng(np.random.SeedSequence([seed, n_documents, i]))
        out[i] = one_study(rng, scenario, ratio, n_documents, n_draws, n_resamples, ci_method)
    return out


def rate(hits: np.ndarray) -> str:
    value = float(np.mean(hits))
    return f"{value:.3f} ± {1.96 * math.sqrt(max(value * (1 - value), 1e-12) / hits.size):.3f}"


def check_cell(scenario: str, planted: float, args, seed: int) -> list[str]:
    """The table lines of one (law, ratio) cell."""
    law = population_law(scenario, planted, args.law_documents, seed)
    targets = plan.PlanTargets(
        ratio=law["ratio"],
        half_width=args.half_width,
        power=args.power,
        family_size=args.family_size,
        ci_method=args.ci_method,
    )
    unit = plan.UnitLaw(
        "sim",
        scenario,
        RANK,
        DIM,
        law["tau"],
        law["null_sd"],
        None,
        law["spd"],
        PILOT_DOCUMENTS,
        TOKENS * law["spd"],
        total_cv=law["total_cv"],
    )
    (row,) = plan.plan_rows([unit], targets)
    thr, draws = targets.threshold, row.null_draws
    lines = []
    label = f"| {scenario} | {planted:g} | {law['ratio']:.3f} | {law['tau']:.3f} | {law['total_cv']:.3f} |"
    n_w, n_b, n_c = row.documents_half_width, row.documents_data_test, row.documents_exact_test
    n_w, n_b, n_c = (
        n if name in args.targets else None for n, name in ((n_w, "half-width"), (n_b, "data"), (n_c, "exact"))
    )
    if n_w is not None:
        sim = studies(scenario, planted, n_w, args.studies, 99, args.resamples, seed + 1, args.ci_method)
        hw = sim[:, 0]
        margin = 1.96 * hw.std(ddof=1) / math.sqrt(hw.size)
        lines.append(
            f"{label} half-width ≤ {args.half_width:g} | {n_w} | mean {hw.mean():.4f} ± {margin:.4f} "
            f"(coverage {rate(sim[:, 1])}) |"
        )
    if n_b is not None:
        sim = studies(
            scenario,
            planted,
            n_b,
            args.studies,
            draws if "exact" in args.targets else 99,  # the exact test only read when asked
            max(args.resamples, row.test_resamples),
            seed + 2,
            args.ci_method,
        )
        lines.append(
            f"{label} data test power {args.power:g} ({row.test_resamples} resamples) | {n_b} | {rate(sim[:, 2] <= thr)} |"
        )
        predicted = power.exact_test_power(n_b, law["tau"], law["ratio"], RANK, DIM, row.null_quantile)
        if row.documents_exact_test is None and "exact" in args.targets:
            lines.append(
                f"{label} exact test: unreachable below R = {row.exact_ratio_needed:.3f}; at {n_b} docs "
                f"predicted {predicted:.3f} | {n_b} | {rate(sim[:, 3] <= thr)} |"
            )
    if n_c is not None:
        sim = studies(scenario, planted, n_c, args.studies, draws, args.resamples, seed + 3, args.ci_method)
        lines.append(f"{label} exact test power {args.power:g} ({draws} draws) | {n_c} | {rate(sim[:, 3] <= thr)} |")
    return lines


def pilot_check(scenario: str, args, seed: int) -> str:
    """Share of pilots whose data-test plan (point, upper limit) reaches the power under the true law."""
    law = population_law(scenario, 1.25, args.law_documents, seed)
    thr = ALPHA / args.family_size
    reached, reached_upper = [], []
    for i in range(args.pilots):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 99, i]))
        p_seq, t_seq, *_rest, doc_of_seq, clustered = _simulated_study(
            rng, scenario, 1.25, config(args.pilot_documents)
        )
        result = analyse_study(p_seq, t_seq, doc_of_seq, clustered, np.array([0.0]), n_bootstrap=200, seed=i)
        row = result["energy_fraction"]
        tau_hat = math.sqrt(args.pilot_documents) * row.se / row.estimate
        tau_up = power.upper_relative_sd(tau_hat, args.pilot_documents, 0.8)
        for tau, sink in ((tau_hat, reached), (tau_up, reached_upper)):
            # the t formula's plan and power: isolates the error of the pilot's τ̂
            n = power.documents_for_data_test(tau, law["ratio"], args.power, thr, small_sample=False)
            sink.append(n is not None and power.data_test_power(n, law["tau"], law["ratio"], thr) >= args.power)
    return (
        f"| {scenario} | {args.pilot_documents} | {law['tau']:.3f} | {np.mean(reached):.3f} | "
        f"{np.mean(reached_upper):.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=500)
    parser.add_argument("--resamples", type=int, default=499, help="bootstrap resamples (intervals and data test)")
    parser.add_argument("--half-width", type=float, default=0.1)
    parser.add_argument("--ci-method", default=plan.DEFAULT_CI_METHOD, help="interval method (default: the protocol's)")
    parser.add_argument("--power", type=float, default=0.8)
    parser.add_argument("--family-size", type=int, default=10)
    parser.add_argument("--law-documents", type=int, default=4000)
    parser.add_argument("--pilots", type=int, default=300)
    parser.add_argument("--pilot-documents", type=int, default=20)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("--targets", nargs="+", default=["half-width", "data", "exact"], help="targets simulated")
    parser.add_argument("--ratio", action="append", type=float)
    args = parser.parse_args()
    start = time.perf_counter()
    print(
        f"d = {DIM}, k = {RANK}, alpha = {ALPHA} over m = {args.family_size}, {args.studies} studies per line, "
        f"interval {args.ci_method}"
    )
    print("| law | planted | population R | tau | cv_t | target | planned documents | achieved |")
    print("|---|---:|---:|---:|---:|---|---:|---|")
    for s_index, scenario in enumerate(args.scenario or SCENARIOS):
        for r_index, planted in enumerate(args.ratio or RATIOS):
            for line in check_cell(scenario, planted, args, 1000 * s_index + 100 * r_index):
                print(line, flush=True)
    if args.pilots:
        print("\n| law | pilot documents | true tau | plan at tau_hat reaches power | at upper 0.8 limit |")
        print("|---|---:|---:|---:|---:|")
        for s_index, scenario in enumerate(args.scenario or SCENARIOS):
            print(pilot_check(scenario, args, 50_000 + s_index), flush=True)
    clustered = ", ".join(DOCUMENT_SCENARIOS)
    print(
        f"\n(documents: {clustered} cut 1 + Poisson(3) sequences per document; elapsed {time.perf_counter() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()
