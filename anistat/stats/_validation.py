"""Shared input checks for :mod:`anistat.stats` (validate once at the public boundary)."""

from __future__ import annotations

import warnings
from collections.abc import Collection

import numpy as np
from numpy.typing import ArrayLike

#: The alternatives every test of :mod:`anistat.stats` accepts.
ALTERNATIVES = ("greater", "less", "two-sided")


class DegenerateStatisticWarning(RuntimeWarning):
    """A statistic could not be computed as requested and a documented fallback was used (BCa or
    the bootstrap-t fell back to a percentile-type interval); the result's ``note`` says why.

    Silent by default, because a run meets many such units and records each fallback in its
    results table; turn it on with ``warnings.simplefilter("always", DegenerateStatisticWarning)``
    (or into an error with ``"error"``) to see each one where it happens.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter('always', stats.DegenerateStatisticWarning)
    ...     r = stats.ci_from_replicates(0.5, np.r_[np.zeros(49), 1.0], jackknife=np.array([0.4, 0.6]))
    ...
    >>> r.method, caught[0].category.__name__
    ('percentile', 'DegenerateStatisticWarning')
    """


warnings.filterwarnings("ignore", category=DegenerateStatisticWarning)


def check_choice(name: str, value: object, allowed: Collection[str]) -> str:
    """``value`` if it is one of ``allowed``, else ``ValueError`` naming ``name`` and the choices.

    Parameters
    ----------
    name : str
        The parameter's name, as the message shows it.
    value : object
        The value given; only a ``str`` among ``allowed`` passes.
    allowed : collection of str
        The choices, in the order the message lists them.

    Returns
    -------
    str
        ``value``.

    Raises
    ------
    ValueError
        ``"<name> must be one of '<a>', '<b>'; got <value!r>"``.

    Examples
    --------
    >>> check_choice("alternative", "less", ALTERNATIVES)
    'less'
    >>> check_choice("alternative", "two_sided", ALTERNATIVES)
    Traceback (most recent call last):
    ...
    ValueError: alternative must be one of 'greater', 'less', 'two-sided'; got 'two_sided'
    """
    if not isinstance(value, str) or value not in allowed:
        choices = ", ".join(repr(choice) for choice in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")
    return value


def check_alternative(alternative: str) -> str:
    return check_choice("alternative", alternative, ALTERNATIVES)


def check_ci_level(ci_level: float) -> float:
    ci_level = float(ci_level)
    if not 0.0 < ci_level < 1.0:
        raise ValueError(f"ci_level must be in (0, 1), got {ci_level}")
    return ci_level


def check_positive_int(value: int, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def as_1d_float(x: ArrayLike, name: str, *, finite: bool = True) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values")
    return arr
