"""Reproduction: does a rerun of a protocol give the original bundle's numbers?

`anistat diff ORIGINAL RERUN` (and :func:`compare_reproduction`) compare two bundles of one
protocol number by number — results.csv, frequency.csv and the claims' verdicts — never the bytes
of files that hold times, paths or rendering (manifest times, report.html, figures). It answers
"is this the same result?", which `anistat verify PROTOCOL --against` (a replication judged
claim by claim, with a loose relative tolerance) does not.

What must be identical: the protocol (its sha256), the set of rows, every count (`dim`,
`n_controls`, `n_sequences`, `n_clusters`, `n_tokens`), every text column (`status`,
`ci_method`, `p_test`, `effect_size_kind`) and every claim's verdict. What may differ, and by how
much (:class:`Tolerance`; docs/reproducibility.md gives the measurements behind it):

* continuous numbers (`estimate`, `ci_low`, `ci_high`, `se`, `effect_size`) by `relative` (1 %)
  of their scale: ``|a − b| ≤ relative · max(|a|, |b|, S)``, where ``S`` is the largest ``|x|``
  of that column among the original's rows of the same metric (a ΔIsoScore* near 0 is read at
  the scale of the other ΔIsoScore* values, not at its own). Why: CPUs round float32 products
  differently (AVX2 and AVX-512 kernels, another BLAS, another thread count), the training of
  the built-in models amplifies float64 rounding (measured: the encoder's energies at step 400
  move by 1e-3 relative between AVX2 and AVX-512 kernels), and the measurement's float32
  moments move in their last bits with the thread count (the analysis' control draws then move
  with them, e.g. `z` by up to 1e-3 relative between 1 and 2 threads). The largest difference
  measured for the quickstart was 0.2 % of a metric's scale, so 1 % keeps a margin of 5;
* Monte-Carlo quantities by two of their own Monte-Carlo standard errors: a p-value counts
  draws beyond the observed statistic, so where draws are dense (p ≈ 0.5) a rounding-level
  move of the statistic moves the count by a few draws: ``|Δp| ≤ 2·√(p(1 − p)/N) + 2/N`` with
  ``N`` = the row's draws + 1 (`n_controls`; `controls.n` for `p_value_paper`;
  `stats.n_test_resamples` for rows that do not record their draws); `control_mean` / `control_sd`
  (the mean and SD of the row's drawn controls, whose directions follow the gradient moments'
  eigenvectors) by ``2·control_sd/√controls.n`` beyond the relative rule.

Missing values must be missing in both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ._columns import FREQUENCY_KEYS, RESULT_KEYS
from .bundle import Bundle
from .errors import AnistatInputError

#: Columns that must be equal, value for value.
EXACT_COLUMNS = (
    "status",
    "ci_method",
    "p_test",
    "effect_size_kind",
    "n_controls",
    "n_sequences",
    "n_clusters",
    "n_tokens",
)
#: Continuous columns compared with the relative rule.
SCALED_COLUMNS = ("estimate", "ci_low", "ci_high", "se", "effect_size", "n_eff", "m_eff")
#: Columns holding the mean / SD of drawn controls.
CONTROL_COLUMNS = ("control_mean", "control_sd")
#: Monte-Carlo p-value columns.
P_COLUMNS = ("p_value", "p_adjusted", "p_value_paper")


@dataclass(frozen=True)
class Tolerance:
    """How far a rerun's numbers may be from the original's (see the module docstring):
    `relative` of a number's scale for continuous columns; `monte_carlo_se` Monte-Carlo
    standard errors (plus as many draws) for p-values and control statistics."""

    relative: float = 0.01
    monte_carlo_se: float = 2.0


DEFAULT_TOLERANCE = Tolerance()


@dataclass(frozen=True)
class Difference:
    """One number (or verdict, or row) that differs beyond the tolerance."""

    table: str
    row: str
    column: str
    original: Any
    rerun: Any
    allowed: float | None = None

    def describe(self) -> str:
        bound = f" (allowed ±{self.allowed:.3g})" if self.allowed is not None else ""
        where = f"{self.table} {self.row}" if self.row else self.table
        return f"{where}: {self.column} {self.original!r} vs {self.rerun!r}{bound}"


@dataclass(frozen=True)
class ReproductionCheck:
    """The outcome of :func:`compare_reproduction`: `differences` beyond the tolerance (empty when
    the rerun reproduces the original), how many numbers were compared, how many were bit for bit
    identical, and the largest difference seen relative to its allowance (`worst`, with where)."""

    original: Path
    rerun: Path
    tolerance: Tolerance
    compared: int
    identical: int
    differences: tuple[Difference, ...]
    worst: dict[str, tuple[float, str]] = field(default_factory=dict)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        within = self.compared - self.identical - len(self.differences)
        text = f"{self.compared} numbers compared: {self.identical} identical, {within} within the tolerance" + (
            f", {len(self.differences)} beyond it" if self.differences else ""
        )
        for rule, (share, where) in sorted(self.worst.items()):
            text += f"; largest {rule} difference {share:.2g} of its allowance ({where})"
        return text


def _protocol_settings(manifest: dict) -> tuple[int, int]:
    """(controls.n, stats.n_test_resamples) of a manifest's protocol (the Monte-Carlo sizes the
    results table does not carry per row). A manifest written before the setting's rename
    carries it as ``n_permutations``; the protocol reads either name."""

    def section(parent: dict, key: str) -> dict:  # a missing or malformed section reads as empty
        value = parent.get(key)
        return value if isinstance(value, dict) else {}

    protocol = section(manifest, "protocol")
    controls, stats = section(protocol, "controls"), section(protocol, "stats")
    n_controls = controls.get("n", 20)
    n_resamples = stats.get("n_test_resamples", stats.get("n_permutations", 2000))
    valid = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (n_controls, n_resamples))
    if not valid:
        raise AnistatInputError(
            "manifest.json: protocol.controls.n and protocol.stats.n_test_resamples must be positive integers"
        )
    return n_controls, n_resamples


def _missing(value: Any) -> bool:
    """None, NaN or pandas' NA (the integer columns read back as nullable integers)."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _number(value: Any) -> float | None:
    if _missing(value):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _monte_carlo_allowance(p: float, draws: int, tolerance: Tolerance) -> float:
    n = max(int(draws), 1)
    p = min(max(p, 0.0), 1.0)
    return tolerance.monte_carlo_se * (math.sqrt(p * (1 - p) / n) + 1 / n)


class _Comparer:
    def __init__(self, tolerance: Tolerance):
        self.tolerance = tolerance
        self.compared = 0
        self.identical = 0
        self.differences: list[Difference] = []
        self.worst: dict[str, tuple[float, str]] = {}  # rule -> (largest gap / allowance, where)

    def exact(self, table: str, row: str, column: str, a: Any, b: Any) -> None:
        self.compared += 1
        same = (_missing(a) and _missing(b)) or (not _missing(a) and not _missing(b) and str(a) == str(b))
        if not same and _number(a) is not None and _number(b) is not None:
            same = _number(a) == _number(b)  # 4 and 4.0
        if same:
            self.identical += 1
        else:
            self.differences.append(Difference(table, row, column, a, b))

    def close(self, table: str, row: str, column: str, a: Any, b: Any, allowed: float, rule: str) -> None:
        self.compared += 1
        x, y = _number(a), _number(b)
        if x is None or y is None:
            if _missing(a) and _missing(b):
                self.identical += 1
            else:
                self.differences.append(Difference(table, row, column, a, b))
            return
        if x == y or (math.isinf(x) and x == y):
            self.identical += 1
            return
        gap = abs(x - y)
        if not math.isfinite(gap) or gap > allowed:
            self.differences.append(Difference(table, row, column, x, y, allowed))
            return
        share = gap / allowed if allowed > 0 else math.inf
        if share > self.worst.get(rule, (0.0, ""))[0]:
            self.worst[rule] = (share, f"{table} {row}: {column}")


def _row_label(row: dict, keys: tuple[str, ...]) -> str:
    return " ".join(f"{key}={row[key]}" for key in keys if key in row and not _missing(row[key]))


def _scales(table, columns) -> dict[tuple[str, str], float]:
    """The largest |value| of each column among the rows of each metric (the relative rule's floor)."""
    scales = {}
    for metric, rows in table.groupby("metric", sort=False):
        for column in columns:
            if column in rows:
                values = pd.to_numeric(rows[column], errors="coerce").astype(float).abs()  # text -> NaN
                finite = values[values.apply(math.isfinite)]
                scales[(str(metric), column)] = float(finite.max()) if len(finite) else 0.0
    return scales


def _compare_table(
    comparer: _Comparer, name: str, original, rerun, keys: tuple[str, ...], *, n_paper_controls: int, default_draws: int
) -> None:
    keys = tuple(k for k in keys if k in original.columns and k in rerun.columns)
    tolerance = comparer.tolerance
    for label, table in (("original", original), ("rerun", rerun)):
        if table.duplicated(list(keys)).any():
            raise AnistatInputError(f"{name} of the {label} bundle has repeated rows (same {', '.join(keys)})")
    merged = pd.merge(
        original.astype(object),
        rerun.astype(object),
        on=list(keys),
        how="outer",
        suffixes=("\x00a", "\x00b"),
        indicator=True,
    )
    scales = _scales(original, SCALED_COLUMNS + CONTROL_COLUMNS)
    for record in merged.to_dict("records"):
        row = _row_label(record, keys)
        if record["_merge"] != "both":
            where = "original" if record["_merge"] == "left_only" else "rerun"
            comparer.compared += 1
            comparer.differences.append(
                Difference(name, row, "row", f"only in the {where}", "" if where == "rerun" else "missing")
            )
            continue

        def pair(column: str, record=record):
            return record.get(f"{column}\x00a"), record.get(f"{column}\x00b")

        columns = [c for c in original.columns if c in rerun.columns and c not in keys]
        metric = str(record.get("metric"))
        for column in columns:
            a, b = pair(column)
            if column in EXACT_COLUMNS:
                comparer.exact(name, row, column, a, b)
            elif column in SCALED_COLUMNS or column in CONTROL_COLUMNS:
                x, y = _number(a), _number(b)
                size = max(
                    abs(x) if x is not None else 0.0,
                    abs(y) if y is not None else 0.0,
                    scales.get((metric, column), 0.0),
                )
                allowed, rule = tolerance.relative * size + 1e-12, "relative"
                if column in CONTROL_COLUMNS:
                    sd = _number(pair("control_sd")[0])
                    if sd is not None and math.isfinite(sd):
                        drawn = tolerance.monte_carlo_se * abs(sd) / math.sqrt(n_paper_controls)
                        allowed, rule = max((allowed, rule), (drawn, "Monte-Carlo"))
                comparer.close(name, row, column, a, b, allowed, rule)
            elif column in P_COLUMNS:
                x, y = _number(a), _number(b)
                draws = n_paper_controls if column == "p_value_paper" else _number(pair("n_controls")[0])
                draws = int(draws) if draws is not None and draws > 0 else default_draws
                p = max(x if x is not None else 0.0, y if y is not None else 0.0)
                comparer.close(name, row, column, a, b, _monte_carlo_allowance(p, draws + 1, tolerance), "Monte-Carlo")
            # anything else (e.g. `note`, free text with rounded numbers) is not compared


def compare_reproduction(
    original: Bundle | Path, rerun: Bundle | Path, tolerance: Tolerance = DEFAULT_TOLERANCE
) -> ReproductionCheck:
    """Compare a rerun's bundle with the original's (see the module docstring); a path is read
    with :meth:`anistat.bundle.Bundle.load`."""
    bundles = [b if isinstance(b, Bundle) else Bundle.load(b) for b in (original, rerun)]
    comparer = _Comparer(tolerance)
    notes: list[str] = []
    manifests = [b.manifest for b in bundles]
    comparer.exact(
        "manifest", "", "protocol_sha256", manifests[0].get("protocol_sha256"), manifests[1].get("protocol_sha256")
    )
    n_paper_controls, n_resamples = _protocol_settings(manifests[0])
    versions = [m.get("versions", {}) if isinstance(m.get("versions"), dict) else {} for m in manifests]
    changed = sorted(k for k in set(versions[0]) | set(versions[1]) if versions[0].get(k) != versions[1].get(k))
    if changed:
        notes.append(
            "versions differ: " + ", ".join(f"{k} {versions[0].get(k)} → {versions[1].get(k)}" for k in changed)
        )
    _compare_table(
        comparer,
        "results.csv",
        bundles[0].results,
        bundles[1].results,
        RESULT_KEYS,
        n_paper_controls=n_paper_controls,
        default_draws=n_resamples,
    )
    frequency = [b.frequency for b in bundles]
    if frequency[0].empty != frequency[1].empty:
        comparer.compared += 1
        comparer.differences.append(
            Difference(
                "frequency.csv",
                "",
                "file",
                "present" if not frequency[0].empty else "absent",
                "present" if not frequency[1].empty else "absent",
            )
        )
    elif not frequency[0].empty:
        _compare_table(
            comparer,
            "frequency.csv",
            frequency[0],
            frequency[1],
            FREQUENCY_KEYS,
            n_paper_controls=n_paper_controls,
            default_draws=n_resamples,
        )
    claims = [_claim_verdicts(b) for b in bundles]
    for claim_id in sorted(set(claims[0]) | set(claims[1])):
        comparer.exact("claims.json", claim_id, "status", claims[0].get(claim_id), claims[1].get(claim_id))
    return ReproductionCheck(
        bundles[0].path,
        bundles[1].path,
        tolerance,
        comparer.compared,
        comparer.identical,
        tuple(comparer.differences),
        dict(comparer.worst),
        tuple(notes),
    )


def _claim_verdicts(bundle: Bundle) -> dict[str, str]:
    return {str(c.get("id")): str(c.get("status")) for c in bundle.claims}
