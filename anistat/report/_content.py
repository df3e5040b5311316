"""What the report says: the shared context, summary facts and the methods section.

Both the HTML and the LaTeX renderers read the same :class:`ReportContext`, so the two documents
never disagree on a number or a setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .. import vocabulary as vocab
from ..vocabulary import PROXY_METRICS
from ._data import (
    checkpoint_order,
    fmt_num,
    fmt_p,
    interval_phrase,
    metric_label,
    natural_key,
    normalise_results,
    ordered,
    ordered_by_first,
    phase_last_checkpoints,
    primary_choice,
    sig_mark,
    sig_thresholds,
)
from ._null_check import DEPENDENCE_CAVEAT, verdict_sentence
from ._text import M, P, Para, Segment
from .answer import answer_sentence
from .claim_text import DOCUMENTS, QUESTIONS, SUBSPACES
from .escape import esc
from .inputs import ReportInputs, RunDescription, RunRecord
from .options import ReportOptions

ELLIPSIS_SEP = ", \u2026"
QUESTION = (
    "Do low-rank directions derived from the model's own activations (tangent proxies) capture "
    "more of the true training-gradient energy than matched random subspaces of the same rank?"
)

#: Each control kind's sentence in words and in LaTeX (:data:`anistat.vocabulary.CONTROL_KINDS`).
CONTROL_DESCRIPTIONS: dict[str, tuple[str, str]] = {
    name: (kind.sentence, kind.sentence_latex) for name, kind in vocab.CONTROL_KINDS.items()
}
#: How the methods text names each fitted proxy method (:data:`anistat.vocabulary.PROXY_KINDS`).
PROXY_DESCRIPTIONS: dict[str, str] = {name: m.sentence for name, m in vocab.PROXY_KINDS.items() if not m.data_free}
MULTIPLICITY_NAMES: dict[str, str] = {name: m.label for name, m in vocab.MULTIPLICITY.items()}
FAMILY_TEXT: dict[str, str] = {
    "run": "all tests of the run",
    "model": "the tests of each model",
    "claim": "all tests of the run in results.csv, and, for each claim, the tests it selects",
}
CONTROL_INDEPENDENT_METRICS = frozenset({"anisotropy_capture", "delta_isoscore_star", "oracle_fraction"})
"""Metrics whose estimate does not depend on the control kind (only their control mean and
p-value do): tables show the estimate once."""


@dataclass
class ReportContext:
    """What both renderers share: the typed inputs, the normalised tables and derived choices."""

    inputs: ReportInputs
    options: ReportOptions
    full: pd.DataFrame = field(init=False)
    main: pd.DataFrame = field(init=False)
    run: RunDescription = field(init=False)
    record: RunRecord = field(init=False)
    title: str = field(init=False)
    name: str = field(init=False)
    description: str = field(init=False)
    proxy: str = field(init=False)
    control: str = field(init=False)
    alpha: float = field(init=False)
    thresholds: tuple[float, ...] = field(init=False)
    p_col: str = field(init=False)
    ci_level: float = field(init=False)
    ci_text: str = field(init=False)

    def __post_init__(self) -> None:
        self.run, self.record = self.inputs.run, self.inputs.record
        results = normalise_results(self.inputs.results)
        buckets = frequency_bucket_rows(self.inputs.frequency)
        self.main = results
        self.full = (
            results
            if buckets.empty
            else normalise_results(pd.concat([self.inputs.results.assign(bucket=""), buckets], ignore_index=True))
        )
        if not buckets.empty:
            self.main = self.full[self.full["bucket"] == ""]
        self.name = self.run.name
        self.title = self.options.title or self.run.title or self.run.name
        self.description = self.run.description
        # the proxy of the proxy metrics: the oracle's rows (proxy "oracle") and descriptive rows
        # ("none") come first in the table and are no proxy to plot (a run whose only proxy is
        # random@refit must find those rows)
        proxy_rows = self.main[self.main["metric"].isin(PROXY_METRICS)]
        self.proxy = primary_choice(
            proxy_rows["proxy"] if len(proxy_rows) else self.main["proxy"],
            self.options.primary_proxy,
            (vocab.PCA, f"{vocab.PCA}@refit"),
        )
        self.control = primary_choice(self.main["control"], self.options.primary_control, (vocab.NORMAL,))
        self.alpha = self.run.alpha
        self.thresholds = sig_thresholds(self.alpha)
        adjusted = self.run.multiplicity != "none" and self.main["p_adjusted"].notna().any()
        self.p_col = "p_adjusted" if adjusted else "p_value"
        self.ci_level = self.run.ci_level
        self.ci_text = f"{self.ci_level * 100:g}\u00a0%"

    # ------------------------------------------------------------ helpers

    def fmt(self, x: Any) -> str:
        return fmt_num(x, self.options.precision)

    def mark(self, p: Any) -> str:
        return sig_mark(p, self.thresholds)

    def legend_text(self) -> str:
        which = "unadjusted p"
        if self.p_col == "p_adjusted":
            which = f"{MULTIPLICITY_NAMES.get(self.run.multiplicity, self.run.multiplicity)}-adjusted p"
        parts = [f"{'*' * (i + 1)} {which} < {t:g}" for i, t in enumerate(self.thresholds)]
        return "; ".join(parts)

    @property
    def failed(self) -> pd.DataFrame:
        return self.main[self.main["status"] != "ok"]

    @property
    def n_result_rows(self) -> int:
        """Rows of the results table as written (results.csv), frequency rows not included."""
        return len(self.inputs.results)

    @property
    def unit_noun(self) -> str:
        """What one of the run's time points is: a checkpoint, or a measured step of a training loop."""
        return "measured step" if self.run.measured_in_loop else "checkpoint"

    def phase_rule(self) -> str:
        """What `phase` early means in this run, in words (captions and methods agree)."""
        run, share = self.run, f"{self.run.fit_window * 100:g} %"
        if run.measured_in_loop:
            fits = "; ".join(_steps_text(m.loop.fit_steps) for m in run.models)
            return f"the first {share} of the measured steps; the proxies were fitted on training {fits}"
        if run.proxy_refit == "per_checkpoint":
            return f"the first {share} of the checkpoints; every checkpoint's proxy is refitted on its own activations"
        if run.proxy_refit == "both":
            return (
                f"the first {share} of the checkpoints, on which the frozen proxies were fitted; the @refit proxies "
                "are refitted at every checkpoint"
            )
        return f"the first {share} of the checkpoints, on which the proxies were fitted"

    def unit_hint(self) -> str:
        """The run's resampling unit in words, for rows that do not record it (frequency buckets)."""
        rows = self.main[self.main["metric"] == "energy_ratio"]
        phrase = interval_phrase(rows, "")
        return phrase[phrase.index("resampling") :] if "resampling" in phrase else ""

    def n_units(self) -> int:
        return int(self.main.groupby(["model", "checkpoint", "layer", "site"]).ngroups) if len(self.main) else 0


def frequency_bucket_rows(frequency: pd.DataFrame) -> pd.DataFrame:
    """The per-frequency-bucket energy ratios of ``frequency.csv`` (``bucket`` 0..K-1), drawn in
    the frequency figure and kept out of every other figure and table."""
    if frequency is None or frequency.empty or not {"bucket", "metric"} <= set(frequency.columns):
        return pd.DataFrame()
    rows = frequency[(frequency["metric"] == "energy_ratio") & (frequency["bucket"].astype(str) != "all")]
    return rows.assign(bucket=rows["bucket"].astype(str))


# ---------------------------------------------------------------- summary


#: Marks of an interval wholly above / below 1 (the headline table's direction column).
UP, DOWN = "\u2191", "\u2193"


@dataclass
class Headline:
    """Energy ratios of the primary proxy vs the primary control at phase-last checkpoints.

    ``columns`` are (phase, the checkpoint(s) the column shows, rank): the table names its
    checkpoints, since a phase spans several while a column shows its last one. A cell is
    (estimate, CI text, p text, significance mark, direction): ``UP`` when the CI lies wholly
    above 1, ``DOWN`` wholly below, "" otherwise."""

    columns: list[tuple[str, str, float]]
    rows: list[tuple[str, str, list[tuple[str, str, str, str, str] | None]]]
    # (model, loc, cells) — a failed cell is ("failed", "", "", "", "")


def direction(ci_low: Any, ci_high: Any) -> str:
    """``UP`` when the interval lies wholly above 1, ``DOWN`` wholly below, else ""."""
    low, high = float(ci_low), float(ci_high)
    return UP if low > 1 else DOWN if high < 1 else ""


def headline(ctx: ReportContext) -> Headline | None:
    d = ctx.main
    d = d[(d["metric"] == "energy_ratio") & (d["proxy"] == ctx.proxy) & (d["control"] == ctx.control)]
    if d.empty:
        return None
    d = phase_last_checkpoints(d)
    phases = ordered_by_first(d["phase"])
    phases = sorted(phases, key=lambda p: {"early": 0, "late": 1}.get(p, 2))
    ranks = sorted(d["rank"].dropna().unique())
    shown = {ph: "/".join(ordered_by_first(d.loc[d["phase"] == ph, "checkpoint"])) for ph in phases}
    cols = [(ph, shown[ph], r) for ph in phases for r in ranks]
    rows = []
    for model in ordered_by_first(d["model"]):
        dm = d[d["model"] == model]
        for loc in sorted(dm["_loc"].unique(), key=natural_key):
            cells: list[tuple[str, str, str, str, str] | None] = []
            for ph, _c, r in cols:
                s = dm[(dm["_loc"] == loc) & (dm["phase"] == ph) & (dm["rank"] == r)]
                if s.empty:
                    cells.append(None)
                    continue
                row = s.iloc[0]
                if row["status"] != "ok" or pd.isna(row["estimate"]):
                    cells.append(("failed", "", "", "", ""))
                    continue
                ci = f"[{ctx.fmt(row['ci_low'])}, {ctx.fmt(row['ci_high'])}]" if pd.notna(row["ci_low"]) else ""
                cells.append(
                    (
                        ctx.fmt(row["estimate"]),
                        ci,
                        fmt_p(row[ctx.p_col]),
                        ctx.mark(row[ctx.p_col]),
                        direction(row["ci_low"], row["ci_high"]),
                    )
                )
            rows.append((model, loc, cells))
    return Headline(cols, rows)


def headline_legend(ctx: ReportContext) -> str:
    """What the headline table's marks mean: the two questions, named."""
    return (
        f"Stars answer \u201cis this proxy special among random subspaces on these data?\u201d (the exact "
        f"test; {ctx.legend_text()}). {UP} / {DOWN} (shaded) answer \u201cwould its ratio stay above the "
        f"threshold over new documents?\u201d for the threshold 1: the {ctx.ci_text} CI lies wholly above / "
        "below 1."
    )


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
    frequency = ctx.inputs.frequency
    if frequency.empty or "metric" not in frequency:
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
    "Pearson r of the same pairs is in frequency.csv."
)

#: What each interval of the frequency correlations is, for the captions (only the methods used).
FREQUENCY_INTERVAL_TEXT: dict[str, str] = {
    vocab.NORMAL_INTERVAL: (
        "A normal interval is the estimate \u00b1 z \u00d7 the resamples' standard deviation: it "
        "takes the bootstrap's spread but not its bias, which for a correlation over types whose "
        "spreads come from few sequences tracks the sample's error more than the estimator's."
    ),
    vocab.PERCENTILE: "A percentile interval is the resamples' own quantiles.",
    vocab.BASIC: (
        "A basic interval is the percentile interval reflected about the estimate, which removes the "
        "bootstrap's bias; where that bias is large the interval can exclude the estimate (the note "
        "column of frequency.csv says so)."
    ),
}


def frequency_interval_sentences(methods) -> str:
    """The sentences that say what the frequency table's intervals are, for the methods used."""
    return " ".join(FREQUENCY_INTERVAL_TEXT[m] for m in methods if m in FREQUENCY_INTERVAL_TEXT)


def answer(ctx: ReportContext) -> str:
    """The one-sentence answer under the Question (:mod:`anistat.report.answer`)."""
    return answer_sentence(
        ctx.main,
        proxy=ctx.proxy,
        control=ctx.control,
        alpha=ctx.alpha,
        p_col=ctx.p_col,
        multiplicity=ctx.run.multiplicity,
        ci_text=ctx.ci_text,
        unit_noun=ctx.unit_noun,
        null_checks=ctx.inputs.null_checks,
    )


def null_check_sentences(ctx: ReportContext) -> list[str]:
    """What the run's own null check (an uninformative proxy) says about the tests."""
    sentences = [verdict_sentence(check) for check in ctx.inputs.null_checks]
    return sentences + [DEPENDENCE_CAVEAT] if sentences else []


def summary_sentences(ctx: ReportContext) -> list[str]:
    """Plain-text headline findings (escaped by the renderer)."""
    out: list[str] = null_check_sentences(ctx)
    d = ctx.main[ctx.main["_ok"] & (ctx.main["proxy"] == ctx.proxy)]
    er = d[(d["metric"] == "energy_ratio") & (d["control"] == ctx.control)]
    if len(er):
        p = er[ctx.p_col]
        sig = int(((p < ctx.alpha) & (er["estimate"] > 1)).sum())
        tested = int(p.notna().sum())
        pword = "adjusted " if ctx.p_col == "p_adjusted" else ""
        above = int((er["ci_low"] > 1).sum())
        below = int((er["ci_high"] < 1).sum())
        txt = (
            f"Against {ctx.control} controls, the {ctx.proxy} proxy's energy ratio exceeds 1 "
            f"in {int((er['estimate'] > 1).sum())} of {len(er)} comparisons "
            f"(model \u00d7 checkpoint \u00d7 layer \u00d7 rank)"
        )
        if er["ci_low"].notna().any():
            txt += f"; its {ctx.ci_text} CI lies above 1 in {above} and below 1 in {below} of {len(er)}"
        if tested:
            exact = "p_test" in er.columns and (er["p_test"] == "haar_monte_carlo").all()
            test = (
                f"the proxy captures more than uniformly random subspaces (exact test, {pword}p < {ctx.alpha:g})"
                if exact
                else f"significantly so ({pword}p < {ctx.alpha:g})"
            )
            txt += f"; {test} in {sig} of {tested}"
        out.append(txt + ".")
        for model in ordered_by_first(er["model"]):
            em = er[er["model"] == model]
            obj = em["objective"].iloc[0]
            parts = []
            for ph in sorted(ordered_by_first(em["phase"]), key=lambda p: {"early": 0, "late": 1}.get(p, 2)):
                ep = em[em["phase"] == ph]["estimate"]
                lab = ph or "all checkpoints"
                parts.append(
                    f"{lab}: median R = {ctx.fmt(ep.median())} (range {ctx.fmt(ep.min())}\u2013{ctx.fmt(ep.max())})"
                )
            out.append(f"{model}{f' ({obj})' if obj else ''}: " + "; ".join(parts) + ".")
    iso = d[(d["metric"] == "delta_isoscore_star") & (d["control"] == ctx.control)]
    iso = iso[iso["control_mean"].notna()]
    if len(iso):
        above = int((iso["estimate"] > iso["control_mean"]).sum())
        out.append(
            f"Removing the proxy raises IsoScore* more than removing a {ctx.control} "
            f"control (mean over draws) in {above} of {len(iso)} comparisons "
            f"(median \u0394IsoScore* {ctx.fmt(iso['estimate'].median())} vs "
            f"{ctx.fmt(iso['control_mean'].median())})."
        )
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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def methods(ctx: ReportContext) -> list[Para]:
    """Methods paragraphs generated from the typed run description (what the protocol asked
    for) and the written results (what was measured: dimensions, sites, token counts)."""
    return [
        _design(ctx),
        _proxies(ctx),
        _controls(ctx),
        _metrics(ctx),
        _statistics(ctx),
        *([_software(ctx)] if _software(ctx).segments else []),
    ]


def _steps_text(steps: tuple[int, ...]) -> str:
    """ "step 3", "steps 0, 1, 2", "steps 0–19" (a contiguous run)."""
    if not steps:
        return "no step"
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) > 3 and list(steps) == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}\u2013{steps[-1]}"
    shown = ", ".join(map(str, steps[:8])) + (ELLIPSIS_SEP if len(steps) > 8 else "")
    return f"steps {shown}"


def _design(ctx: ReportContext) -> Para:
    """Models, checkpoints (or measured steps), the phase rule, sites and the data — each from
    what this kind of run actually did (`anistat run`: the protocol's corpus and splits; a model
    measured in its own loop: the loop's batches and steps, from the manifest)."""
    run, df = ctx.run, ctx.main
    model_bits = []
    share = f"{run.fit_window * 100:g} %"
    for model in run.models:
        dm = df[df["model"] == model.name]
        dims = ordered(dm["dim"].dropna().astype(int))
        # the measured checkpoints (results) where there are any, else the protocol's
        ck = tuple(checkpoint_order(dm)) or model.checkpoints
        early = tuple(ordered_by_first(dm.loc[dm["phase"] == "early", "checkpoint"])) or model.early_checkpoints
        loop = model.loop
        kind = (
            model.kind
            if loop is None
            else (f"measured during training by {loop.driver}" + (f" ({loop.training})" if loop.training else ""))
        )
        bits = [kind, model.objective.upper() if model.objective else "", f"d = {'/'.join(dims)}" if dims else ""]
        noun = "measured step" if loop is not None else "checkpoint"
        if ck:
            bits.append(_plural(len(ck), noun) + (f" ({ck[0]} \u2026 {ck[-1]})" if len(ck) > 1 else f" ({ck[0]})"))
        if early and len(early) < len(ck):
            bits.append(f"early phase (the first {share} of the {noun}s): {', '.join(early)}")
        model_bits.append(f"{model.name} (" + "; ".join(b for b in bits if b) + ")")
    sites = ordered(df["site"])
    seg: list[Segment] = [
        f"We analysed {_plural(len(run.models), 'model')}: {_join(model_bits)}. "
        f"Hidden states were read at {_plural(len(sites), 'site')}"
        + (f" ({', '.join(sites[:12])}{ELLIPSIS_SEP if len(sites) > 12 else ''})" if sites else "")
        + ". "
    ]
    n_tok = df["n_tokens"].dropna()
    tokens = f" ({_range_text(n_tok)} loss-bearing tokens per unit)" if len(n_tok) else ""
    if run.measured_in_loop:
        for model in run.models:
            loop = model.loop
            length = f"sequences of up to {loop.sequence_length} tokens" if loop.sequence_length else "sequences"
            fit_n = f"the {loop.fit_sequences} sequences" if loop.fit_sequences is not None else "the sequences"
            measured_n = (
                f"the {loop.measured_sequences} sequences" if loop.measured_sequences is not None else "the sequences"
            )
            window = f" (units of {loop.window} consecutive steps)" if loop.window > 1 else ""
            seg.append(
                f"Data{f' ({model.name})' if len(run.models) > 1 else ''}: the training loop's own batches "
                f"({length}), not a held-out split — the protocol's data settings were not used: "
                f"{fit_n} of training {_steps_text(loop.fit_steps)} fit the proxies and {measured_n} of "
                f"training {_steps_text(loop.measured_steps)}{window} give the gradients{tokens}. "
            )
        seg.append(f"Random seed: {run.seed}.")
        return P(*seg, heading="Design")
    fitting = (
        f"{run.n_fit_sequences} sequences fit the proxies and {run.n_test_sequences} disjoint test sequences"
        if any(m not in DATA_FREE_PROXIES for m in run.proxy_methods)
        else f"{run.n_test_sequences} test sequences (the proxies use no activation)"
    )
    seg.append(
        f"Text: {run.corpus}, cut into sequences of {run.seq_len} tokens; per model, {fitting} give the "
        f"gradients{tokens}"
    )
    seg.append(f". Random seed: {run.seed}.")
    return P(*seg, heading="Design")


DATA_FREE_PROXIES = {name: m.sentence for name, m in vocab.PROXY_KINDS.items() if m.data_free}
"""Proxy methods whose basis uses no activation (drawn, not fitted), as the methods text names them."""


def _proxies(ctx: ReportContext) -> Para:
    """How the proxies came to be: fitted (or drawn) on what, frozen or refitted — for the run's
    own `proxies.refit` and, for a loop-measured model, on the loop's fit steps."""
    run = ctx.run
    fitted = [m for m in run.proxy_methods if m not in DATA_FREE_PROXIES]
    drawn = [m for m in run.proxy_methods if m in DATA_FREE_PROXIES]
    ranks = "{" + ", ".join(str(r) for r in run.ranks) + "}"
    cap = f"at most {run.max_fit_tokens} tokens per site"
    seg: list[Segment] = [f"Tangent proxies U (orthonormal d \u00d7 k bases) of rank k \u2208 {ranks}"]
    if run.measured_in_loop:
        seg += _loop_proxy_segments(run, fitted, drawn, cap)
        return P(*seg, heading="Proxies and gradients")
    clauses = _checkpoint_proxy_clauses(run, fitted, drawn, cap)
    seg.append(" " + " ".join(clauses) + ". Gradients ")
    seg.append(
        M("<i>g<sub>i</sub></i> = \u2202<i>L</i>/\u2202<i>h<sub>i</sub></i>", r"$g_i = \partial L / \partial h_i$")
    )
    seg.append(
        " of the model's own training loss (next-token cross-entropy for CLM, masked-token "
        "cross-entropy for MLM) were taken at the same sites on the test sequences."
    )
    return P(*seg, heading="Proxies and gradients")


def _loop_proxy_segments(run: RunDescription, fitted: list[str], drawn: list[str], cap: str) -> list[Segment]:
    """For a loop-measured model: the proxies fitted (or drawn) on the loop's fit steps, the steps
    both fitted and measured, and the gradients read from the training steps' own backward pass."""
    seg: list[Segment] = []
    clauses = []
    loop_fits = "; ".join(
        f"{_steps_text(m.loop.fit_steps)}" + (f" of {m.name}" if len(run.models) > 1 else "") for m in run.models
    )
    if fitted:
        clauses.append(
            f"were fitted with {_join([PROXY_DESCRIPTIONS.get(m, m) for m in fitted])} on the "
            f"activations of the training batches of {loop_fits} ({cap}, sampled evenly over the "
            "fit steps), then frozen"
        )
    if drawn:
        clauses.append(
            f"{'and ' if fitted else ''}were drawn as {_join([DATA_FREE_PROXIES[m] for m in drawn])}"
            " once, after the fit steps, then frozen"
        )
    seg.append(" " + " ".join(clauses) + ". ")
    overlaps = [(m.name, sorted(set(m.loop.fit_steps) & set(m.loop.measured_steps))) for m in run.models]
    for name, steps in overlaps:
        if steps:
            seg.append(
                f"Training {_steps_text(tuple(steps))} {'was' if len(steps) == 1 else 'were'} both fitted and "
                f"measured{f' ({name})' if len(run.models) > 1 else ''}: its gradients come from the "
                "batches whose activations fitted the proxy. "
            )
    seg.append("Gradients ")
    seg.append(
        M("<i>g<sub>i</sub></i> = \u2202<i>L</i>/\u2202<i>h<sub>i</sub></i>", r"$g_i = \partial L / \partial h_i$")
    )
    seg.append(
        " of the loss the training loop optimised were read from each measured training step's own "
        "backward pass (no extra forward or backward) at the same sites; the phase of a unit is its "
        f"place among the measured steps (the first {run.fit_window * 100:g} % are early), not the "
        "steps the proxies were fitted on."
    )
    return seg


def _checkpoint_proxy_clauses(run: RunDescription, fitted: list[str], drawn: list[str], cap: str) -> list[str]:
    """For checkpoints: how the fitted and the drawn proxies came to be under `proxies.refit`
    (frozen after the early phase, refitted per checkpoint, or both)."""
    clauses = []
    window = f"the early-phase checkpoints (the earliest {run.fit_window * 100:g} %"
    refit = run.proxy_refit
    if fitted:
        how = _join([PROXY_DESCRIPTIONS.get(m, m) for m in fitted])
        if refit == "frozen":
            clauses.append(
                f"were fitted with {how} on activations of the fit sequences at {window}; {cap}), then frozen"
            )
        elif refit == "per_checkpoint":
            labels = ", ".join(f"{m}@refit" for m in fitted)
            clauses.append(
                f"were fitted with {how} on activations of the fit sequences of each checkpoint "
                f"separately ({cap}): every checkpoint is measured with a proxy refitted on its own "
                f"activations (labelled {labels}), so the early phase only places a checkpoint in "
                "training"
            )
        else:
            clauses.append(
                f"were fitted with {how} twice: on activations of the fit sequences at {window}), then "
                f"frozen (labelled {', '.join(fitted)}), and refitted on each checkpoint's own fit "
                f"sequences (labelled {', '.join(f'{m}@refit' for m in fitted)}; {cap})"
            )
    if drawn:
        how = _join([DATA_FREE_PROXIES[m] for m in drawn])
        prefix = "and " if fitted else ""
        if refit == "frozen":
            clauses.append(f"{prefix}were drawn as {how}, once per site and rank, then frozen")
        elif refit == "per_checkpoint":
            clauses.append(
                f"{prefix}were drawn as {how}, anew at every checkpoint "
                f"(labelled {', '.join(f'{m}@refit' for m in drawn)}), so the proxies of different "
                "checkpoints are independent draws"
            )
        else:
            clauses.append(
                f"{prefix}were drawn as {how} once and frozen (labelled "
                f"{', '.join(drawn)}) and anew at every checkpoint "
                f"(labelled {', '.join(f'{m}@refit' for m in drawn)})"
            )
    return clauses


def _controls(ctx: ReportContext) -> Para:
    run = ctx.run
    seg: list[Segment] = ["Control kinds: "]
    for i, c in enumerate(run.control_kinds):
        h, latex = CONTROL_DESCRIPTIONS.get(c, (None, None))
        if h is None:
            seg.append(c)
        else:
            if c == vocab.PCA_SPAN and run.pca_span_dim is not None:
                h = h.replace("top-m", f"top-{run.pca_span_dim}")
                latex = latex.replace("top-$m$", f"top-{run.pca_span_dim}")
            seg.extend([f"{c}: ", M(esc(h), latex)])
        seg.append("; " if i < len(run.control_kinds) - 1 else ". ")
    closed = [c for c in run.control_kinds if c in vocab.CLOSED_FORM_KINDS and run.energy_ratio_reference == "expected"]
    drawn = [c for c in run.control_kinds if c not in closed]
    if closed:
        forms = ", ".join(vocab.CONTROL_KINDS[c].closed_form for c in closed)
        seg.append(
            f"For {_join(closed)} controls the energy ratio's denominator is the control energy's "
            f"closed-form expectation over the control law ({forms}), and "
            "their spread (z, control mean and sd) comes from draws made at analysis time from each unit's "
            "gradient second moment. "
        )
    if drawn:
        seg.append(
            f"For {_join(drawn)} controls, n = {run.n_controls} draws per proxy were projected on "
            "every token, and the ratio is relative to their mean (conditional on those draws). "
        )
    seg.append("All draws are seeded and identical across devices.")
    return P(*seg, heading="Controls")


def _metrics(ctx: ReportContext) -> Para:
    metrics = set(ctx.main["metric"])
    run = ctx.run
    seg: list[Segment] = [
        "The energy fraction of a basis Q is ",
        M(
            "<i>E</i>(<i>Q</i>) = \u03a3<sub><i>i</i></sub> \u2016<i>Q</i><sup>\u22a4</sup>"
            "<i>g<sub>i</sub></i>\u2016\u00b2 / \u03a3<sub><i>i</i></sub> \u2016<i>g<sub>i"
            "</sub></i>\u2016\u00b2",
            r"$E(Q) = \sum_i \lVert Q^{\top} g_i \rVert^2 / \sum_i \lVert g_i \rVert^2$",
        ),
        " (for a uniformly random subspace its expectation is k/d). ",
    ]
    if "oracle_fraction" in metrics:
        seg += [
            "The oracle ",
            M("<i>E</i>*<sub><i>k</i></sub>", r"$E^{*}_{k}$"),
            " is the sum of the top-k eigenvalues of ",
            M("<i>G</i><sup>\u22a4</sup><i>G</i>", r"$G^{\top}G$"),
            " over its trace, the most any rank-k subspace can capture. ",
        ]
    if metrics & {"energy_ratio", "log2_energy_ratio"}:
        seg += [
            "The energy ratio is ",
            M(
                "<i>R</i> = <i>E</i>(<i>U</i>) / E<sub><i>Q</i></sub>[<i>E</i>(<i>Q</i>)]",
                r"$R = E(U) / \mathrm{E}_Q[E(Q)]$",
            ),
            ", the proxy's energy over the expected energy of a control of the row's kind "
            "(also reported as log\u2082 R and as z = (E(U) \u2212 mean)/SD over the control draws). ",
        ]
    if "anisotropy_capture" in metrics:
        seg += [
            "Anisotropy capture is ",
            M(
                "(<i>E</i>(<i>U</i>) \u2212 <i>k</i>/<i>d</i>) / (<i>E</i>*<sub><i>k</i></sub>"
                " \u2212 <i>k</i>/<i>d</i>)",
                r"$(E(U) - k/d) / (E^{*}_{k} - k/d)$",
            ),
            ", the share of the attainable above-isotropic energy captured by the proxy. ",
        ]
    if "delta_isoscore_star" in metrics:
        c0 = {"scaled_identity": "the identity scaled to the gradients' mean variance", "identity": "the identity"}.get(
            run.isoscore_c0, run.isoscore_c0
        )
        seg += [
            "\u0394IsoScore*(Q) is the IsoScore* (Rudman et al.) of the gradients expressed in "
            "the (d \u2212 k) coordinates of the complement of Q minus the IsoScore* of all "
            f"gradients, with shrinkage target C0 = {run.isoscore_c0} ({c0}) and weight "
            f"\u03b6 = {run.isoscore_zeta:g}. "
        ]
    if "hedges_g" in metrics:
        seg.append(
            "Hedges' g is the bias-corrected standardised mean of the per-unit contributions "
            "\u03a3\u2016U\u1d40g\u2016\u00b2 \u2212 \u03a3 (expected control energy), the "
            "headline ratio's own numerator minus denominator. "
        )
    extra = sorted(
        m
        for m in metrics
        if m
        not in {
            "energy_fraction",
            "energy_ratio",
            "log2_energy_ratio",
            "oracle_fraction",
            "anisotropy_capture",
            "delta_isoscore_star",
            "hedges_g",
        }
    )
    if extra:
        seg.append(f"Further metrics reported: {', '.join(extra[:20])}{ELLIPSIS_SEP if len(extra) > 20 else ''}. ")
    return P(*seg, heading="Metrics")


#: What each value of the results' ``p_test`` column means (the test behind ``p_value``).
P_TEST_TEXT: dict[str, str] = {
    "haar_monte_carlo": (
        "an exact Monte-Carlo test against uniformly random (Haar) subspaces read off each "
        "unit's own gradient moments (energy metrics and \u0394IsoScore*)"
    ),
    "bootstrap_t": "a studentized bootstrap test that the population energy ratio is 1 (hedges_g)",
    "sign_flip": "a sign-flip permutation test of the per-unit contributions (hedges_g)",
}


def _distinct(df: pd.DataFrame, column: str) -> list[str]:
    if column not in df.columns:
        return []
    return [v for v in ordered_by_first(df[column]) if v not in ("", "nan", "none")]


def _statistics(ctx: ReportContext) -> Para:
    """The statistics paragraph: what each test is exact under and what each interval is an
    interval of. Facts come from the run description and from the results' columns where they
    exist (``p_test``: the test behind ``p_value``; ``p_value_paper``: the paper's convention;
    ``n_clusters``: resampling units)."""
    run, df = ctx.run, ctx.main
    seg: list[Segment] = []
    seg += _resampling_unit_segments(run, df)
    tests = _distinct(df, "p_test")
    seg += _p_value_segments(run, df, tests)
    seg += _interval_segments(run, df)
    if "haar_monte_carlo" in tests:
        seg.append(
            f"p_value and the intervals answer two questions: the exact test \u201c{QUESTIONS[SUBSPACES]}\u201d "
            f"(conditional on the measured gradients; the stars), the intervals and the data test "
            f"\u201c{QUESTIONS[DOCUMENTS]}\u201d (the document as the unit); each claim says which it "
            "answers. "
        )
    if run.multiplicity == "none":
        seg.append("p-values are not adjusted for multiplicity. ")
    else:
        seg.append(
            f"Multiplicity: {MULTIPLICITY_NAMES.get(run.multiplicity, run.multiplicity)} "
            f"correction over {FAMILY_TEXT.get(run.family, run.family)}, each distinct test counted "
            "once. "
        )
    seg.append(f"Significance level \u03b1 = {run.alpha:g}; marks: {ctx.legend_text()}.")
    return P(*seg, heading="Statistics")


def _resampling_unit_segments(run: RunDescription, df: pd.DataFrame) -> list[Segment]:
    """The sentence on the resampling unit: documents (with their count per unit) or sequences."""
    seg: list[Segment] = []
    clusters = df["n_clusters"].dropna() if "n_clusters" in df.columns else pd.Series(dtype=float)
    sequences = df["n_sequences"].dropna() if "n_sequences" in df.columns else pd.Series(dtype=float)
    documents = (
        len(clusters) and run.resampling_unit == "document" and not clusters.equals(sequences.loc[clusters.index])
    )
    if documents:
        seg.append(
            f"The resampling unit is the document ({_range_text(clusters)} documents per unit): "
            "sequences cut from one document are resampled together. "
        )
    elif run.measured_in_loop:
        seg.append("The resampling unit is the sequence (each sequence of a measured training batch is its own unit). ")
    else:
        seg.append(
            "The resampling unit is the sequence"
            f"{' (no two test sequences share a recorded document)' if run.resampling_unit == 'document' else ''}. "
        )
    return seg


def _p_value_segments(run: RunDescription, df: pd.DataFrame, tests: list[str]) -> list[Segment]:
    """The sentences on the tests behind p_value (the exact Monte-Carlo test with its stopping and
    risk-bounded decisions, or the control-draw test) and on the paper's p-value convention."""
    seg: list[Segment] = []
    if tests:
        seg.append("p_value comes from " + _join([P_TEST_TEXT.get(t, t) for t in tests]) + ". ")
        if "haar_monte_carlo" in tests:
            n_null = f"{run.n_null_draws:,}" if run.n_null_draws else "the recorded number of"
            seg += [
                "The exact test's p-value is ",
                M(
                    "<i>p</i> = (1 + #{<i>j</i>: <i>E</i>(<i>Q<sub>j</sub></i>) \u2265 <i>E</i>(<i>U"
                    "</i>)}) / (1 + <i>n</i>)",
                    r"$p = (1 + \#\{j : E(Q_j) \geq E(U)\}) / (1 + n)$",
                ),
                f" with at most n = {n_null} Haar subspaces"
                + (
                    ", enough for its floor to pass the corrected threshold of the whole family"
                    if run.null_draws_auto
                    else " (set by the protocol)"
                )
                + "; an uninformative (uniformly random) proxy is "
                "exchangeable with the draws, so under that null P(p \u2264 a) \u2264 a whatever the "
                "gradients' anisotropy. "
                + (
                    "Every unit and rank has its own stream of draws, read in the unit's own "
                    "eigen-coordinates, so every test is exact on its own and, given the data, tests of "
                    "independently drawn proxies are independent. "
                    if run.null_draws == "per_test"
                    else "The draws are made once per hidden width and read in each unit's own "
                    "eigen-coordinates (a Haar subspace stays Haar under any fixed rotation), so every test "
                    "is exact on its own while tests of units of one width are dependent. "
                ),
            ]
            if run.null_stop_exceedances:
                seg.append(
                    f"Draws are counted sequentially (Besag & Clifford 1991): a test stops once "
                    f"{run.null_stop_exceedances} draws reach its observed value after L draws, with "
                    f"p = {run.null_stop_exceedances}/L (exact too); tests near or past their threshold "
                    "use all n. "
                )
            if run.resampling_risk is not None:
                seg.append(
                    f"Each energy test is also decided with a resampling risk of at most "
                    f"ε = {run.resampling_risk:g} (mc_decision; Gandy 2009): its draws are read until a "
                    "Clopper–Pearson confidence sequence of its ideal (infinite-draw) p-value, at "
                    "doubling looks, settles the decision of its family under the correction, or until n "
                    "draws (then 'undecided'); every family's decisions agree with those of the ideal "
                    "p-values with probability at least 1 − ε (mc_p_low, mc_p_high give the "
                    "interval). "
                )
    else:
        seg += [
            "The control draw is tested with the one-sided Monte-Carlo p-value ",
            M(
                "<i>p</i> = (1 + #{<i>j</i>: <i>E</i>(<i>Q<sub>j</sub></i>) \u2265 <i>E</i>(<i>U"
                "</i>)}) / (1 + <i>n</i>)",
                r"$p = (1 + \#\{j : E(Q_j) \geq E(U)\}) / (1 + n)$",
            ),
            f" (smallest attainable p with n = {run.n_controls}: 1/{run.n_controls + 1} = "
            f"{fmt_num(1 / (run.n_controls + 1), 3)}). ",
        ]
    if "p_value_paper" in df.columns and df["p_value_paper"].notna().any():
        seg.append(
            f"p_value_paper holds the paper's convention, the same statistic against the first "
            f"{run.n_controls} draws of the row's own control kind; for normal controls (drawn in "
            "the proxy's own orthogonal complement) it is not exact, and it rejects an "
            "uninformative proxy too often under anisotropic gradients (0.078\u20130.089 at \u03b1 = 0.05 in "
            "anistat's calibration, benchmarks/README.md). "
        )
    return seg


#: How the methods text names each interval method of the energy estimands.
RATIO_METHOD_SENTENCES = {name: m.sentence for name, m in vocab.CI_METHODS.items()}


def _interval_segments(run: RunDescription, df: pd.DataFrame) -> list[Segment]:
    """The sentences on the data test and the confidence intervals: method, resamples, estimand
    and the interval methods found in the results."""
    seg: list[Segment] = []
    n_resamples = max(run.n_test_resamples_used or run.n_test_resamples, run.n_bootstrap)
    dual = run.ci_method == vocab.STUDENTIZED
    seg.append(
        "The data are tested (hedges_g rows) by a studentized bootstrap test that the proxy's population "
        "energy ratio is 1, conditional on the proxy: "
        + ("the pivot of the energy ratio's interval (log scale, " if dual else "the log-scale bootstrap-t pivot (")
        + f"{n_resamples} resamples, tails expanded for the number of resampling units; "
        f"alternative: {run.alternative})" + (", so test and interval agree. " if dual else ". ")
    )
    method = RATIO_METHOD_SENTENCES.get(run.ci_method, run.ci_method)
    seg.append(
        f"Confidence intervals ({run.ci_level * 100:g} %, {method}"
        + (
            " over the resampling units, without resampling"
            if run.ci_method in vocab.CI_METHODS and not vocab.CI_METHODS[run.ci_method].resamples
            else f"; {n_resamples} bootstrap resamples of the resampling units, the data test's"
        )
        + ") describe effect sizes over data sampling "
        "for the fixed proxy: the energy ratio's interval covers the proxy's expected energy over "
        "the expected control energy; it is not a test against random subspaces (a fixed random "
        "subspace has a true ratio different from 1), which is what p_value is for. The note "
        "column names each interval's estimand"
    )
    used = df.loc[~df["ci_method"].isin(["", "none"]), "ci_method"].value_counts()
    if len(used):
        seg.append(
            "; interval methods in the results: "
            + ", ".join(f"{m} ({n} rows)" for m, n in sorted(used.items(), key=lambda kv: (-kv[1], kv[0])))
        )
    seg.append(". ")
    return seg


def _software(ctx: ReportContext) -> Para:
    rec = ctx.record
    seg: list[Segment] = []
    if rec.versions:
        seg.append("Software: " + ", ".join(f"{k} {v}" for k, v in rec.versions) + ". ")
    if rec.device:
        seg.append(f"Device: {rec.device}. ")
    if rec.dtype:
        seg.append(f"dtype: {rec.dtype}. ")
    if rec.protocol_sha256:
        seg.append(f"Protocol sha256: {rec.protocol_sha256}. ")
    if rec.started_at or rec.finished_at:
        seg.append(f"Run: {rec.started_at or '?'} \u2192 {rec.finished_at or '?'}. ")
    if rec.unit_seconds:
        secs = rec.unit_seconds
        seg.append(
            f"Per-unit timings: {len(secs)} units, total {fmt_num(sum(secs), 3)} s "
            f"(median {fmt_num(float(np.median(secs)), 3)} s). "
        )
    return P(*seg, heading="Software and run")


def _range_text(s: pd.Series) -> str:
    vals = s.dropna().astype(float)
    if vals.empty:
        return ""
    lo, hi = vals.min(), vals.max()

    def f(v):
        return str(int(v)) if float(v).is_integer() else fmt_num(v, 3)

    return f(lo) if lo == hi else f"{f(lo)}\u2013{f(hi)}"


def settings_rows(ctx: ReportContext) -> tuple[tuple[str, str, str], ...]:
    """(source, key, value) for every setting that applies to this run and each manifest field."""
    return ctx.run.settings


def failed_units(ctx: ReportContext) -> list[tuple[str, str, str, str, str, int]]:
    """(model, checkpoint, layer, site, reason, n rows) per failed unit and distinct reason."""
    f = ctx.failed
    out = []
    if f.empty:
        return out
    for (m, ck, layer, site, note), g in f.groupby(["model", "checkpoint", "layer", "site", "note"], sort=False):
        out.append((m, ck, layer, site, note or "(no reason recorded)", len(g)))
    return out


def metric_names(ctx: ReportContext) -> list[str]:
    return ordered_by_first(ctx.main["metric"])


__all__ = [
    "QUESTION",
    "ReportContext",
    "headline",
    "summary_sentences",
    "methods",
    "settings_rows",
    "failed_units",
    "metric_label",
    "metric_names",
    "CONTROL_INDEPENDENT_METRICS",
]
