"""Two bundles compared: the one engine behind `anistat diff`, `anistat compare` and `anistat
verify PROTOCOL --against BUNDLE`.

:func:`compare` matches the rows of the two bundles once (results.csv on ``RESULT_KEYS``,
frequency.csv on ``FREQUENCY_KEYS``), their claims by id and their manifests field by field, and
returns one :class:`Comparison`. Each command reads the part of it that answers its question:

* `diff` — "is this the same result?" (:attr:`Comparison.ok`, :meth:`Comparison.summary`): every
  number of both tables judged against the :class:`Tolerance` (below), every count, status and
  claim verdict equal, the protocol the same (its sha256, or the same up to paths);
* `compare` / `verify --against` — "does the replication agree?" (:attr:`Comparison.rows`,
  :meth:`Comparison.agreement`, :attr:`Comparison.claims`): per results row present in both with
  an estimate in both, the difference of the estimates with a CI (normal approximation from both
  CIs), sign agreement (same side of the null value: 1 for ratios, 0 otherwise), CI overlap and
  agreement within ``Tolerance.agreement`` (``|difference| ≤ agreement · max(|original|, 1e-12)``).

Never compared: the bytes of files that hold times, paths or rendering (manifest times,
report.html, figures). What may differ in `diff`, and by how much (docs/reproducibility.md gives
the measurements behind it):

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
  eigenvectors) by ``2·control_sd/√controls.n`` beyond the relative rule;
* the protocol's sha256 when the two protocols differ only in file paths or cosmetic fields
  (:data:`PATH_FIELDS`, :data:`COSMETIC_FIELDS`): "same protocol up to paths", naming the fields,
  and the verdict rests on the numbers.

Missing values must be missing in both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from ._columns import FREQUENCY_KEYS, RESULT_KEYS
from .bundle import Bundle, as_bundle
from .claims import RATIO_METRICS, compare_claims
from .errors import AnistatInputError
from .protocol import EXECUTION_FIELDS

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
#: Protocol fields that name where the inputs are, not what is measured (``[]``: any list index).
PATH_FIELDS = ("data.paths", "data.dataset", "models[].path", "models[].checkpoints")
#: Protocol fields that only label or render the study.
COSMETIC_FIELDS = ("name", "description", "report.title", "report.precision", "report.compile_pdf")
#: The replication table's columns per bundle, suffixed ``_original`` / ``_replication``.
AGREEMENT_COLUMNS = ("estimate", "ci_low", "ci_high", "p_adjusted", "status")
#: The manifest fields shown beside the versions in the replication report's environment table.
ENVIRONMENT_FIELDS = ("device", "dtype", "protocol_sha256")
SUFFIXES = ("_original", "_replication")


@dataclass(frozen=True)
class Tolerance:
    """How far the other bundle's numbers may be from the original's (see the module docstring):
    `relative` of a number's scale for continuous columns and `monte_carlo_se` Monte-Carlo
    standard errors (plus as many draws) for p-values and control statistics — `diff`'s rules;
    `agreement` of the original's estimate — the replication table's `within_tolerance`."""

    relative: float = 0.01
    monte_carlo_se: float = 2.0
    agreement: float = 0.25


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
class Comparison:
    """Two bundles compared (:func:`compare`).

    `diff`'s answer: ``differences`` beyond the tolerance (none: :attr:`ok`), how many numbers were
    compared, how many were bit for bit identical, the largest difference seen relative to its
    allowance per rule (``worst``: share, where) and ``notes`` (versions that differ, a protocol
    the same up to paths). The replication's: ``rows`` (one per results row in both with an
    estimate in both: the keys, ``*_original`` / ``*_replication`` of :data:`AGREEMENT_COLUMNS`,
    ``difference`` with its CI, ``sign_agrees``, ``ci_overlap``, ``within_tolerance``), ``claims``
    (per claim ``id``, ``statement``, ``original`` and ``replication`` status, ``agree``) and
    ``environment`` (per version and manifest field: ``field``, ``original``, ``replication``,
    ``differs``)."""

    original: Path
    other: Path
    tolerance: Tolerance
    compared: int
    identical: int
    differences: tuple[Difference, ...]
    worst: dict[str, tuple[float, str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    claims: tuple[dict[str, Any], ...] = ()
    environment: tuple[dict[str, Any], ...] = ()
    rows: pd.DataFrame = field(default_factory=pd.DataFrame, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        """The other bundle reproduces the original (`diff`'s verdict)."""
        return not self.differences

    def summary(self) -> str:
        """`diff`'s one-line count: compared, identical, within the tolerance, beyond it."""
        within = self.compared - self.identical - len(self.differences)
        text = f"{self.compared} numbers compared: {self.identical} identical, {within} within the tolerance" + (
            f", {len(self.differences)} beyond it" if self.differences else ""
        )
        for rule, (share, where) in sorted(self.worst.items()):
            text += f"; largest {rule} difference {share:.2g} of its allowance ({where})"
        return text

    def agreement(self) -> dict[str, Any]:
        """The replication's headline shares over the energy-ratio rows (all rows when there are
        none): sign agreement, CI overlap, within the tolerance, the median |difference|."""
        headline = self.rows[self.rows["metric"] == "energy_ratio"] if len(self.rows) else self.rows
        frame = headline if not headline.empty else self.rows
        if frame.empty:
            return {"rows": 0}
        return {
            "rows": int(len(self.rows)),
            "headline_metric": "energy_ratio" if not headline.empty else "all",
            "sign_agreement": float(frame["sign_agrees"].mean()),
            "ci_overlap": float(frame["ci_overlap"].mean()),
            "within_tolerance": float(frame["within_tolerance"].mean()),
            "median_abs_difference": float(frame["difference"].abs().median()),
        }


def compare(
    original: Bundle | str | Path, other: Bundle | str | Path, tolerance: Tolerance = DEFAULT_TOLERANCE
) -> Comparison:
    """Compare ``other`` with ``original`` (see the module docstring); a path is read with
    :meth:`anistat.bundle.Bundle.load`."""
    bundles = (as_bundle(original), as_bundle(other))
    counter = _Counter(tolerance)
    manifests = (bundles[0].manifest, bundles[1].manifest)
    notes = _protocol_check(counter, bundles)
    environment = environment_rows(*manifests)
    changed = [row for row in environment if row["differs"] and row["field"] not in ENVIRONMENT_FIELDS]
    if changed:
        notes.insert(
            0, "versions differ: " + ", ".join(f"{r['field']} {r['original']} → {r['replication']}" for r in changed)
        )
    n_paper_controls, n_resamples = _protocol_settings(manifests[0])
    sizes = {"n_paper_controls": n_paper_controls, "default_draws": n_resamples}
    results = align(bundles[0].results, bundles[1].results, RESULT_KEYS, "results.csv")
    _count_table(counter, "results.csv", results, bundles[0].results, **sizes)
    frequency = (bundles[0].frequency, bundles[1].frequency)
    if frequency[0].empty != frequency[1].empty:
        present = ["absent" if table.empty else "present" for table in frequency]
        counter.difference(Difference("frequency.csv", "", "file", present[0], present[1]))
    elif not frequency[0].empty:
        aligned = align(frequency[0], frequency[1], FREQUENCY_KEYS, "frequency.csv")
        _count_table(counter, "frequency.csv", aligned, frequency[0], **sizes)
    claims = compare_claims(bundles[0].claims, bundles[1].claims)
    for claim in claims:
        counter.exact("claims.json", claim["id"], "status", claim["original"], claim["replication"])
    return Comparison(
        bundles[0].path,
        bundles[1].path,
        tolerance,
        counter.compared,
        counter.identical,
        tuple(counter.differences),
        dict(counter.worst),
        tuple(notes),
        tuple(claims),
        tuple(environment),
        agreement_rows(results, tolerance.agreement),
    )


# ----------------------------------------------------------------------------------------------
# matching rows, claims and manifests
# ----------------------------------------------------------------------------------------------
def align(original: pd.DataFrame, other: pd.DataFrame, keys: tuple[str, ...], name: str) -> pd.DataFrame:
    """The two tables' rows matched on the ``keys`` both have (an outer join, values as objects, in
    the original's row order): every other column twice, suffixed :data:`SUFFIXES`; ``_merge`` says where a row is
    (``both``, ``left_only``: only in the original, ``right_only``). ``attrs["keys"]`` are the keys
    used. Repeated keys are a user error (one line)."""
    keys = tuple(k for k in keys if k in original.columns and k in other.columns)
    for label, table in (("original", original), ("rerun", other)):
        if table.duplicated(list(keys)).any():
            raise AnistatInputError(f"{name} of the {label} bundle has repeated rows (same {', '.join(keys)})")
    order = ("\x00original_row", "\x00other_row")  # the original's order, then rows only the other has
    merged = pd.merge(
        original.astype(object).assign(**{order[0]: range(len(original))}),
        other.astype(object).assign(**{order[1]: range(len(other))}),
        on=list(keys),
        how="outer",
        suffixes=SUFFIXES,
        indicator=True,
    )
    merged = merged.sort_values(list(order), na_position="last", kind="stable").drop(columns=list(order))
    merged.attrs["keys"] = keys
    merged.attrs["columns"] = tuple(c for c in original.columns if c in other.columns and c not in keys)
    return merged


def environment_rows(original: Mapping[str, Any], other: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per package version, then per :data:`ENVIRONMENT_FIELDS`: both values and whether they differ."""
    versions: list[dict[str, Any]] = [
        m["versions"] if isinstance(m.get("versions"), dict) else {} for m in (original, other)
    ]
    rows = [
        (key, versions[0].get(key, ""), versions[1].get(key, "")) for key in sorted(set(versions[0]) | set(versions[1]))
    ]
    rows += [(key, original.get(key, ""), other.get(key, "")) for key in ENVIRONMENT_FIELDS]
    return [{"field": k, "original": str(a), "replication": str(b), "differs": a != b} for k, a, b in rows]


def protocol_differences(original: Mapping[str, Any], other: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields (``data.paths``, ``models[1].path`` …) where two normalised protocols differ,
    the execution settings (``EXECUTION_FIELDS``, outside the hash) left out; a list of scalars is
    one field."""
    found: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if not (where == "" and key in EXECUTION_FIELDS):
                    walk(a.get(key), b.get(key), f"{where}.{key}" if where else key)
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and any(isinstance(x, dict) for x in a):
            for index, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{index}]")
        elif a != b:
            found.append(where)

    walk(original, other, "")
    return tuple(found)


def _path_or_cosmetic(field_name: str) -> bool:
    return re.sub(r"\[\d+\]", "[]", field_name) in PATH_FIELDS + COSMETIC_FIELDS


def _protocol_check(counter: _Counter, bundles: tuple[Bundle, Bundle]) -> list[str]:
    """The protocols: the same sha256 (one identical item), the same up to paths and cosmetic
    fields (compared, within the tolerance, with a note naming the fields), or a difference."""
    hashes = [b.manifest.get("protocol_sha256") for b in bundles]
    if hashes[0] == hashes[1]:
        counter.exact("manifest", "", "protocol_sha256", *hashes)
        return []
    fields = protocol_differences(bundles[0].protocol.normalised(), bundles[1].protocol.normalised())
    if fields and all(_path_or_cosmetic(f) for f in fields):
        counter.compared += 1
        return [
            f"same protocol up to paths: only {', '.join(fields)} differ (protocol_sha256 {hashes[0]} vs {hashes[1]})"
        ]
    counter.difference(Difference("manifest", "", "protocol_sha256", *hashes))
    return [f"the protocols differ in {', '.join(fields)}"] if fields else []


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


# ----------------------------------------------------------------------------------------------
# `diff`: every number against the tolerance
# ----------------------------------------------------------------------------------------------
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


class _Counter:
    """Counts what was compared, what was identical, and collects the differences."""

    def __init__(self, tolerance: Tolerance):
        self.tolerance = tolerance
        self.compared = 0
        self.identical = 0
        self.differences: list[Difference] = []
        self.worst: dict[str, tuple[float, str]] = {}  # rule -> (largest gap / allowance, where)

    def difference(self, difference: Difference) -> None:
        self.compared += 1
        self.differences.append(difference)

    def exact(self, table: str, row: str, column: str, a: Any, b: Any) -> None:
        same = (_missing(a) and _missing(b)) or (not _missing(a) and not _missing(b) and str(a) == str(b))
        if not same and _number(a) is not None and _number(b) is not None:
            same = _number(a) == _number(b)  # 4 and 4.0
        if same:
            self.compared += 1
            self.identical += 1
        else:
            self.difference(Difference(table, row, column, a, b))

    def close(self, table: str, row: str, column: str, a: Any, b: Any, allowed: float, rule: str) -> None:
        x, y = _number(a), _number(b)
        if x is None or y is None:
            if _missing(a) and _missing(b):
                self.exact(table, row, column, a, b)
            else:
                self.difference(Difference(table, row, column, a, b))
            return
        gap = abs(x - y)
        if x == y or (math.isfinite(gap) and gap <= allowed):
            self.compared += 1
            self.identical += x == y
            share = gap / allowed if allowed > 0 else math.inf
            if x != y and share > self.worst.get(rule, (0.0, ""))[0]:
                self.worst[rule] = (share, f"{table} {row}: {column}")
        else:
            self.difference(Difference(table, row, column, x, y, allowed))


def _row_label(row: dict, keys: tuple[str, ...]) -> str:
    return " ".join(f"{key}={row[key]}" for key in keys if key in row and not _missing(row[key]))


def _scales(table: pd.DataFrame, columns: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """The largest |value| of each column among the rows of each metric (the relative rule's floor)."""
    scales = {}
    for metric, rows in table.groupby("metric", sort=False):
        for column in columns:
            if column in rows:
                values = pd.to_numeric(rows[column], errors="coerce").astype(float).abs()  # text -> NaN
                finite = values[values.apply(math.isfinite)]
                scales[(str(metric), column)] = float(finite.max()) if len(finite) else 0.0
    return scales


def _count_table(
    counter: _Counter,
    name: str,
    merged: pd.DataFrame,
    original: pd.DataFrame,
    *,
    n_paper_controls: int,
    default_draws: int,
) -> None:
    """Every number of two aligned tables (:func:`align`) judged by its column's rule."""
    keys, columns = merged.attrs["keys"], merged.attrs["columns"]
    scales = _scales(original, SCALED_COLUMNS + CONTROL_COLUMNS)
    for record in merged.to_dict("records"):
        row = _row_label(record, keys)
        if record["_merge"] != "both":
            where = "original" if record["_merge"] == "left_only" else "rerun"
            counter.difference(
                Difference(name, row, "row", f"only in the {where}", "" if where == "rerun" else "missing")
            )
            continue

        def pair(column: str, record=record) -> tuple[Any, Any]:
            return record.get(column + SUFFIXES[0]), record.get(column + SUFFIXES[1])

        metric = str(record.get("metric"))
        for column in columns:
            a, b = pair(column)
            if column in EXACT_COLUMNS:
                counter.exact(name, row, column, a, b)
            elif column in SCALED_COLUMNS or column in CONTROL_COLUMNS:
                x, y = _number(a), _number(b)
                size = max(
                    abs(x) if x is not None else 0.0,
                    abs(y) if y is not None else 0.0,
                    scales.get((metric, column), 0.0),
                )
                allowed, rule = counter.tolerance.relative * size + 1e-12, "relative"
                sd = _number(pair("control_sd")[0])
                if column in CONTROL_COLUMNS and sd is not None and math.isfinite(sd):
                    drawn = counter.tolerance.monte_carlo_se * abs(sd) / math.sqrt(n_paper_controls)
                    allowed, rule = max((allowed, rule), (drawn, "Monte-Carlo"))
                counter.close(name, row, column, a, b, allowed, rule)
            elif column in P_COLUMNS:
                x, y = _number(a), _number(b)
                draws = n_paper_controls if column == "p_value_paper" else _number(pair("n_controls")[0])
                draws = int(draws) if draws is not None and draws > 0 else default_draws
                p = max(x if x is not None else 0.0, y if y is not None else 0.0)
                allowed = _monte_carlo_allowance(p, draws + 1, counter.tolerance)
                counter.close(name, row, column, a, b, allowed, "Monte-Carlo")
            # anything else (e.g. `note`, free text with rounded numbers) is not compared


# ----------------------------------------------------------------------------------------------
# the replication: agreement of the estimates
# ----------------------------------------------------------------------------------------------
def agreement_rows(merged: pd.DataFrame, tolerance: float, ci_level: float = 0.95) -> pd.DataFrame:
    """The replication table of two aligned results tables (:func:`align`): the rows in both with
    an estimate in both; ``difference`` = replication − original with the normal-approximation CI
    ``difference ± z·√(se_a² + se_b²)``, ``se`` = (ci_high − ci_low)/(2z) of each bundle's CI;
    ``sign_agrees`` (both estimates on the same side of the metric's null value, 1 for ratios,
    else 0); ``ci_overlap``; ``within_tolerance``: ``|difference| ≤ tolerance · max(|original|, 1e-12)``."""
    keys = list(merged.attrs["keys"])
    columns = [c + s for s in SUFFIXES for c in AGREEMENT_COLUMNS if c + s in merged.columns]
    table = merged.loc[merged["_merge"] == "both", keys + columns].copy()
    for column in columns:
        if not column.startswith("status"):
            table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    table = table[table["estimate_original"].notna() & table["estimate_replication"].notna()]
    if table.empty:  # no row in common: nothing to compare (the caller says so in one line)
        return table.reset_index(drop=True)
    z = sps.norm.ppf(0.5 + ci_level / 2)
    se = [(table[f"ci_high{s}"] - table[f"ci_low{s}"]) / (2 * z) for s in SUFFIXES]
    difference = table["estimate_replication"] - table["estimate_original"]
    half = z * np.sqrt(se[0] ** 2 + se[1] ** 2)
    null = table["metric"].map(lambda metric: 1.0 if metric in RATIO_METRICS else 0.0).astype(float)
    table["difference"] = difference
    table["difference_ci_low"] = difference - half
    table["difference_ci_high"] = difference + half
    table["sign_agrees"] = np.sign(table["estimate_original"] - null) == np.sign(table["estimate_replication"] - null)
    table["ci_overlap"] = (table["ci_low_original"] <= table["ci_high_replication"]) & (
        table["ci_low_replication"] <= table["ci_high_original"]
    )
    table.loc[se[0].isna() | se[1].isna(), "ci_overlap"] = False
    table["within_tolerance"] = difference.abs() <= tolerance * table["estimate_original"].abs().clip(lower=1e-12)
    return table.reset_index(drop=True)


def compare_results(
    original: pd.DataFrame, replication: pd.DataFrame, *, tolerance: float = 0.25, ci_level: float = 0.95
) -> pd.DataFrame:
    """The replication table (:func:`agreement_rows`) of two results tables."""
    return agreement_rows(align(original, replication, RESULT_KEYS, "results.csv"), tolerance, ci_level)
