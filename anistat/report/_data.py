"""Normalisation of the results table and small formatting helpers shared by every renderer.

The report never trusts the dtypes it receives: a results table read back from ``results.csv``
has NaN where the in-memory one had ``""``, ints where it had strings, and so on. Everything the
renderers use goes through :func:`normalise_results`, so a CSV round trip renders identically.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from .. import _columns
from .. import vocabulary as vocab

#: Provenance columns of results.csv that the renderers read only where present (tables from older
#: bundles lack them): :func:`normalise_results` does not add them and keeps them like any extra column.
OPTIONAL_COLUMNS: tuple[str, ...] = ("p_test", "p_value_paper", "effect_size_kind", "se", "n_clusters")
#: The columns every normalised table has: results.csv's, in its order, less the optional ones.
RESULT_COLUMNS: tuple[str, ...] = tuple(c for c in _columns.RESULT_COLUMNS if c not in OPTIONAL_COLUMNS)
NUMERIC_COLUMNS: tuple[str, ...] = (
    "step",
    "rank",
    "dim",
    "estimate",
    "control_mean",
    "control_sd",
    "ci_low",
    "ci_high",
    "p_value",
    "p_adjusted",
    "effect_size",
    "n_controls",
    "n_sequences",
    "n_eff",
    "m_eff",
    "n_tokens",
)
STRING_COLUMNS: tuple[str, ...] = tuple(c for c in RESULT_COLUMNS if c not in NUMERIC_COLUMNS)

#: Column holding a token-frequency bucket label (optional, extra column).
BUCKET_COLUMNS: tuple[str, ...] = ("freq_bucket", "bucket", "frequency_bucket")
#: Metric names that encode a frequency bucket, e.g. ``energy_ratio_bucket_q1`` or
#: ``log2_energy_ratio_freq_bucket_high``.
BUCKET_METRIC_RE = re.compile(
    r"^(?P<base>energy_ratio|log2_energy_ratio|energy_fraction)_(?:freq_)?bucket_?(?P<bucket>.+)$"
)

METRIC_LABELS: dict[str, str] = vocab.METRIC_LABELS
METRIC_LABELS_TEX: dict[str, str] = vocab.METRIC_LABELS_TEX


def _as_label(value: Any) -> str:
    """Turn any cell into a stable string: NaN/None -> '', 3.0 -> '3', 'x' -> 'x'."""
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer():
            return str(int(value))
        return repr(value)
    if isinstance(value, (np.floating,)):
        return _as_label(float(value))
    if isinstance(value, (np.integer,)):
        return str(int(value))
    if value is pd.NA or value is pd.NaT:
        return ""
    return str(value)


def natural_key(value: Any) -> tuple:
    """Sort key that orders '2' before '10' and numbers before words."""
    s = _as_label(value)
    parts = re.split(r"(\d+)", s)
    key: list[tuple[int, Any]] = []
    for p in parts:
        if p == "":
            continue
        key.append((0, int(p)) if p.isdigit() else (1, p))
    return tuple(key)


def normalise_results(results: pd.DataFrame) -> pd.DataFrame:
    """Return a copy with every contract column present and with stable dtypes.

    Numeric columns become float64 (NaN where missing/unparseable); label columns become
    plain Python strings ('' where missing). Extra columns are kept (as labels unless numeric).
    """
    if not isinstance(results, pd.DataFrame):
        raise TypeError(f"results must be a pandas DataFrame, got {type(results).__name__}")
    df = results.reset_index(drop=True).copy()
    for col in RESULT_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan if col in NUMERIC_COLUMNS else ""
    for col in NUMERIC_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in STRING_COLUMNS:
        df[col] = pd.Series([_as_label(v) for v in df[col].tolist()], index=df.index, dtype=object)
    for col in df.columns:
        if col in RESULT_COLUMNS:
            continue
        if pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col]):
            df[col] = df[col].astype("float64")
        else:
            df[col] = pd.Series([_as_label(v) for v in df[col].tolist()], index=df.index, dtype=object)
    df.loc[df["status"] == "", "status"] = "ok"
    df.loc[df["control"] == "", "control"] = "none"
    df["status"] = df["status"].str.lower()
    # Where a layer hosts several sites the site joins the location label.
    multi_site = bool(len(df)) and df.groupby("layer")["site"].nunique().max() > 1
    df["_loc"] = [
        (f"L{layer}" if layer != "" else (site or "?")) + (f" {site}" if multi_site and site else "")
        for layer, site in zip(df["layer"], df["site"])
    ]
    df["_ok"] = (df["status"] == "ok") & df["estimate"].notna()
    return df


def ordered(values: Iterable[Any]) -> list[str]:
    """Unique labels in natural order."""
    return sorted({_as_label(v) for v in values}, key=natural_key)


def ordered_by_first(values: Iterable[Any]) -> list[str]:
    """Unique labels in order of first appearance (keeps the producer's model order)."""
    out: list[str] = []
    seen: set[str] = set()
    for v in values:
        s = _as_label(v)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def checkpoint_order(df: pd.DataFrame) -> list[str]:
    """Checkpoints ordered by step (then naturally)."""
    if df.empty:
        return []
    g = df.groupby("checkpoint")["step"].min()
    return sorted(g.index, key=lambda c: (np.inf if pd.isna(g[c]) else g[c], natural_key(c)))


def phase_last_checkpoints(df: pd.DataFrame) -> pd.DataFrame:
    """Per model and phase, the rows of the phase's last checkpoint (largest step).

    Without phase labels, the last checkpoint of each model is used.
    """
    if df.empty:
        return df
    keep = []
    for (_model, _phase), sub in df.groupby(["model", "phase"], sort=False):
        order = checkpoint_order(sub)
        keep.append(sub[sub["checkpoint"] == order[-1]])
    return pd.concat(keep) if keep else df.iloc[0:0]


def primary_choice(values: Iterable[str], preferred: str | None, defaults: tuple[str, ...]) -> str:
    vals = [v for v in ordered_by_first(values) if v not in ("", "none")]
    if preferred is not None and preferred in vals:
        return preferred
    for d in defaults:
        if d in vals:
            return d
    return vals[0] if vals else ""


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric.replace("_", " "))


# ---------------------------------------------------------------- numbers


def fmt_num(x: Any, precision: int = 3) -> str:
    """Significant-digit formatting without exponent for ordinary magnitudes; '' for NaN."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return ""
    if math.isnan(v):
        return ""
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    if mag < -4 or mag >= 9:
        return f"{v:.{max(precision - 1, 0)}e}"
    decimals = max(precision - 1 - mag, 0)
    s = f"{v:.{decimals}f}"
    if s.startswith("-") and float(s) == 0:
        s = s[1:]
    return s


def fmt_p(p: Any) -> str:
    try:
        v = float(p)
    except (TypeError, ValueError):
        return ""
    if math.isnan(v):
        return ""
    if v < 1e-16:  # below double precision's resolution near 1: not a number to quote
        return "< 1e-16"
    if v < 1e-4:
        return f"{v:.1e}"
    return fmt_num(v, 3) if v < 0.1 else f"{v:.3f}".rstrip("0").rstrip(".") if v < 1 else "1"


def sig_mark(p: Any, thresholds: tuple[float, ...]) -> str:
    """'*' per threshold passed (thresholds descending, e.g. (0.05, 0.01, 0.001))."""
    try:
        v = float(p)
    except (TypeError, ValueError):
        return ""
    if math.isnan(v):
        return ""
    return "*" * sum(v < t for t in thresholds)


def sig_thresholds(alpha: float) -> tuple[float, ...]:
    base = [alpha] + [t for t in (0.01, 0.001) if t < alpha]
    return tuple(base)


def bucket_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows describing token-frequency buckets, with columns ``_base`` and ``_bucket``.

    Two producer conventions are understood: an extra column ``freq_bucket`` (or ``bucket``)
    with a label on bucket rows, or metric names like ``energy_ratio_bucket_<label>``.
    """
    frames = []
    for col in BUCKET_COLUMNS:
        if col in df.columns:
            sub = df[(df[col].astype(str) != "") & df["_ok"]].copy()
            if len(sub):
                sub["_base"] = sub["metric"]
                sub["_bucket"] = sub[col].astype(str)
                frames.append(sub)
            break
    m = df["metric"].str.extract(BUCKET_METRIC_RE)
    hit = m["base"].notna() & df["_ok"]
    if hit.any():
        sub = df[hit].copy()
        sub["_base"] = m.loc[hit, "base"]
        sub["_bucket"] = m.loc[hit, "bucket"]
        frames.append(sub)
    if not frames:
        return df.iloc[0:0].assign(_base=pd.Series(dtype=object), _bucket=pd.Series(dtype=object))
    return pd.concat(frames)


# ---------------------------------------------------------------- what an interval is

#: The results' ``ci_method`` values in words.
CI_METHOD_TEXT: dict[str, str] = {
    name: m.label for name, m in (*vocab.CI_METHODS.items(), *vocab.FREQUENCY_INTERVALS.items())
}


def _count_range(values: pd.Series) -> str:
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return ""
    low, high = int(values.min()), int(values.max())
    return str(low) if low == high else f"{low}\u2013{high}"


def interval_phrase(rows: pd.DataFrame, ci_text: str, unit_hint: str = "") -> str:
    """What the intervals of ``rows`` are, from the rows themselves: level, method(s) and the
    resampling unit with its count per unit — e.g. "95 % studentized bootstrap intervals,
    resampling 38–41 documents per unit (the sequences cut from one document together)". ``""`` when no row has an interval. ``unit_hint`` is used for rows that do not
    record their resampling units (frequency-bucket rows)."""
    if rows.empty or not {"ci_low", "ci_high"} <= set(rows.columns):
        return ""
    low = pd.to_numeric(rows["ci_low"], errors="coerce")
    high = pd.to_numeric(rows["ci_high"], errors="coerce")
    with_ci = rows[np.isfinite(low) & np.isfinite(high)]
    if with_ci.empty:
        return ""
    methods = [
        m for m in ordered_by_first(with_ci.get("ci_method", pd.Series(dtype=str))) if m not in ("", "none", "nan")
    ]
    method = " / ".join(CI_METHOD_TEXT.get(m, m) for m in methods) or "bootstrap"
    clusters = pd.to_numeric(with_ci.get("n_clusters", pd.Series(np.nan, index=with_ci.index)), errors="coerce")
    sequences = pd.to_numeric(with_ci.get("n_sequences", pd.Series(np.nan, index=with_ci.index)), errors="coerce")
    if clusters.notna().any() and not clusters.fillna(-1).equals(sequences.fillna(-1)):
        unit = f"resampling {_count_range(clusters)} documents per unit (the sequences cut from one document together)"
    elif clusters.notna().any():
        unit = f"resampling {_count_range(clusters)} sequences per unit"
    elif unit_hint:
        unit = unit_hint
    elif sequences.notna().any():  # a table without n_clusters (an older bundle) resampled sequences
        unit = f"resampling {_count_range(sequences)} sequences per unit"
    else:
        unit = ""
    return f"{ci_text} {method} intervals" + (f", {unit}" if unit else "")
