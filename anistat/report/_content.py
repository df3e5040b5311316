"""What the report says: the shared context, summary facts and the methods section.

Both the HTML and the LaTeX renderers read the same :class:`ReportContext`, so the two documents
never disagree on a number or a setting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ._data import (
    checkpoint_order,
    flatten,
    fmt_num,
    fmt_p,
    get_path,
    metric_label,
    natural_key,
    ordered,
    ordered_by_first,
    phase_last_checkpoints,
    primary_choice,
    sig_mark,
    sig_thresholds,
)
from ._text import M, P, Para
from .options import ReportOptions

ELLIPSIS_SEP = ", \u2026"
QUESTION = (
    "Do low-rank directions derived from the model's own activations (tangent proxies) capture "
    "more of the true training-gradient energy than matched random subspaces of the same rank?"
)

CONTROL_DESCRIPTIONS: dict[str, tuple[str, str]] = {
    "normal": ("QR of (I \u2212 UU\u1d40)Z with Gaussian Z: random directions in the orthogonal "
               "complement of the proxy (the paper's control)",
               r"QR of $(I - UU^{\top})Z$ with Gaussian $Z$: random directions in the orthogonal "
               r"complement of the proxy (the paper's control)"),
    "haar": ("QR of a Gaussian Z: uniform over all k-dimensional subspaces",
             r"QR of a Gaussian $Z$: uniform over all $k$-dimensional subspaces"),
    "pca_span": ("a random k-subspace inside the top-m principal subspace of the activations "
                 "(a hard control: does the proxy beat any high-variance direction?)",
                 r"a random $k$-subspace inside the top-$m$ principal subspace of the activations "
                 r"(a hard control: does the proxy beat any high-variance direction?)"),
    "cov_matched": ("QR of \u03a3_A^{1/2} Z: random directions shaped like the activation "
                    "covariance",
                    r"QR of $\Sigma_A^{1/2} Z$: random directions shaped like the activation "
                    r"covariance"),
}


@dataclass
class ReportContext:
    full: pd.DataFrame
    main: pd.DataFrame
    manifest: dict[str, Any]
    claims: list[dict[str, Any]]
    extras: dict[str, Any]
    options: ReportOptions
    protocol: dict[str, Any] = field(init=False)
    title: str = field(init=False)
    name: str = field(init=False)
    description: str = field(init=False)
    proxy: str = field(init=False)
    control: str = field(init=False)
    alpha: float = field(init=False)
    thresholds: tuple[float, ...] = field(init=False)
    p_col: str = field(init=False)
    ci_level: float | None = field(init=False)
    ci_text: str = field(init=False)

    def __post_init__(self) -> None:
        proto = self.manifest.get("protocol")
        self.protocol = dict(proto) if isinstance(proto, Mapping) else {}
        self.name = str(self.protocol.get("name") or "anistat")
        self.title = str(self.options.title or self.protocol.get("title") or self.name)
        self.description = str(self.protocol.get("description") or "")
        self.proxy = primary_choice(self.main["proxy"], self.options.primary_proxy, ("pca",))
        self.control = primary_choice(self.main["control"], self.options.primary_control,
                                      ("normal",))
        alpha = _num(get_path(self.protocol, "stats.alpha", "alpha"))
        self.alpha = alpha if alpha is not None and 0 < alpha < 1 else 0.05
        self.thresholds = sig_thresholds(self.alpha)
        self.p_col = "p_adjusted" if self.main["p_adjusted"].notna().any() else "p_value"
        lvl = _num(get_path(self.protocol, "stats.ci_level", "stats.confidence_level",
                            "ci_level"))
        if lvl is not None and lvl > 1:
            lvl = lvl / 100
        self.ci_level = lvl if lvl is not None and 0 < lvl < 1 else None
        self.ci_text = f"{self.ci_level * 100:g}\u00a0%" if self.ci_level else "bootstrap"

    # ------------------------------------------------------------ helpers

    def fmt(self, x: Any) -> str:
        return fmt_num(x, self.options.precision)

    def mark(self, p: Any) -> str:
        return sig_mark(p, self.thresholds)

    def legend_text(self) -> str:
        which = "Holm/BH-adjusted p" if self.p_col == "p_adjusted" else "unadjusted p"
        method = get_path(self.protocol, "stats.multiplicity.method", "stats.multiplicity",
                          "stats.correction")
        if self.p_col == "p_adjusted" and isinstance(method, str):
            which = f"{method}-adjusted p"
        parts = [f"{'*' * (i + 1)} {which} < {t:g}" for i, t in enumerate(self.thresholds)]
        return "; ".join(parts)

    @property
    def failed(self) -> pd.DataFrame:
        return self.full[self.full["status"] != "ok"]

    def n_units(self) -> int:
        return int(self.full.groupby(["model", "checkpoint", "layer", "site"]).ngroups) \
            if len(self.full) else 0


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


# ---------------------------------------------------------------- summary


@dataclass
class Headline:
    """Energy ratios of the primary proxy vs the primary control at phase-last checkpoints."""

    columns: list[tuple[str, str, float]]  # (phase, checkpoint label per model varies, rank)
    rows: list[tuple[str, str, list[tuple[str, str, str, str] | None]]]
    # (model, loc, cells: (estimate, ci text, p text, mark) or None)


def headline(ctx: ReportContext) -> Headline | None:
    d = ctx.main
    d = d[(d["metric"] == "energy_ratio") & (d["proxy"] == ctx.proxy)
          & (d["control"] == ctx.control)]
    if d.empty:
        return None
    d = phase_last_checkpoints(d)
    phases = ordered_by_first(d["phase"])
    phases = sorted(phases, key=lambda p: {"early": 0, "late": 1}.get(p, 2))
    ranks = sorted(d["rank"].dropna().unique())
    cols = [(ph, "", r) for ph in phases for r in ranks]
    rows = []
    for model in ordered_by_first(d["model"]):
        dm = d[d["model"] == model]
        for loc in sorted(dm["_loc"].unique(), key=natural_key):
            cells: list[tuple[str, str, str, str] | None] = []
            for ph, _c, r in cols:
                s = dm[(dm["_loc"] == loc) & (dm["phase"] == ph) & (dm["rank"] == r)]
                if s.empty:
                    cells.append(None)
                    continue
                row = s.iloc[0]
                if row["status"] != "ok" or pd.isna(row["estimate"]):
                    cells.append(("failed", "", "", ""))
                    continue
                ci = (f"[{ctx.fmt(row['ci_low'])}, {ctx.fmt(row['ci_high'])}]"
                      if pd.notna(row["ci_low"]) else "")
                cells.append((ctx.fmt(row["estimate"]), ci, fmt_p(row[ctx.p_col]),
                              ctx.mark(row[ctx.p_col])))
            rows.append((model, loc, cells))
    return Headline(cols, rows)


@dataclass
class FrequencyCorrelations:
    """Spearman ρ of log corpus frequency with the Bessel-corrected RMS distance of a token
    type's activations to its centroid (``frequency.csv``), one row per model × checkpoint and
    one column per site."""

    sites: list[str]
    rows: list[tuple[str, str, list[tuple[str, str] | None]]]  # (model, checkpoint, (ρ, CI text))
    ci_methods: list[str]
    notes: list[str]


def frequency_correlations(ctx: ReportContext) -> FrequencyCorrelations | None:
    frequency = ctx.extras.get("frequency")
    if not isinstance(frequency, pd.DataFrame) or frequency.empty or "metric" not in frequency:
        return None
    d = frequency[frequency["metric"] == "spearman_logfreq_distance"]
    if d.empty or not {"model", "checkpoint", "site", "estimate"} <= set(d.columns):
        return None
    sites = sorted({str(v) for v in d["site"]}, key=natural_key)
    rows = []
    for model in ordered_by_first(d["model"]):
        dm = d[d["model"].astype(str) == model]
        for checkpoint in ordered_by_first(dm["checkpoint"]):
            cells: list[tuple[str, str] | None] = []
            for site in sites:
                hit = dm[(dm["checkpoint"].astype(str) == checkpoint) & (dm["site"].astype(str) == site)]
                if hit.empty:
                    cells.append(None)
                    continue
                row = hit.iloc[0]
                low, high = row.get("ci_low"), row.get("ci_high")
                ci = f"[{ctx.fmt(low)}, {ctx.fmt(high)}]" if pd.notna(low) and pd.notna(high) else ""
                cells.append((ctx.fmt(row["estimate"]), ci))
            rows.append((model, checkpoint, cells))
    methods_used = sorted({str(m) for m in d.get("ci_method", pd.Series(dtype=str)).dropna() if str(m)})
    # why a row has no interval (memory cap, sums not kept) — the rows the analysis left without a CI
    without_ci = d[d["ci_method"].astype(str) == "none"] if "ci_method" in d else d.iloc[0:0]
    notes = sorted({str(n) for n in without_ci.get("note", pd.Series(dtype=str)).dropna() if str(n)})
    return FrequencyCorrelations(sites, rows, methods_used, notes)


FREQUENCY_CAPTION = (
    "Spearman \u03c1 between a token type's log corpus frequency and the RMS distance of its "
    "activations to the type's centroid (Bessel-corrected: \u221a(\u03a3\u2016a\u2212c\u2016\u00b2/(n\u22121))), over the "
    "types seen at least twice in the test split. Negative: frequent tokens sit closer to their "
    "centroid. Intervals resample test sequences; every resample recomputes each type's centroid. "
    "A basic interval is the percentile interval reflected about the estimate, which removes the "
    "bootstrap's bias; where that bias is large the interval can exclude the estimate (the note "
    "column of frequency.csv says so). Pearson r of the same pairs is in frequency.csv."
)


def summary_sentences(ctx: ReportContext) -> list[str]:
    """Plain-text headline findings (escaped by the renderer)."""
    out: list[str] = []
    d = ctx.main[ctx.main["_ok"] & (ctx.main["proxy"] == ctx.proxy)]
    er = d[(d["metric"] == "energy_ratio") & (d["control"] == ctx.control)]
    if len(er):
        p = er[ctx.p_col]
        sig = int(((p < ctx.alpha) & (er["estimate"] > 1)).sum())
        tested = int(p.notna().sum())
        pword = "adjusted " if ctx.p_col == "p_adjusted" else ""
        txt = (f"Against {ctx.control} controls, the {ctx.proxy} proxy's energy ratio exceeds 1 "
               f"in {int((er['estimate'] > 1).sum())} of {len(er)} comparisons "
               f"(model \u00d7 checkpoint \u00d7 layer \u00d7 rank)")
        if tested:
            txt += f"; significantly so ({pword}p < {ctx.alpha:g}) in {sig} of {tested}"
        out.append(txt + ".")
        for model in ordered_by_first(er["model"]):
            em = er[er["model"] == model]
            obj = em["objective"].iloc[0]
            parts = []
            for ph in sorted(ordered_by_first(em["phase"]),
                             key=lambda p: {"early": 0, "late": 1}.get(p, 2)):
                ep = em[em["phase"] == ph]["estimate"]
                lab = ph or "all checkpoints"
                parts.append(f"{lab}: median R = {ctx.fmt(ep.median())} "
                             f"(range {ctx.fmt(ep.min())}\u2013{ctx.fmt(ep.max())})")
            out.append(f"{model}{f' ({obj})' if obj else ''}: " + "; ".join(parts) + ".")
    iso = d[(d["metric"] == "delta_isoscore_star") & (d["control"] == ctx.control)]
    iso = iso[iso["control_mean"].notna()]
    if len(iso):
        above = int((iso["estimate"] > iso["control_mean"]).sum())
        out.append(f"Removing the proxy raises IsoScore* more than removing a {ctx.control} "
                   f"control (mean over draws) in {above} of {len(iso)} comparisons "
                   f"(median \u0394IsoScore* {ctx.fmt(iso['estimate'].median())} vs "
                   f"{ctx.fmt(iso['control_mean'].median())}).")
    n_failed = len(ctx.failed)
    if n_failed:
        units = ctx.failed.groupby(["model", "checkpoint", "layer", "site"]).ngroups
        out.append(f"{units} unit(s) failed ({n_failed} result rows); details under Failed units.")
    return out


# ---------------------------------------------------------------- methods


def _join(items: list[str]) -> str:
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def methods(ctx: ReportContext) -> list[Para]:
    """Methods paragraphs generated from the protocol, the manifest and the results."""
    proto, man, df = ctx.protocol, ctx.manifest, ctx.full
    paras: list[Para] = []

    # Design.
    model_bits = []
    for model in ordered_by_first(df["model"]):
        dm = df[df["model"] == model]
        obj = dm["objective"].iloc[0]
        ck = checkpoint_order(dm)
        dims = ordered(dm["dim"].dropna().astype(int))
        bits = [obj.upper() if obj else "", f"d = {'/'.join(dims)}" if dims else "",
                f"{len(ck)} checkpoint{'s' if len(ck) != 1 else ''}"
                + (f" ({ck[0]} \u2026 {ck[-1]})" if len(ck) > 1 else f" ({ck[0]})" if ck else "")]
        early = ordered_by_first(dm.loc[dm["phase"] == "early", "checkpoint"])
        if early:
            bits.append(f"early phase: {', '.join(early)}")
        model_bits.append(f"{model} (" + "; ".join(b for b in bits if b) + ")")
    sites = ordered(df["site"]) or ordered(df["layer"])
    n_seq = df["n_sequences"].dropna()
    n_tok = df["n_tokens"].dropna()
    seg = [f"We analysed {len(model_bits)} model{'s' if len(model_bits) != 1 else ''}: "
           f"{_join(model_bits)}. Hidden states were read at {len(sites)} site"
           f"{'s' if len(sites) != 1 else ''} ({', '.join(sites[:12])}"
           f"{ELLIPSIS_SEP if len(sites) > 12 else ''}). "]
    if len(n_seq):
        seg.append(f"Each unit (model \u00d7 checkpoint \u00d7 site) was evaluated on "
                   f"{_range_text(n_seq)} test sequences")
        if len(n_tok):
            seg.append(f" ({_range_text(n_tok)} tokens)")
        seg.append(". ")
    corpus = get_path(proto, "data.corpus", "corpus", "data.name", "data")
    if isinstance(corpus, (str, int, float)) and corpus != "":
        seg.append(f"Text: {corpus}. ")
    seed = get_path(proto, "seed", "seeds")
    if seed is not None:
        seg.append(f"Random seed: {seed}. ")
    paras.append(P(*seg, heading="Design"))

    # Proxies.
    methods_used = ordered_by_first(df["proxy"][df["proxy"] != ""])
    ranks = [str(int(r)) for r in sorted(df["rank"].dropna().unique())]
    fit = get_path(proto, "proxies.fit_window", "proxies.fit_fraction", "proxies.fit",
                   "fit_window")
    seg = [f"Tangent proxies U (orthonormal d \u00d7 k bases) of rank k \u2208 "
           f"{{{', '.join(ranks)}}} were fitted with {_join(methods_used) or 'the protocol method'}"
           " on activations of the fit split"]
    if fit is not None and not isinstance(fit, Mapping):
        seg.append(f" of the early part of training (fit window: {fit})")
    elif "early" in set(df["phase"]):
        seg.append(" of the early checkpoints")
    seg.append(", then frozen. PCA uses the top-k right singular vectors of the centred "
               "activations; other methods are orthonormalised by QR. Gradients "
               )
    seg.append(M("<i>g<sub>i</sub></i> = \u2202<i>L</i>/\u2202<i>h<sub>i</sub></i>",
                 r"$g_i = \partial L / \partial h_i$"))
    seg.append(" of the model's own training loss (next-token cross-entropy for CLM, masked-token "
               "cross-entropy for MLM) were taken at the same sites on the held-out test split.")
    paras.append(P(*seg, heading="Proxies and gradients"))

    # Controls.
    controls = [c for c in ordered_by_first(df["control"]) if c not in ("", "none")]
    n_ctrl = df["n_controls"].dropna()
    n_decl = get_path(proto, "controls.n", "controls.n_controls", "n_controls")
    n_text = (str(int(n_ctrl.iloc[0])) if len(n_ctrl) and n_ctrl.nunique() == 1
              else _range_text(n_ctrl) if len(n_ctrl) else str(n_decl) if n_decl else "n")
    seg = [f"Each proxy was compared with {n_text} random control subspaces of the same rank "
           f"per control kind: "]
    for i, c in enumerate(controls):
        h, l = CONTROL_DESCRIPTIONS.get(c, (None, None))
        if h is None:
            seg.append(f"{c}")
        else:
            seg.extend([f"{c} (", M(_escape_h(h), l), ")"])
        seg.append("; " if i < len(controls) - 1 else ". ")
    if not controls:
        seg.append("none recorded. ")
    seg.append("Control draws are seeded and identical across devices.")
    paras.append(P(*seg, heading="Controls"))

    # Metrics with formulas.
    metrics = set(df["metric"])
    seg = []
    seg += ["The energy fraction of a basis Q is ",
            M("<i>E</i>(<i>Q</i>) = \u03a3<sub><i>i</i></sub> \u2016<i>Q</i><sup>\u22a4</sup>"
              "<i>g<sub>i</sub></i>\u2016\u00b2 / \u03a3<sub><i>i</i></sub> \u2016<i>g<sub>i"
              "</sub></i>\u2016\u00b2",
              r"$E(Q) = \sum_i \lVert Q^{\top} g_i \rVert^2 / \sum_i \lVert g_i \rVert^2$"),
            " (for a uniformly random subspace its expectation is k/d). "]
    if "oracle_fraction" in metrics:
        seg += ["The oracle ", M("<i>E</i>*<sub><i>k</i></sub>", r"$E^{*}_{k}$"),
                " is the sum of the top-k eigenvalues of ",
                M("<i>G</i><sup>\u22a4</sup><i>G</i>", r"$G^{\top}G$"),
                " over its trace, the most any rank-k subspace can capture. "]
    if metrics & {"energy_ratio", "log2_energy_ratio"}:
        seg += ["The energy ratio is ",
                M("<i>R</i> = <i>E</i>(<i>U</i>) / mean<sub><i>j</i></sub> <i>E</i>(<i>Q<sub>j"
                  "</sub></i>)", r"$R = E(U) / \overline{E(Q_j)}$"),
                " (also reported as log\u2082 R and as z = (E(U) \u2212 mean)/SD). "]
    if "anisotropy_capture" in metrics:
        seg += ["Anisotropy capture is ",
                M("(<i>E</i>(<i>U</i>) \u2212 <i>k</i>/<i>d</i>) / (<i>E</i>*<sub><i>k</i></sub>"
                  " \u2212 <i>k</i>/<i>d</i>)", r"$(E(U) - k/d) / (E^{*}_{k} - k/d)$"),
                ", the share of the attainable above-isotropic energy captured by the proxy. "]
    if "delta_isoscore_star" in metrics:
        c0 = get_path(proto, "isoscore.C0", "isoscore.c0", "stats.isoscore.C0")
        zeta = get_path(proto, "isoscore.zeta", "stats.isoscore.zeta")
        seg += ["\u0394IsoScore*(Q) is the IsoScore* (Rudman et al.) of the gradients expressed in "
                "the (d \u2212 k) coordinates of the complement of Q minus the IsoScore* of all "
                "gradients"]
        if c0 is not None or zeta is not None:
            seg.append(f" (shrinkage target C0 = {c0 if c0 is not None else 'default'}, "
                       f"\u03b6 = {zeta if zeta is not None else 'default'})")
        seg.append(". ")
    if "hedges_g" in metrics:
        seg.append("Hedges' g is the bias-corrected standardised mean difference between the "
                   "per-sequence energy fractions of the proxy and of the controls. ")
    extra = sorted(m for m in metrics if m not in {
        "energy_fraction", "energy_ratio", "log2_energy_ratio", "oracle_fraction",
        "anisotropy_capture", "delta_isoscore_star", "hedges_g"})
    if extra:
        seg.append(f"Further metrics reported: {', '.join(extra[:20])}"
                   f"{ELLIPSIS_SEP if len(extra) > 20 else ''}. ")
    paras.append(P(*seg, heading="Metrics"))

    # Statistics.
    st = get_path(proto, "stats") or {}
    seg = ["The sampling unit is the sequence. The control draw is tested with the one-sided "
           "Monte-Carlo p-value ",
           M("<i>p</i> = (1 + #{<i>j</i>: <i>E</i>(<i>Q<sub>j</sub></i>) \u2265 <i>E</i>(<i>U"
             "</i>)}) / (1 + <i>n</i>)",
             r"$p = (1 + \#\{j : E(Q_j) \geq E(U)\}) / (1 + n)$")]
    if len(n_ctrl):
        nmin = int(n_ctrl.max())
        seg.append(f" (smallest attainable p with n = {nmin}: 1/{nmin + 1} = "
                   f"{fmt_num(1 / (nmin + 1), 3)})")
    seg.append("; the data by a paired sign-flip permutation test over per-sequence differences")
    n_perm = get_path(st, "n_permutations", "permutations")
    if n_perm is not None:
        seg.append(f" ({n_perm} permutations)")
    n_boot = get_path(st, "n_bootstrap", "n_resamples", "bootstrap")
    seg.append(". Confidence intervals")
    if ctx.ci_level:
        seg.append(f" ({ctx.ci_level * 100:g} %)")
    seg.append(" come from a cluster bootstrap over sequences")
    if n_boot is not None and not isinstance(n_boot, Mapping):
        seg.append(f" with {n_boot} resamples")
    used = df.loc[df["ci_method"] != "", "ci_method"].value_counts()
    if len(used):
        seg.append("; interval methods used: " + ", ".join(
            f"{m} ({n} rows)" for m, n in sorted(used.items(), key=lambda kv: (-kv[1], kv[0]))))
        if "percentile" in used.index and any(m.lower() == "bca" for m in used.index):
            seg.append(" (BCa where valid, percentile fallback with the reason in the note)")
    seg.append(". ")
    mult = get_path(st, "multiplicity")
    mmethod = get_path(st, "multiplicity.method", "correction", "multiplicity_method")
    if isinstance(mult, str):
        mmethod = mult
    family = get_path(st, "multiplicity.family", "family")
    if mmethod or family:
        seg.append(f"Multiplicity: {mmethod or 'adjusted'} correction")
        if family:
            fam = family if isinstance(family, str) else ", ".join(map(str, family)) \
                if isinstance(family, (list, tuple)) else str(family)
            seg.append(f" over the family {fam}")
        seg.append(". ")
    elif ctx.p_col == "p_adjusted":
        seg.append("p-values were adjusted for multiplicity as declared by the protocol. ")
    seg.append(f"Significance level \u03b1 = {ctx.alpha:g}; marks: {ctx.legend_text()}.")
    paras.append(P(*seg, heading="Statistics"))

    # Software.
    versions = man.get("versions")
    seg = []
    if isinstance(versions, Mapping) and versions:
        seg.append("Software: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ". ")
    for key, label in (("device", "Device"), ("dtype", "dtype")):
        if man.get(key) not in (None, ""):
            seg.append(f"{label}: {man[key]}. ")
    if man.get("protocol_sha256"):
        seg.append(f"Protocol sha256: {man['protocol_sha256']}. ")
    if man.get("started_at") or man.get("finished_at"):
        seg.append(f"Run: {man.get('started_at', '?')} \u2192 {man.get('finished_at', '?')}. ")
    t = unit_timing(man.get("units"))
    if t:
        seg.append(t)
    if seg:
        paras.append(P(*seg, heading="Software and run"))
    return paras


def _escape_h(text: str) -> str:
    from ._text import esc

    return esc(text)


def _range_text(s: pd.Series) -> str:
    vals = s.dropna().astype(float)
    if vals.empty:
        return ""
    lo, hi = vals.min(), vals.max()
    f = (lambda v: str(int(v)) if float(v).is_integer() else fmt_num(v, 3))
    return f(lo) if lo == hi else f"{f(lo)}\u2013{f(hi)}"


def unit_timing(units: Any) -> str:
    """'Per-unit timings: n units, total s (median s).' from a list or dict of timings."""
    secs: list[float] = []
    if isinstance(units, Mapping):
        items = list(units.values())
    elif isinstance(units, (list, tuple)):
        items = list(units)
    else:
        return ""
    for it in items:
        v = it
        if isinstance(it, Mapping):
            v = next((it[k] for k in ("seconds", "wall_s", "elapsed_s", "duration_s", "time_s",
                                      "elapsed", "duration") if k in it), None)
        f = _num(v)
        if f is not None:
            secs.append(f)
    if not secs:
        return f"Units: {len(items)}. " if items else ""
    return (f"Per-unit timings: {len(secs)} units, total {fmt_num(sum(secs), 3)} s "
            f"(median {fmt_num(float(np.median(secs)), 3)} s). ")


def settings_rows(ctx: ReportContext) -> list[tuple[str, str, str]]:
    """(section, key, value) for every protocol setting and every other manifest field."""
    rows: list[tuple[str, str, str]] = []
    for k, v in flatten(ctx.protocol):
        rows.append(("protocol", k, v))
    for key, val in ctx.manifest.items():
        if key == "protocol":
            continue
        if key == "units" and isinstance(val, (list, tuple, Mapping)):
            rows.append(("manifest", "units", unit_timing(val).strip() or f"{len(val)} entries"))
            continue
        for k, v in flatten(val, key):
            rows.append(("manifest", k, v))
    return rows


def claim_evidence_items(evidence: Any) -> list[tuple[str, str]] | str:
    if evidence is None:
        return ""
    if isinstance(evidence, Mapping):
        return flatten(evidence)
    return str(evidence)


def failed_units(ctx: ReportContext) -> list[tuple[str, str, str, str, str, int]]:
    """(model, checkpoint, layer, site, reason, n rows) per failed unit and distinct reason."""
    f = ctx.failed
    out = []
    if f.empty:
        return out
    for (m, ck, layer, site, note), g in f.groupby(
            ["model", "checkpoint", "layer", "site", "note"], sort=False):
        out.append((m, ck, layer, site, note or "(no reason recorded)", len(g)))
    return out


def metric_names(ctx: ReportContext) -> list[str]:
    return ordered_by_first(ctx.full["metric"])


__all__ = [
    "QUESTION", "ReportContext", "headline", "summary_sentences", "methods", "settings_rows",
    "claim_evidence_items", "failed_units", "metric_label", "metric_names",
]
