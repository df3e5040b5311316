"""The words of a run's own null check (summary sentence and figure caption share them)."""

from __future__ import annotations

from .inputs import NullCheckSummary

NULL_CHECK_LABELS = {
    "exact": "the exact test (Haar draws)",
    "paper": "the paper's convention (normal controls in the proxy's complement, not exact)",
}
#: The verdict in words; only "calibrated" says "consistent" (``anistat.stats.uniformity``).
VERDICT_TEXT = {
    "calibrated": "consistent with a calibrated test",
    "anti-conservative": "NOT calibrated: it rejects more often than a valid test",
    "conservative": "NOT calibrated: conservative, it rejects less often than expected",
    "not uniform": "NOT calibrated: its p-values are not uniform",
}
DEPENDENCE_CAVEAT = (
    "Both tests, and the law they are judged against, take the p-values as independent. With a "
    "random proxy and a stream of Haar draws of its own for every test (stats.null_draws: per_test, "
    "as in protocols/null-check.yaml) they are, given the data: each p-value depends only on its "
    "proxy and its stream. With draws shared by the units of a width (the default) they are not, "
    "and the verdict is approximate. The verdict decides its two tests by Holm's procedure, so a "
    "calibrated test is called NOT calibrated with probability at most the stated level."
)


def grid_text(check: NullCheckSummary) -> str:
    if check.sequential:
        return "its p-values follow the sequential test's law (h/L when it stopped), simulated exactly"
    if check.grid is None:
        return "its p-values are treated as continuous"
    return f"its p-values are multiples of 1/{check.grid}" + (" (nearly continuous)" if check.grid > 1000 else "")


def seed_text(check: NullCheckSummary) -> str:
    """Where the tests come from: one run, and its seed when known."""
    return " of one run" + (f", seed {check.seed}" if check.seed is not None else "")


def valid_level_text(check: NullCheckSummary) -> str:
    """What a valid test gives, P(p ≤ α) under the p-values' own null law, as a percentage with
    the digits that keep it off α (4.96 %, not 5.0 %, beside α = 0.05): the one text the answer,
    the null-check sentence and docs/statistics.md's table (0.0496) show."""
    if check.grid is None and not check.sequential:
        return f"{check.alpha:.0%}"
    rate, level = 100.0 * check.expected_rate, 100.0 * check.alpha
    for digits in range(1, 8):
        shown = float(f"{rate:.{digits}f}")
        if rate == level or (shown != level and (shown > level) == (rate > level)):
            return f"{rate:.{digits}f}%"
    return f"{rate}%"


def verdict_sentence(check: NullCheckSummary) -> str:
    """One sentence: the rejection share, what a valid test would give, both tests, the verdict."""
    label = NULL_CHECK_LABELS.get(check.test, check.test)
    expected = valid_level_text(check)
    return (
        f"Null check (uninformative random proxy, {len(check.p_values)} tests{seed_text(check)}): {label} gives "
        f"p \u2264 {check.alpha:g} in {check.rejection_rate:.1%} (95 % interval {check.rate_low:.1%}\u2013"
        f"{check.rate_high:.1%}; a valid test: {expected}, {grid_text(check)}); exact binomial test of that "
        f"share p = {check.binomial_p:.2g}, uniformity against the p-values' own null law (Kolmogorov\u2013"
        f"Smirnov distance, p by simulation) p = {check.uniformity_p:.2g}: "
        f"{VERDICT_TEXT.get(check.verdict, check.verdict)} (family-wise level {check.level:g}, Holm over both tests)"
        + (
            "; these tests share Haar draws, so they are dependent and the verdict is approximate."
            if check.shared_draws
            else "."
        )
    )
