"""Machine-readable fallback codes: what a result's prose ``note`` says went differently from the
request, as a small closed vocabulary.

A result (and a row of ``results.csv``, column ``fallback``) carries the empty string when nothing
fell back, else its codes joined by ``";"`` in the order they arose (each at most once), e.g.
``"ci_method_fallback;ci_clipped"``. The ``note`` beside it still gives the reason in words.
"""

from __future__ import annotations

#: The bootstrap interval's requested method was undefined (BCa's acceleration or bias
#: correction, bootstrap-t's standard errors); another method was used (``ci_method`` names it).
CI_METHOD_FALLBACK = "ci_method_fallback"
#: No interval: the estimate or every resample is non-finite, the replicates have no spread, or
#: the resampling units are too few for this interval; ``ci_low``/``ci_high`` are NaN.
NO_INTERVAL = "no_interval"
#: An end of the interval is infinite: the method cannot bound it with these data (empirical
#: likelihood with very few effective documents, whose statistic stays below the χ² quantile).
CI_UNBOUNDED = "ci_unbounded"
#: Some bootstrap resamples were non-finite (or, for bootstrap-t, had a zero or non-finite SE)
#: and were left out of the interval.
RESAMPLES_DROPPED = "resamples_dropped"
#: The interval passed its parameter's range and was clipped to it.
CI_CLIPPED = "ci_clipped"
#: Fewer resampling units than :data:`anistat.stats.MIN_RESAMPLING_UNITS`: the intervals, their
#: SEs and the data test are withheld (NaN).
WITHHELD_FEW_UNITS = "withheld_few_units"
#: The data test is undefined (the ratio or its standard error is not finite and positive).
NO_DATA_TEST = "no_data_test"
#: No exact test was run (e.g. ΔIsoScore* with fewer than 2 dimensions left, a bucket without
#: second moments); ``p_value`` is NaN.
NO_EXACT_TEST = "no_exact_test"
#: The control is deterministic (sd exactly 0, e.g. ``normal`` at ``k = d/2``): ``z`` is undefined.
ZERO_CONTROL_SD = "zero_control_sd"
#: Anisotropy capture is undefined: no oracle fraction, or the oracle fraction is at most ``k/d``.
CAPTURE_UNDEFINED = "capture_undefined"
#: Documents were asked for as the resampling unit, but every test sequence comes from one
#: document: the sequences were resampled instead.
SEQUENCES_RESAMPLED = "sequences_resampled"

#: Every fallback code and its one-line meaning.
FALLBACK_CODES: dict[str, str] = {
    CI_METHOD_FALLBACK: "the requested interval method was undefined; ci_method names the one used",
    NO_INTERVAL: "no interval could be computed (non-finite or spread-free resamples, or too few units)",
    CI_UNBOUNDED: "an end of the interval is infinite: the method cannot bound it with these data",
    RESAMPLES_DROPPED: "some bootstrap resamples were non-finite (bootstrap-t: or had a zero SE) and left out",
    CI_CLIPPED: "the interval passed its parameter's range and was clipped to it",
    WITHHELD_FEW_UNITS: "too few resampling units: intervals, their SEs and the data test withheld",
    NO_DATA_TEST: "the data test is undefined (ratio or its SE not finite and positive)",
    NO_EXACT_TEST: "no exact test was run; p_value is NaN",
    ZERO_CONTROL_SD: "the control is deterministic (sd 0); z is undefined",
    CAPTURE_UNDEFINED: "anisotropy capture undefined (no oracle fraction, or it is at most k/d)",
    SEQUENCES_RESAMPLED: "all test sequences come from one document; sequences resampled instead",
}


def join_fallbacks(*codes: str) -> str:
    """Join fallback codes (each empty, one code, or already joined) into one ``";"``-separated
    string, in order, each code once.

    Parameters
    ----------
    *codes : str
        Codes of :data:`FALLBACK_CODES`, empty strings, or strings already joined by ``";"``.

    Returns
    -------
    str
        The codes joined by ``";"``; empty when there are none.

    Raises
    ------
    ValueError
        A code outside :data:`FALLBACK_CODES`.

    Examples
    --------
    >>> from anistat.stats.fallbacks import join_fallbacks
    >>> join_fallbacks("", "ci_clipped", "ci_method_fallback;ci_clipped")
    'ci_clipped;ci_method_fallback'
    >>> join_fallbacks()
    ''
    """
    out: list[str] = []
    for joined in codes:
        for code in joined.split(";") if joined else ():
            if code not in FALLBACK_CODES:
                raise ValueError(f"unknown fallback code {code!r}; expected one of {sorted(FALLBACK_CODES)}")
            if code not in out:
                out.append(code)
    return ";".join(out)
