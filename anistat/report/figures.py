"""Report figures: seaborn theme, Okabe–Ito colours, one function per figure.

Every figure function takes the normalised results (see ``_data.normalise_results``) and returns
a :class:`FigureSpec` or a reason string when its data is absent (the figure is then skipped,
never an error). Figures are built on :class:`matplotlib.figure.Figure` objects directly (no
pyplot state, no backend switching) and saved deterministically: no timestamps in PDFs or PNGs.
"""

from __future__ import annotations

import io
import math
import struct
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ._data import (
    bucket_rows,
    checkpoint_order,
    interval_phrase,
    metric_label,
    natural_key,
    ordered,
    ordered_by_first,
    phase_last_checkpoints,
)
from ._null_check import DEPENDENCE_CAVEAT, VERDICT_TEXT, grid_text

# Okabe & Ito (2008) colour-blind-safe palette.
OKABE_ITO = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "black": "#000000",
    "grey": "#8C8C8C",
}
PROXY_COLOUR = OKABE_ITO["blue"]
ORACLE_COLOUR = OKABE_ITO["green"]
ISOTROPIC_COLOUR = OKABE_ITO["black"]
CONTROL_COLOURS = (
    OKABE_ITO["orange"],
    OKABE_ITO["purple"],
    OKABE_ITO["vermillion"],
    OKABE_ITO["sky"],
    OKABE_ITO["yellow"],
    OKABE_ITO["grey"],
)
RANK_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"))
PHASE_MARKERS = {"early": ("o", "white"), "late": ("s", None)}

RC: dict[str, Any] = {
    "svg.hashsalt": "anistat",
    # User strings (model names with '$', …) must never be parsed as mathtext.
    "text.parse_math": False,
    "pdf.fonttype": 42,
    "font.family": "DejaVu Sans",
    "axes.titlesize": 10,
    # a fixed title position: matplotlib's automatic one measures the x axis' tick labels of every
    # panel at every draw (to dodge ticks on top, which these panels never have)
    "axes.titley": 1.0,
    "axes.labelsize": 9.5,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 8.5,
    "legend.title_fontsize": 9,
    "figure.dpi": 100,
    "savefig.bbox": None,
    "lines.linewidth": 1.6,
    "path.simplify": False,
}


@dataclass
class FigureSpec:
    name: str
    title: str
    caption: str
    fig: Figure


#: ``run_tasks(task, arguments) -> [task(*a) for a in arguments]``, in order, wherever it runs them.
TaskMap = Callable[[Callable[..., Any], Sequence[tuple[Any, ...]]], list[Any]]


@dataclass
class SavedFigure:
    name: str
    title: str
    caption: str
    pdf: Path
    png: Path
    png_bytes: bytes
    width: int
    height: int


def theme() -> ExitStack:
    """Context manager applying the report's seaborn theme without touching global state."""
    stack = ExitStack()
    rc = {}
    rc.update(sns.axes_style("whitegrid"))
    rc.update(sns.plotting_context("paper", font_scale=1.1))
    rc.update(RC)
    rc["axes.prop_cycle"] = mpl.cycler(color=[PROXY_COLOUR, *CONTROL_COLOURS])
    stack.enter_context(mpl.rc_context(rc))
    return stack


def control_colours(controls: Sequence[str]) -> dict[str, str]:
    return {c: CONTROL_COLOURS[i % len(CONTROL_COLOURS)] for i, c in enumerate(controls)}


def rank_styles(ranks: Sequence[Any]) -> dict[Any, tuple[Any, str]]:
    return {r: RANK_STYLES[i % len(RANK_STYLES)] for i, r in enumerate(ranks)}


def _rank_str(r: float) -> str:
    return str(int(r)) if not pd.isna(r) and float(r).is_integer() else str(r)


def _grid(
    n: int, *, ncols_max: int = 4, w: float = 3.3, h: float = 2.6, sharey: bool = False
) -> tuple[Figure, list[Any]]:
    ncols = min(n, ncols_max)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(w * ncols, h * nrows + 0.6))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _panels(df: pd.DataFrame, max_panels: int, with_rank: bool = False) -> tuple[list[tuple], str]:
    """(model, loc[, rank]) panels, thinned evenly when there are more than max_panels."""
    models = ordered_by_first(df["model"])
    keys: list[tuple] = []
    for m in models:
        sub = df[df["model"] == m]
        for loc in sorted(sub["_loc"].unique(), key=natural_key):
            if with_rank:
                for r in sorted(sub[sub["_loc"] == loc]["rank"].dropna().unique()):
                    keys.append((m, loc, r))
            else:
                keys.append((m, loc))
    note = ""
    if len(keys) > max_panels:
        idx = np.unique(np.linspace(0, len(keys) - 1, max_panels).round().astype(int))
        note = f" Showing {len(idx)} of {len(keys)} panels (evenly spaced)."
        keys = [keys[i] for i in idx]
    return keys, note


def _panel_title(key: tuple) -> str:
    title = f"{key[0]} \u00b7 {key[1]}"
    if len(key) > 2:
        title += f" \u00b7 k={_rank_str(key[2])}"
    return title


def _plain_log_axis(ax: Any, axis: str = "y") -> None:
    fmt = FuncFormatter(lambda v, _p: f"{v:g}")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(fmt)
    target.set_minor_formatter(NullFormatter())


def _fig_legend(fig: Figure, handles: list[Any], ncol: int | None = None) -> None:
    if not handles:
        return
    fig.legend(
        handles=handles, loc="lower center", ncol=ncol or min(len(handles), 6), frameon=False, bbox_to_anchor=(0.5, 0.0)
    )


#: Spacing of a panel grid, in inches: room for a panel's title above it, its y label and tick
#: labels on its left, its x tick labels (and label) below it, and the shared legend at the bottom.
GRID_MARGINS = {
    "left": 0.78,
    "right": 0.15,
    "top": 0.38,
    "bottom": 0.62,
    "wspace": 0.82,
    "hspace": 0.84,
    "legend_row": 0.3,
}


def _finish(fig: Figure, n_rows_of_legend: int = 1) -> None:
    """Lay out a panel grid with fixed spacing in inches (:data:`GRID_MARGINS`). `tight_layout`
    measures every tick label of every panel first — about 2 s for a 16-panel figure, the report's
    largest cost — while the report's panels share fonts and label lengths, so one spacing fits."""
    axes = [ax for ax in fig.axes if ax.get_subplotspec() is not None]
    if not axes:
        return
    nrows, ncols = axes[0].get_subplotspec().get_gridspec().get_geometry()
    width, height = fig.get_size_inches()
    m = GRID_MARGINS
    bottom = m["bottom"] + m["legend_row"] * n_rows_of_legend
    panel_w = max((width - m["left"] - m["right"] - (ncols - 1) * m["wspace"]) / ncols, 0.5)
    panel_h = max((height - m["top"] - bottom - (nrows - 1) * m["hspace"]) / nrows, 0.5)
    fig.subplots_adjust(
        left=m["left"] / width,
        right=1 - m["right"] / width,
        top=1 - m["top"] / height,
        bottom=bottom / height,
        wspace=m["wspace"] / panel_w,
        hspace=m["hspace"] / panel_h,
    )


# ------------------------------------------------------------------ figures


def fig_energy_ratio_trajectory(df: pd.DataFrame, ctx: dict[str, Any]) -> FigureSpec | str:
    data = df[df["_ok"] & (df["metric"] == "energy_ratio") & (df["proxy"] == ctx["proxy"])]
    data = data[data["step"].notna()]
    if data.empty:
        return "no energy_ratio rows with a training step"
    keys, note = _panels(data, ctx["max_panels"])
    controls = ordered_by_first(data["control"])
    ranks = sorted(data["rank"].dropna().unique())
    ccol = control_colours(controls)
    rsty = rank_styles(ranks)
    early = data[data["phase"] == "early"]["step"]
    late = data[data["phase"] == "late"]["step"]
    fig, axes = _grid(len(keys))
    positive = bool(data[["estimate", "ci_low"]].min(axis=None) > 0)
    for ax, key in zip(axes, keys):
        sub = data[(data["model"] == key[0]) & (data["_loc"] == key[1])]
        m_early = sub[sub["phase"] == "early"]["step"]
        m_late = sub[sub["phase"] == "late"]["step"]
        if len(m_early) and len(m_late):
            edge = (m_early.max() + m_late.min()) / 2
            ax.axvspan(sub["step"].min(), edge, color=OKABE_ITO["grey"], alpha=0.13, lw=0, zorder=0)
            ax.text(0.02, 0.97, "early", transform=ax.transAxes, ha="left", va="top", fontsize=8, color="0.35")
            ax.text(0.98, 0.97, "late", transform=ax.transAxes, ha="right", va="top", fontsize=8, color="0.35")
        for c in controls:
            for r in ranks:
                s = sub[(sub["control"] == c) & (sub["rank"] == r)].sort_values("step")
                if s.empty:
                    continue
                ls, mk = rsty[r]
                ax.plot(s["step"], s["estimate"], color=ccol[c], ls=ls, marker=mk, ms=4)
                lo, hi = s["ci_low"], s["ci_high"]
                if lo.notna().all() and hi.notna().all():
                    ax.fill_between(s["step"], lo, hi, color=ccol[c], alpha=0.18, lw=0)
        ax.axhline(1.0, color="0.3", lw=0.9, ls=(0, (4, 3)), zorder=1)
        if positive:
            ax.set_yscale("log")
            _plain_log_axis(ax)
        ax.set_title(_panel_title(key))
        ax.set_xlabel("training step")
        ax.set_ylabel("energy ratio R" + (" (log scale)" if positive else ""))
    handles: list[Any] = [Line2D([], [], color=ccol[c], lw=2, label=f"control: {c}") for c in controls]
    handles += [
        Line2D([], [], color="0.25", ls=rsty[r][0], marker=rsty[r][1], ms=4, label=f"k = {_rank_str(r)}") for r in ranks
    ]
    if len(early) and len(late):
        handles.append(Patch(color=OKABE_ITO["grey"], alpha=0.25, label="early phase"))
    _fig_legend(fig, handles)
    _finish(fig)
    bands = interval_phrase(data, ctx["ci_text"])
    cap = (
        "Energy ratio R = E(U) / mean E(Q) of the proxy (" + ctx["proxy"] + ") against each "
        "control kind, over "
        + ctx.get("step_word", "training steps")
        + ", per model and layer. "
        + (f"Bands: {bands}. " if bands else "No band: these rows carry no interval. ")
        + "The dashed line marks R = 1 (no enrichment); the shaded region is the early phase ("
        + ctx.get("phase_rule", "the first checkpoints")
        + ")."
    )
    return FigureSpec("energy_ratio_trajectory", "Energy ratio over training", cap + note, fig)


def fig_null_distribution(df: pd.DataFrame, ctx: dict[str, Any]) -> FigureSpec | str:
    data = df[
        df["_ok"] & (df["metric"] == "energy_fraction") & (df["proxy"] == ctx["proxy"]) & (df["control"] != "none")
    ]
    draws = ctx.get("control_draws")
    has_draws = (
        isinstance(draws, pd.DataFrame)
        and {"model", "rank", "control"}.issubset(draws.columns)
        and any(c in draws.columns for c in ("energy", "value", "estimate"))
    )
    if not has_draws:
        data = data[data["control_mean"].notna() & data["control_sd"].notna() & (data["control_sd"] > 0)]
    if data.empty:
        return "no energy_fraction rows with control mean and SD"
    # The last checkpoint of every model: the most-trained state.
    last = []
    for _m, sub in data.groupby("model", sort=False):
        last.append(sub[sub["checkpoint"] == checkpoint_order(sub)[-1]])
    data = pd.concat(last)
    keys, note = _panels(data, ctx["max_panels"], with_rank=True)
    controls = ordered_by_first(data["control"])
    ccol = control_colours(controls)
    fig, axes = _grid(len(keys), h=2.4)
    value_col = None
    if has_draws:
        value_col = next(c for c in ("energy", "value", "estimate") if c in draws.columns)
    for ax, key in zip(axes, keys):
        sub = data[(data["model"] == key[0]) & (data["_loc"] == key[1]) & (data["rank"] == key[2])]
        _null_panel(ax, key, sub, controls, ccol, draws if has_draws else None, value_col)
    handles: list[Any] = [Line2D([], [], color=PROXY_COLOUR, lw=2, label=f"proxy ({ctx['proxy']})")]
    handles += [Patch(color=ccol[c], alpha=0.5, label=f"control: {c}") for c in controls]
    _fig_legend(fig, handles)
    _finish(fig)
    ckpts = ", ".join(f"{m}: {sub['checkpoint'].iloc[0]}" for m, sub in data.groupby("model", sort=False))
    if has_draws:
        how = "Histograms of the raw control draws."
    else:
        how = (
            "Raw control draws are not part of the results table: each control distribution "
            "is drawn as a normal density with the recorded control mean and SD "
            "(an approximation for display only; p-values use the actual draws)."
        )
    cap = (
        f"Energy captured by random control subspaces versus the proxy (vertical line) at the "
        f"last {ctx.get('unit_noun', 'checkpoint')} of each model ({ckpts}). {how}"
    )
    return FigureSpec("null_distribution", "Control energies and the proxy", cap + note, fig)


def _null_panel(
    ax: Any,
    key: tuple,
    sub: pd.DataFrame,
    controls: list[str],
    ccol: dict[str, str],
    draws: pd.DataFrame | None,
    value_col: str | None,
) -> None:
    """One panel of the null-distribution figure: per control kind, the histogram of its raw draws
    (when the bundle has them) or else the normal density of its recorded mean and SD with the
    proxy's z-score, and the proxy's energy fraction as a vertical line."""
    proxy_val = float(sub["estimate"].iloc[0])
    lo_x, hi_x = proxy_val, proxy_val
    z_texts: list[tuple[str, str]] = []
    for c in controls:
        s = sub[sub["control"] == c]
        if s.empty:
            continue
        mu, sd = float(s["control_mean"].iloc[0]), float(s["control_sd"].iloc[0])
        raw = None if draws is None else _control_draws(draws, value_col, key, c, s)
        if raw is not None:
            sns.histplot(
                x=raw.to_numpy(),
                ax=ax,
                color=ccol[c],
                stat="density",
                alpha=0.45,
                edgecolor="white",
                linewidth=0.4,
                bins=min(20, max(5, len(raw) // 2)),
            )
            lo_x, hi_x = min(lo_x, raw.min()), max(hi_x, raw.max())
        elif sd > 0 and np.isfinite(mu):
            xs = np.linspace(mu - 4 * sd, mu + 4 * sd, 200)
            ys = np.exp(-0.5 * ((xs - mu) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
            ax.fill_between(xs, ys, color=ccol[c], alpha=0.35, lw=0)
            ax.plot(xs, ys, color=ccol[c], lw=1.2)
            lo_x, hi_x = min(lo_x, mu - 4 * sd), max(hi_x, mu + 4 * sd)
            z_texts.append((f"z({c}) = {(proxy_val - mu) / sd:.3g}", ccol[c]))
    ax.axvline(proxy_val, color=PROXY_COLOUR, lw=2)
    pad = 0.05 * (hi_x - lo_x if hi_x > lo_x else 1.0)
    ax.set_xlim(max(0.0, lo_x - pad), hi_x + pad)
    # Label z-scores beside the proxy line, on the side with room.
    x0, x1 = ax.get_xlim()
    right = (proxy_val - x0) / (x1 - x0 or 1.0) < 0.5
    for i, (text, colour) in enumerate(z_texts):
        ax.text(
            proxy_val,
            0.95 - 0.11 * i,
            (" " + text) if right else (text + " "),
            transform=ax.get_xaxis_transform(),
            ha="left" if right else "right",
            va="top",
            fontsize=7.5,
            color=colour,
        )
    ax.set_title(_panel_title(key))
    ax.set_xlabel("energy fraction")
    ax.set_ylabel("density")
    ax.set_yticks([])


def _control_draws(
    draws: pd.DataFrame, value_col: str | None, key: tuple, control: str, s: pd.DataFrame
) -> pd.Series | None:
    """The raw control draws of one panel's (model, rank) and control kind, matched on layer and
    checkpoint where the draws record them; None when fewer than two."""
    sel = (draws["model"].astype(str) == key[0]) & (draws["control"].astype(str) == control)
    sel &= pd.to_numeric(draws["rank"], errors="coerce") == key[2]
    if "layer" in draws.columns:
        sel &= draws["layer"].astype(str) == s["layer"].iloc[0]
    if "checkpoint" in draws.columns:
        sel &= draws["checkpoint"].astype(str) == s["checkpoint"].iloc[0]
    raw = pd.to_numeric(draws.loc[sel, value_col], errors="coerce").dropna()
    return raw if len(raw) >= 2 else None


def phase_last_text(data: pd.DataFrame) -> str:
    """The checkpoints a phase-last figure shows, by phase: "early step25, late step400" (the
    headline table names the same ones), with the models where they differ."""
    by_phase = []
    for phase in sorted(ordered_by_first(data["phase"]), key=lambda p: {"early": 0, "late": 1}.get(p, 2)):
        rows = data[data["phase"] == phase]
        labels = {
            model: "/".join(ordered_by_first(rows.loc[rows["model"] == model, "checkpoint"]))
            for model in ordered_by_first(rows["model"])
        }
        shown = (
            next(iter(labels.values()))
            if len(set(labels.values())) == 1
            else ", ".join(f"{label} ({model})" for model, label in labels.items())
        )
        by_phase.append(f"{phase or 'all'} {shown}")
    return ", ".join(by_phase)


def fig_forest(df: pd.DataFrame, ctx: dict[str, Any]) -> FigureSpec | str:
    metric = next((m for m in ("log2_energy_ratio", "energy_ratio") if (df["_ok"] & (df["metric"] == m)).any()), None)
    if metric is None:
        return "no log2_energy_ratio or energy_ratio rows"
    data = df[df["_ok"] & (df["metric"] == metric) & (df["proxy"] == ctx["proxy"])]
    data = phase_last_checkpoints(data)
    if data.empty:
        return f"no {metric} rows for proxy {ctx['proxy']}"
    items, note = _panels(data, max(ctx["max_panels"] * 4, 8), with_rank=True)
    controls = ordered_by_first(data["control"])
    phases = [p for p in ordered_by_first(data["phase"])]
    ccol = control_colours(controls)
    fig = Figure(figsize=(7.2, 0.42 * len(items) + 1.4))
    ax = fig.subplots()
    logx = metric == "energy_ratio" and bool(data[["estimate", "ci_low"]].min(axis=None) > 0)
    _forest_rows(ax, data, items, controls, phases, ccol)
    prev = None
    for yi, key in enumerate(items):
        if prev is not None and key[0] != prev:
            ax.axhline(yi - 0.5, color="0.6", lw=0.8)
        prev = key[0]
    ax.axvline(1.0 if metric == "energy_ratio" else 0.0, color="0.3", lw=0.9, ls=(0, (4, 3)))
    ax.set_yticks(range(len(items)))
    ax.set_yticklabels([_panel_title(k) for k in items])
    ax.set_ylim(len(items) - 0.5, -0.5)
    ax.grid(axis="y", visible=False)
    if logx:
        ax.set_xscale("log")
        _plain_log_axis(ax, "x")
    ax.set_xlabel(metric_label(metric) + (" (log scale)" if logx else ""))
    handles = _forest_legend_handles(controls, phases, ccol, ctx.get("unit_noun", "checkpoint"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), frameon=False)
    n_leg_rows = math.ceil(len(handles) / 4)
    fig.tight_layout(rect=(0, min(0.4, (0.3 * n_leg_rows + 0.15) / fig.get_figheight()), 1, 1))
    null = "0 (R = 1)" if metric != "energy_ratio" else "1"
    bars = interval_phrase(data, ctx["ci_text"]) or "no interval (these rows carry none)"
    cap = (
        f"Forest plot of {metric_label(metric)} with {bars}, "
        f"per model, layer and rank, at the last {ctx.get('unit_noun', 'checkpoint')} of each training phase "
        f"({phase_last_text(data)}; open circles: early, filled squares: late), for each control kind. The dashed line marks "
        f"no effect ({null})."
    )
    return FigureSpec("forest_effects", "Effect sizes across models, layers and ranks", cap + note, fig)


def _forest_rows(
    ax: Any, data: pd.DataFrame, items: list[tuple], controls: list[str], phases: list[str], ccol: dict[str, str]
) -> None:
    """One row per (model, location, rank): per control kind and phase, the estimate as the phase's
    marker and its interval as a line in the control's colour, each pair offset within the row."""
    n_off = len(controls) * len(phases)
    offsets = np.linspace(-0.3, 0.3, n_off) if n_off > 1 else np.zeros(1)
    for yi, key in enumerate(items):
        sub = data[(data["model"] == key[0]) & (data["_loc"] == key[1]) & (data["rank"] == key[2])]
        j = 0
        for c in controls:
            for ph in phases:
                s = sub[(sub["control"] == c) & (sub["phase"] == ph)]
                y = yi + offsets[j]
                j += 1
                if s.empty:
                    continue
                est = float(s["estimate"].iloc[0])
                lo, hi = float(s["ci_low"].iloc[0]), float(s["ci_high"].iloc[0])
                mk, face = PHASE_MARKERS.get(ph, ("D", None))
                if np.isfinite(lo) and np.isfinite(hi):
                    ax.plot([lo, hi], [y, y], color=ccol[c], lw=1.4)
                ax.plot(
                    [est],
                    [y],
                    marker=mk,
                    ms=5.5,
                    color=ccol[c],
                    markerfacecolor=face or ccol[c],
                    markeredgewidth=1.3,
                    ls="none",
                )


def _forest_legend_handles(controls: list[str], phases: list[str], ccol: dict[str, str], unit_noun: str) -> list[Any]:
    """The forest plot's legend: a line per control kind's colour, a marker per phase."""
    handles: list[Any] = [Line2D([], [], color=ccol[c], lw=2, label=f"control: {c}") for c in controls]
    for ph in phases:
        mk, face = PHASE_MARKERS.get(ph, ("D", None))
        handles.append(
            Line2D(
                [],
                [],
                color="0.25",
                marker=mk,
                ls="none",
                ms=5.5,
                markerfacecolor=face or "0.25",
                label=f"{ph or 'all'} (last {unit_noun})",
            )
        )
    return handles


def _last_ckpt(data: pd.DataFrame) -> pd.DataFrame:
    out = []
    for _m, sub in data.groupby("model", sort=False):
        out.append(sub[sub["checkpoint"] == checkpoint_order(sub)[-1]])
    return pd.concat(out) if out else data


def fig_proxy_oracle_controls(df: pd.DataFrame, ctx: dict[str, Any]) -> FigureSpec | str:
    ef = df[df["_ok"] & (df["metric"] == "energy_fraction") & (df["proxy"] == ctx["proxy"])]
    if ef.empty:
        return "no energy_fraction rows"
    orc = df[df["_ok"] & (df["metric"] == "oracle_fraction")]
    ef = _last_ckpt(ef)
    keys, note = _panels(ef, ctx["max_panels"])
    controls = [c for c in ordered_by_first(ef["control"]) if c != "none"]
    ccol = control_colours(controls)
    series = ["proxy", "oracle", *[f"control: {c}" for c in controls]]
    colours = {"proxy": PROXY_COLOUR, "oracle": ORACLE_COLOUR, **{f"control: {c}": ccol[c] for c in controls}}
    fig, axes = _grid(len(keys), h=2.7)
    width = 0.8 / len(series)
    any_oracle = False
    for ax, key in zip(axes, keys):
        sub = ef[(ef["model"] == key[0]) & (ef["_loc"] == key[1])]
        ck = sub["checkpoint"].iloc[0]
        osub = orc[(orc["model"] == key[0]) & (orc["_loc"] == key[1]) & (orc["checkpoint"] == ck)]
        ranks = sorted(sub["rank"].dropna().unique())
        for xi, r in enumerate(ranks):
            rs = sub[sub["rank"] == r]
            vals: dict[str, tuple[float, float, float]] = {}
            p = rs.iloc[0]
            vals["proxy"] = (p["estimate"], p["ci_low"], p["ci_high"])
            o = osub[osub["rank"] == r]
            if len(o):
                any_oracle = True
                vals["oracle"] = (o["estimate"].iloc[0], o["ci_low"].iloc[0], o["ci_high"].iloc[0])
            for c in controls:
                cs = rs[rs["control"] == c]
                if len(cs):
                    mu, sd = cs["control_mean"].iloc[0], cs["control_sd"].iloc[0]
                    vals[f"control: {c}"] = (mu, mu - sd, mu + sd)
            for si, s in enumerate(series):
                if s not in vals or not np.isfinite(vals[s][0]):
                    continue
                x = xi - 0.4 + width * (si + 0.5)
                v, lo, hi = vals[s]
                ax.bar(x, v, width=width * 0.92, color=colours[s], edgecolor="white", lw=0.5)
                if np.isfinite(lo) and np.isfinite(hi):
                    ax.plot([x, x], [max(lo, v * 1e-3), hi], color="0.15", lw=0.9)
            dim = rs["dim"].iloc[0]
            if np.isfinite(dim) and dim > 0:
                ax.plot([xi - 0.45, xi + 0.45], [r / dim] * 2, color=ISOTROPIC_COLOUR, lw=1.2, ls=(0, (2, 1.5)))
        ax.set_xticks(range(len(ranks)))
        ax.set_xticklabels([f"k = {_rank_str(r)}" for r in ranks])
        ax.set_yscale("log")
        _plain_log_axis(ax)
        ax.grid(axis="x", visible=False)
        ax.set_title(f"{_panel_title(key)} ({ck})")
        ax.set_ylabel("energy fraction (log)")
    handles: list[Any] = [Patch(color=colours[s], label=s) for s in series if s != "oracle" or any_oracle]
    handles.append(Line2D([], [], color=ISOTROPIC_COLOUR, ls=(0, (2, 1.5)), label="isotropic k/d"))
    _fig_legend(fig, handles)
    _finish(fig)
    whiskers = interval_phrase(ef, ctx["ci_text"])
    cap = (
        f"Share of true-gradient energy captured at the last {ctx.get('unit_noun', 'checkpoint')} of each model, per "
        "rank: the proxy E(U) ("
        + (f"with its {whiskers}" if whiskers else "no interval recorded")
        + "), the oracle E*\u2096 (top-k "
        "eigenvalues of G\u1d40G over its trace, the ceiling for any rank-k subspace), and the "
        "mean energy of each control kind (\u00b1 1 SD across control draws). The dashed "
        "tick is the isotropic expectation k/d."
    )
    return FigureSpec("proxy_oracle_controls", "Proxy vs oracle vs controls per rank", cap + note, fig)


def fig_delta_isoscore(df: pd.DataFrame, ctx: dict[str, Any]) -> FigureSpec | str:
    data = df[df["_ok"] & (df["metric"] == "delta_isoscore_star") & (df["proxy"] == ctx["proxy"])]
    if data.empty:
        return "no delta_isoscore_star rows"
    data = _last_ckpt(data)
    keys, note = _panels(data, ctx["max_panels"])
    controls = [c for c in ordered_by_first(data["control"]) if c != "none"]
    ccol = control_colours(controls)
    series = ["proxy", *controls]
    fig, axes = _grid(len(keys), h=2.6)
    off = np.linspace(-0.25, 0.25, len(series)) if len(series) > 1 else np.zeros(1)
    for ax, key in zip(axes, keys):
        sub = data[(data["model"] == key[0]) & (data["_loc"] == key[1])]
        ranks = sorted(sub["rank"].dropna().unique())
        for xi, r in enumerate(ranks):
            rs = sub[sub["rank"] == r]
            p = rs.iloc[0]
            ax.errorbar(
                [xi + off[0]],
                [p["estimate"]],
                yerr=[
                    [max(p["estimate"] - p["ci_low"], 0)] if np.isfinite(p["ci_low"]) else [0],
                    [max(p["ci_high"] - p["estimate"], 0)] if np.isfinite(p["ci_high"]) else [0],
                ],
                fmt="o",
                color=PROXY_COLOUR,
                ms=6,
                capsize=2.5,
                lw=1.3,
            )
            for ci, c in enumerate(controls, start=1):
                cs = rs[rs["control"] == c]
                if cs.empty or not np.isfinite(cs["control_mean"].iloc[0]):
                    continue
                mu, sd = cs["control_mean"].iloc[0], cs["control_sd"].iloc[0]
                ax.errorbar(
                    [xi + off[ci]],
                    [mu],
                    yerr=[[sd if np.isfinite(sd) else 0]] * 2,
                    fmt="s",
                    color=ccol[c],
                    ms=5,
                    capsize=2.5,
                    lw=1.3,
                )
        ax.axhline(0, color="0.3", lw=0.9, ls=(0, (4, 3)))
        ax.set_xticks(range(len(ranks)))
        ax.set_xticklabels([f"k = {_rank_str(r)}" for r in ranks])
        ax.set_xlim(-0.6, len(ranks) - 0.4)
        ax.grid(axis="x", visible=False)
        ax.set_title(f"{_panel_title(key)} ({sub['checkpoint'].iloc[0]})")
        ax.set_ylabel("\u0394IsoScore*")
    handles: list[Any] = [Line2D([], [], color=PROXY_COLOUR, marker="o", ls="none", label=f"proxy ({ctx['proxy']})")]
    handles += [Line2D([], [], color=ccol[c], marker="s", ls="none", label=f"control: {c}") for c in controls]
    _fig_legend(fig, handles)
    _finish(fig)
    whiskers = interval_phrase(data, ctx["ci_text"])
    cap = (
        "\u0394IsoScore*: IsoScore* of the gradients restricted to the complement of a "
        f"subspace minus IsoScore* of all gradients, at the last {ctx.get('unit_noun', 'checkpoint')} of each model. "
        "Positive values: removing the subspace makes the gradient cloud more isotropic. "
        + (f"Proxy with its {whiskers}" if whiskers else "Proxy as a point (its rows carry no interval)")
        + "; controls as mean \u00b1 1 SD over draws."
    )
    return FigureSpec("delta_isoscore", "\u0394IsoScore*: proxy vs controls", cap + note, fig)


def fig_frequency_buckets(df_all: pd.DataFrame, ctx: dict[str, Any]) -> FigureSpec | str:
    data = bucket_rows(df_all)
    if data.empty:
        return "no token-frequency bucket rows"
    base = next(
        (b for b in ("energy_ratio", "log2_energy_ratio", "energy_fraction") if (data["_base"] == b).any()),
        data["_base"].iloc[0],
    )
    data = data[data["_base"] == base]
    if (data["proxy"] == ctx["proxy"]).any():
        data = data[data["proxy"] == ctx["proxy"]]
    ctrl = ctx["control"] if (data["control"] == ctx["control"]).any() else data["control"].iloc[0]
    data = phase_last_checkpoints(data[data["control"] == ctrl])
    keys, note = _panels(data, ctx["max_panels"])
    buckets = ordered(data["_bucket"])
    phases = ordered_by_first(data["phase"])
    pcol = {
        p: c for p, c in zip(phases, (OKABE_ITO["sky"], OKABE_ITO["blue"], OKABE_ITO["vermillion"], OKABE_ITO["green"]))
    }
    fig, axes = _grid(len(keys), h=2.5)
    for ax, key in zip(axes, keys):
        sub = data[(data["model"] == key[0]) & (data["_loc"] == key[1])]
        for ph in phases:
            for r in sorted(sub["rank"].dropna().unique()):
                s = sub[(sub["phase"] == ph) & (sub["rank"] == r)]
                if s.empty:
                    continue
                s = s.assign(_x=[buckets.index(b) for b in s["_bucket"]]).sort_values("_x")
                mk, face = PHASE_MARKERS.get(ph, ("D", None))
                ax.errorbar(
                    s["_x"],
                    s["estimate"],
                    yerr=[
                        (s["estimate"] - s["ci_low"]).clip(lower=0).fillna(0),
                        (s["ci_high"] - s["estimate"]).clip(lower=0).fillna(0),
                    ],
                    color=pcol.get(ph, "0.3"),
                    marker=mk,
                    ms=5,
                    capsize=2,
                    lw=1.3,
                    markerfacecolor=face or pcol.get(ph, "0.3"),
                )
        if base == "energy_ratio":
            ax.axhline(1.0, color="0.3", lw=0.9, ls=(0, (4, 3)))
        ax.set_xticks(range(len(buckets)))
        ax.set_xticklabels(buckets)
        ax.set_xlim(-0.5, len(buckets) - 0.5)
        ax.grid(axis="x", visible=False)
        ax.set_title(_panel_title(key))
        ax.set_xlabel("token-frequency bucket")
        ax.set_ylabel(metric_label(base))
    handles = [
        Line2D(
            [],
            [],
            color=pcol.get(ph, "0.3"),
            marker=PHASE_MARKERS.get(ph, ("D",))[0],
            markerfacecolor=PHASE_MARKERS.get(ph, ("D", None))[1] or pcol.get(ph, "0.3"),
            label=f"{ph or 'all'} (last {ctx.get('unit_noun', 'checkpoint')})",
        )
        for ph in phases
    ]
    _fig_legend(fig, handles)
    _finish(fig)
    label = metric_label(base)
    cap = (
        f"{label[:1].upper() + label[1:]} (control: {ctrl}) per token-frequency bucket, "
        f"in the producer's bucket order, at the last {ctx.get('unit_noun', 'checkpoint')} of each phase "
        f"({phase_last_text(data)}); "
        + (interval_phrase(data, ctx["ci_text"], ctx.get("unit_hint", "")) or "no intervals recorded")
        + "."
    )
    return FigureSpec("frequency_buckets", "Token-frequency buckets", cap + note, fig)


def calibration_frame(calib: Any) -> pd.DataFrame | None:
    """Coerce extras['calibration'] into columns (group, nominal, observed, mcse)."""
    if calib is None:
        return None
    try:
        frame = calib.copy() if isinstance(calib, pd.DataFrame) else pd.DataFrame(calib)
    except (ValueError, TypeError):
        return None
    cols = {c.lower(): c for c in map(str, frame.columns)}

    def pick(*names: str) -> str | None:
        return next((cols[n] for n in names if n in cols), None)

    nominal = pick("nominal", "alpha", "level", "ci_level", "expected", "target")
    observed = pick("observed", "rejection_rate", "coverage", "empirical", "rate", "actual")
    if nominal is None or observed is None:
        return None
    group = pick("test", "method", "kind", "statistic", "procedure", "name")
    mcse = pick("mcse", "se", "mc_se", "stderr")
    out = pd.DataFrame(
        {
            "group": frame[group].astype(str) if group else "calibration",
            "nominal": pd.to_numeric(frame[nominal], errors="coerce"),
            "observed": pd.to_numeric(frame[observed], errors="coerce"),
            "mcse": pd.to_numeric(frame[mcse], errors="coerce") if mcse else np.nan,
        }
    ).dropna(subset=["nominal", "observed"])
    return out if len(out) else None


def fig_calibration(_df: pd.DataFrame, ctx: dict[str, Any]) -> FigureSpec | str:
    cal = calibration_frame(ctx.get("calibration"))
    if cal is None:
        return "no calibration data"
    groups = ordered_by_first(cal["group"])
    kinds = {}
    for g in groups:
        s = cal[cal["group"] == g]
        kinds[g] = "coverage" if ("cover" in g.lower() or s["nominal"].min() >= 0.5) else "rejection"
    panels = [k for k in ("rejection", "coverage") if k in kinds.values()]
    fig, axes = _grid(len(panels), w=3.8, h=3.3, ncols_max=2)
    gcol = {
        g: c
        for g, c in zip(
            groups, [OKABE_ITO[k] for k in ("blue", "orange", "green", "vermillion", "purple", "sky", "black")] * 5
        )
    }
    for ax, panel in zip(axes, panels):
        sub = cal[[kinds[g] == panel for g in cal["group"]]]
        lo = float(min(sub["nominal"].min(), sub["observed"].min()))
        hi = float(max(sub["nominal"].max(), sub["observed"].max()))
        pad = 0.08 * (hi - lo if hi > lo else 0.1)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.35", lw=1, ls=(0, (4, 3)))
        for g in ordered_by_first(sub["group"]):
            s = sub[sub["group"] == g].sort_values("nominal")
            err = 2 * s["mcse"].fillna(0)
            ax.errorbar(
                s["nominal"], s["observed"], yerr=err, color=gcol[g], marker="o", ms=4.5, capsize=2, lw=1.3, label=g
            )
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel("nominal level" if panel == "coverage" else "nominal \u03b1")
        ax.set_ylabel("observed coverage" if panel == "coverage" else "observed rejection rate")
        ax.set_title("CI coverage" if panel == "coverage" else "Type I error under the null")
        ax.legend(loc="upper left", frameon=True, fontsize=7.5)
    fig.tight_layout()
    cap = (
        "Calibration under a simulated null: observed rejection rates against nominal "
        "\u03b1 and observed CI coverage against the nominal level; error bars \u00b1 2 "
        "Monte-Carlo standard errors where given. A calibrated engine lies on the diagonal."
    )
    return FigureSpec("calibration", "Calibration of the statistical engine", cap, fig)


def fig_null_check(_df: pd.DataFrame, ctx: dict[str, Any]) -> FigureSpec | str:
    """QQ plot of an uninformative proxy's p-values against U(0, 1) (the run's own null check)."""
    checks = ctx.get("null_checks") or ()
    if not checks:
        return "no uninformative (random) proxy in this run"
    fig, axes = _grid(2, w=3.8, h=3.4, ncols_max=2)
    colours = {"exact": OKABE_ITO["blue"], "paper": OKABE_ITO["vermillion"]}
    labels = {"exact": "exact test (Haar draws)", "paper": "paper: normal controls (not exact)"}
    qq, rate = axes
    for check in checks:
        p = np.sort(np.asarray(check.p_values, dtype=float))
        expected = (np.arange(1, p.size + 1) - 0.5) / p.size
        qq.plot(
            expected,
            p,
            marker="o",
            ms=2.5,
            lw=0,
            color=colours.get(check.test, "0.3"),
            label=f"{labels.get(check.test, check.test)} (n = {p.size})",
        )
    qq.plot([0, 1], [0, 1], color="0.35", lw=1, ls=(0, (4, 3)))
    qq.set_xlabel("uniform quantile")
    qq.set_ylabel("observed p-value")
    qq.set_title("p-values against U(0, 1)")
    qq.legend(loc="upper left", fontsize=7)
    alpha = checks[0].alpha
    for i, check in enumerate(checks):
        rate.errorbar(
            [i],
            [check.rejection_rate],
            yerr=[[check.rejection_rate - check.rate_low], [check.rate_high - check.rejection_rate]],
            marker="o",
            capsize=4,
            color=colours.get(check.test, "0.3"),
        )
        # a Monte-Carlo p on a coarse grid: a valid test rejects floor(alpha·G)/G, not alpha
        rate.plot([i - 0.3, i + 0.3], [check.expected_rate] * 2, color="0.1", lw=2)
    rate.axhline(alpha, color="0.35", lw=1, ls=(0, (4, 3)))
    rate.set_xticks(range(len(checks)), [labels.get(c.test, c.test).split(" (")[0] for c in checks], fontsize=7)
    rate.set_xlim(-0.5, len(checks) - 0.5)
    rate.set_ylabel(f"share of p \u2264 {alpha:g} (95 % exact CI; bar: a valid test)")
    rate.set_title("Rejections under a true null")
    fig.tight_layout()
    verdicts = "; ".join(
        f"{labels.get(c.test, c.test)}: {c.rejection_rate:.3f} [{c.rate_low:.3f}, {c.rate_high:.3f}] against "
        f"{c.expected_rate:.3f} ({grid_text(c)}), binomial p = {c.binomial_p:.2g}, uniformity p = "
        f"{c.uniformity_p:.2g} \u2014 {VERDICT_TEXT.get(c.verdict, c.verdict)}"
        for c in checks
    )
    cap = (
        "Null check: every proxy here is a uniformly random subspace, so every null is true and a valid "
        f"test's p-values follow its null law (uniform on the grid of its Monte-Carlo draws). Share of "
        f"p \u2264 {alpha:g} with its exact binomial interval, the exact binomial test of that share against a "
        "valid test's share, and the uniformity test against the p-values' own null law (Kolmogorov\u2013Smirnov "
        f"distance, p by simulation): {verdicts}. {DEPENDENCE_CAVEAT}"
    )
    return FigureSpec("null_check", "Null check: an uninformative proxy", cap, fig)


FIGURES: tuple[tuple[str, Callable[[pd.DataFrame, dict[str, Any]], FigureSpec | str], bool], ...] = (
    # (name, function, takes the full table including bucket rows)
    ("energy_ratio_trajectory", fig_energy_ratio_trajectory, False),
    ("null_distribution", fig_null_distribution, False),
    ("forest_effects", fig_forest, False),
    ("proxy_oracle_controls", fig_proxy_oracle_controls, False),
    ("delta_isoscore", fig_delta_isoscore, False),
    ("frequency_buckets", fig_frequency_buckets, True),
    ("calibration", fig_calibration, False),
    ("null_check", fig_null_check, False),
)


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


def save_figure(spec: FigureSpec, fig_dir: Path, dpi: int) -> SavedFigure:
    # `tight_layout` leaves a placeholder layout engine behind, and with any engine set every
    # `savefig` first makes a whole extra (non-rendering) draw of the figure; the layout is
    # already final here, so drop the engine: same pixels and bytes, one draw per file. (With
    # None, matplotlib reads the autolayout rcParams: pinned off so a user's matplotlibrc cannot
    # turn this into a new layout pass.)
    with mpl.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        spec.fig.set_layout_engine(None)
    pdf = fig_dir / f"{spec.name}.pdf"
    png = fig_dir / f"{spec.name}.png"
    spec.fig.savefig(
        pdf,
        format="pdf",
        metadata={"CreationDate": None, "ModDate": None, "Producer": None, "Creator": "anistat report"},
    )
    buf = io.BytesIO()
    spec.fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    data = buf.getvalue()
    png.write_bytes(data)
    w, h = png_size(data)
    return SavedFigure(spec.name, spec.title, spec.caption, pdf, png, data, w, h)


def render_figures(
    main: pd.DataFrame,
    full: pd.DataFrame,
    ctx: dict[str, Any],
    fig_dir: Path,
    dpi: int,
    run_tasks: TaskMap | None = None,
) -> tuple[list[SavedFigure], dict[str, str]]:
    """Build and save every figure whose data exists; return them (in `FIGURES` order) and the
    skip reasons. ``run_tasks(task, arguments)`` → ``[task(*a) for a in arguments]`` in order
    (e.g. over worker processes, ``anistat.workers.map_tasks``) draws and saves them, one figure
    per task (the same files wherever: a figure's drawing depends on its inputs only)."""
    existed = fig_dir.is_dir()
    fig_dir.mkdir(parents=True, exist_ok=True)
    tasks = [(name, full if wants_full else main, ctx, fig_dir, dpi) for name, _, wants_full in FIGURES]
    drawn = run_tasks(draw_figure, tasks) if run_tasks is not None else [draw_figure(*t) for t in tasks]
    saved = [figure for figure in drawn if isinstance(figure, SavedFigure)]
    skipped = {name: figure for (name, *_), figure in zip(tasks, drawn) if isinstance(figure, str)}
    if not saved and not existed:
        fig_dir.rmdir()  # no figure: no empty folder
    return saved, skipped


def draw_figure(name: str, data: pd.DataFrame, ctx: dict[str, Any], fig_dir: Path, dpi: int) -> SavedFigure | str:
    """Figure ``name`` of `FIGURES` drawn from ``data`` and saved (its skip reason when its data is missing)."""
    function = {figure_name: fn for figure_name, fn, _ in FIGURES}[name]
    with theme(), warnings.catch_warnings():
        # Labels in scripts DejaVu lacks (CJK model names, …) render as boxes; not an error.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        result = function(data, ctx)
        if isinstance(result, str):
            return result
        # the figure is dropped with `result` (no pyplot registry holds it); clearing it
        # artist by artist first would only cost time
        return save_figure(result, fig_dir, dpi)
