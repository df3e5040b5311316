"""Every sentence true, for every kind of run (issue #22): the methods text and the figure
captions are generated from the run's own description — `anistat run` (frozen proxies), the
null-check protocol (random proxies drawn anew per checkpoint), refit runs (frozen and refitted
proxies side by side), a plain-PyTorch `TrainingMeter` and the transformers `Trainer` callback —
and pinned by golden files in tests/golden/. Regenerate after an intended change with
ANISTAT_UPDATE_GOLDEN=1.

The loop-measured kinds come from real training runs; their golden text is the part that is
specific to the kind (Design, Proxies and gradients, and the resampling unit), since the rest —
the Controls, Metrics and Statistics paragraphs shared with `anistat run` — is pinned by the
quickstart's golden file and holds numbers (interval-method counts) that depend on the data."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from _helpers import PLAIN_SCHEDULE, SETTINGS, batches, tiny_gpt2, tiny_trainer  # noqa: E402
from test_report_inputs import FAST, methods_text, plan_results, quickstart_manifest  # noqa: E402

from anistat.analyze import FREQUENCY_COLUMNS  # noqa: E402
from anistat.bundle import Bundle, report_inputs  # noqa: E402
from anistat.protocol import load_protocol, parse_protocol  # noqa: E402
from anistat.report._content import ReportContext, methods  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parents[1] / "golden"


def matches_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ANISTAT_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs (ANISTAT_UPDATE_GOLDEN=1 regenerates it)"


def assert_answer_is_true(ctx: ReportContext, model: str, phase_words: str) -> None:
    """The answer of a loop-measured run speaks of measured steps, and its verdict word is the
    one its own rank's rows give (every comparison significantly above 1: "Yes"; none: "No")."""
    from anistat.report._content import answer

    text = answer(ctx)
    rows = ctx.main[
        (ctx.main["metric"] == "energy_ratio")
        & (ctx.main["proxy"] == ctx.proxy)
        & (ctx.main["control"] == ctx.control)
        & ctx.main["_ok"]
    ]
    rows = rows[rows["rank"] == rows["rank"].min()]
    more = (rows[ctx.p_col] < ctx.alpha) & (rows["estimate"] > 1)
    verdict = "Yes" if more.all() else "No" if not more.any() else "In part"
    assert text.startswith(f"{verdict} for {model}: its rank-{int(rows['rank'].min())} {ctx.proxy} proxy captures "), (
        text
    )
    assert phase_words in text and "checkpoint" not in text, text


def kind_specific_text(inputs) -> str:
    """Design, Proxies and gradients, and the Statistics paragraph's first sentence."""
    paragraphs = methods(ReportContext(inputs=inputs, options=FAST))
    design, proxies = (p.plain() for p in paragraphs[:2])
    statistics = next(p.plain() for p in paragraphs if p.heading == "Statistics")
    first = statistics.index(". ", statistics.index(". ") + 2)  # the heading, then the first sentence
    return "\n\n".join([design, proxies, statistics[: first + 1]]) + "\n"


# ----------------------------------------------------------------------------------------------
# anistat run: the null-check protocol and refit runs (the quickstart: test_report_inputs.py)
# ----------------------------------------------------------------------------------------------
def test_null_check_methods_text_matches_the_golden_file():
    """Random proxies drawn anew at every checkpoint: never "fitted … then frozen", and the
    fit sequences fit nothing."""
    protocol = load_protocol(ROOT / "protocols" / "null-check.yaml")
    text = methods_text(
        report_inputs(protocol, plan_results(protocol, proxies=("random@refit",)), quickstart_manifest(protocol))
    )
    proxies = text[text.index("Proxies and gradients.") : text.index("Controls.")]
    assert "frozen" not in proxies and "fitted" not in proxies
    assert "anew at every checkpoint (labelled random@refit)" in proxies
    assert "sequences fit the proxies" not in text and "the proxies use no activation" in text
    matches_golden("null_check_methods.txt", text)


def test_refit_methods_text_matches_the_golden_file():
    """proxies.refit: both — the frozen and the refitted proxy each described as what it is."""
    data = load_protocol(ROOT / "protocols" / "quickstart.yaml").normalised()
    data["proxies"]["refit"] = "both"
    protocol = parse_protocol(data, "refit")
    text = methods_text(
        report_inputs(protocol, plan_results(protocol, proxies=("pca", "pca@refit")), quickstart_manifest(protocol))
    )
    proxies = text[text.index("Proxies and gradients.") : text.index("Controls.")]
    assert "then frozen (labelled pca)" in proxies and "refitted on each checkpoint's own fit sequences" in proxies
    matches_golden("refit_methods.txt", text)


# ----------------------------------------------------------------------------------------------
# measured inside a training loop: real runs
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_training_meter_methods_text_describes_the_loop(tmp_path):
    """The issue's case: the text described the built-in corpus and '64 sequences … the earliest
    30 % of the checkpoints' while the loop's own batches (here 12 fit sequences of steps 0–1)
    were used; 'early' is the first 30 % of the measured steps."""
    from anistat.callbacks import TrainingMeter

    model = tiny_gpt2()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = TrainingMeter(
        model,
        out=tmp_path / "bundle",
        **PLAIN_SCHEDULE,
        verbose=False,
        **SETTINGS,
    )
    # 6 sequences a step: 12 per unit of 2 steps, enough resampling units for intervals
    for step, batch in enumerate(batches(5, batch=6)):
        with meter.step(step):
            model(input_ids=batch, labels=batch).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    meter.close()
    contents = Bundle.load(tmp_path / "bundle")
    corpus = contents.manifest["corpus"]
    text = kind_specific_text(contents.report_inputs())
    for false in ("built-in corpus", "64 sequences", "earliest 30 % of the checkpoints", "test sequences", "disjoint"):
        assert false not in text, false
    assert f"the {corpus['fit_sequences']} sequences of training steps 0, 1 fit the proxies" in text
    assert f"the {corpus['measured_sequences']} sequences of training steps 1, 3 (units of 2 consecutive steps)" in text
    assert "by TrainingMeter in the user's own PyTorch loop" in text
    assert "early phase (the first 30 % of the measured steps): step1" in text
    matches_golden("meter_methods.txt", text)
    # the captions speak of measured steps and of the loop's fit steps too
    from anistat.report.figures import FIGURES
    from anistat.report.render import figure_context

    ctx = ReportContext(inputs=contents.report_inputs(), options=FAST)
    captions = {name: function(ctx.full if full else ctx.main, figure_context(ctx)) for name, function, full in FIGURES}
    trajectory = captions["energy_ratio_trajectory"].caption
    assert "over measured training steps" in trajectory
    assert "the first 30 % of the measured steps; the proxies were fitted on training steps 0, 1" in trajectory
    assert "resampling 12 sequences per unit" in trajectory
    assert "at the last measured step of each training phase" in captions["forest_effects"].caption
    assert_answer_is_true(ctx, "plain", "early in the measured training (step1)")


@pytest.mark.slow
def test_trainer_callback_methods_text_describes_the_trainer_run(tmp_path):
    from anistat.callbacks import AnistatCallback

    callback = AnistatCallback(
        out=tmp_path / "bundle", fit_steps=[0], measure_steps=[0, 2, 4], name="trained", verbose=False, **SETTINGS
    )
    tiny_trainer(tmp_path, [callback], gradient_accumulation_steps=2).train()
    assert callback.error is None, callback.error
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["models"]["trained"]["driver"] == "AnistatCallback"
    text = kind_specific_text(Bundle.load(tmp_path / "bundle").report_inputs())
    assert "AnistatCallback in a transformers Trainer run (5 optimiser steps, effective batch 8" in text
    assert "Training step 0 was both fitted and measured" in text
    assert "built-in corpus" not in text and "earliest 30 % of the checkpoints" not in text
    matches_golden("callback_methods.txt", text)
    assert_answer_is_true(
        ReportContext(inputs=Bundle.load(tmp_path / "bundle").report_inputs(), options=FAST),
        "trained",
        "early in the measured training (step0)",
    )


# ----------------------------------------------------------------------------------------------
# figure captions
# ----------------------------------------------------------------------------------------------
def caption_results(protocol) -> tuple[pd.DataFrame, pd.DataFrame]:
    """plan_results plus what the figures draw: energy fractions (with control mean and SD),
    log2 ratios, and per-frequency-bucket ratios (frequency.csv) at rank 4."""
    results = plan_results(protocol)
    ratios = results[results["metric"] == "energy_ratio"]
    fractions = ratios.assign(
        metric="energy_fraction",
        estimate=ratios["estimate"] / 20,
        ci_low=ratios["ci_low"] / 20,
        ci_high=ratios["ci_high"] / 20,
        control_mean=0.0625,
        control_sd=0.004,
    )
    logs = ratios.assign(
        metric="log2_energy_ratio",
        estimate=np.log2(ratios["estimate"]),
        ci_low=np.log2(ratios["ci_low"]),
        ci_high=np.log2(ratios["ci_high"]),
    )
    results = pd.concat([results, fractions, logs], ignore_index=True)
    buckets = ratios[(ratios["rank"] == 4) & (ratios["control"] == "normal")]
    frequency = pd.concat(
        [
            buckets.assign(bucket=str(b), estimate=buckets["estimate"] * (1 + 0.1 * b), ci_method="percentile")
            for b in range(3)
        ],
        ignore_index=True,
    )
    return results, frequency.reindex(columns=FREQUENCY_COLUMNS)  # in frequency.csv's columns


@pytest.mark.slow
def test_quickstart_figure_captions_match_the_golden_file():
    """Captions say what the run did: the resampling unit and its count, the interval method,
    what 'early' is — not a fixed 'bootstrap over sequences' (issue #20: 30 documents were
    resampled)."""
    from anistat.report.figures import FIGURES
    from anistat.report.render import figure_context

    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    results, frequency = caption_results(protocol)
    inputs = report_inputs(protocol, results, quickstart_manifest(protocol), frequency=frequency)
    ctx = ReportContext(inputs=inputs, options=FAST)
    fig_ctx = figure_context(ctx)
    captions = []
    for name, function, wants_full in FIGURES:
        spec = function(ctx.full if wants_full else ctx.main, fig_ctx)
        captions.append(f"{name}: {spec if isinstance(spec, str) else spec.caption}")
    text = "\n\n".join(captions) + "\n"
    assert "bootstrap over sequences" not in text
    assert " intervals, resampling 38–41 documents per unit" in text  # the method: the shipped results'
    assert "the first 30 % of the checkpoints, on which the proxies were fitted" in text
    matches_golden("quickstart_captions.txt", text)


@pytest.mark.slow
def test_a_real_refit_run_of_random_proxies_reports_what_it_did(tmp_path, capsys):
    """A real `anistat run` of the null-check design in miniature (random proxies drawn anew per
    checkpoint): the methods never say "fitted … then frozen", the figures find the
    `random@refit` rows, and the null check states its verdict."""
    from conftest import MINI_PROTOCOL

    from anistat.cli import main

    protocol = tmp_path / "null.yaml"
    protocol.write_text(
        MINI_PROTOCOL.replace(
            "proxies: {methods: [pca], ranks: [2, 4], max_fit_tokens: 400, concept_card_tokens: 3}",
            "proxies: {methods: [random], ranks: [2, 4], refit: per_checkpoint}",
        )
    )
    assert "refit: per_checkpoint" in protocol.read_text()
    assert main(["run", str(protocol), "--out", str(tmp_path / "bundle"), "--quiet"]) == 0, capsys.readouterr().err
    html = (tmp_path / "bundle" / "report.html").read_text(encoding="utf-8")
    methods_html = html[html.index('id="methods"') :]
    assert "anew at every checkpoint (labelled random@refit)" in methods_html and "then frozen" not in methods_html
    for skipped in (
        "no energy_ratio rows",
        "no log2_energy_ratio",
        "no energy_fraction rows",
        "no delta_isoscore_star rows",
    ):
        assert skipped not in html, skipped
    assert (
        "Null check (uninformative random proxy" in html and "uniformity against the p-values&#39; own null law" in html
    )
    answer = html[html.index('<p class="answer" id="answer">') :]
    assert (
        answer.startswith('<p class="answer" id="answer"><b>Answer.</b> ')
        and (
            "this run asks whether the tests reject an uninformative (uniformly random) proxy at their nominal rate, not "
            "whether a proxy captures more; the exact test (Haar draws) rejects it in"
        )
        in answer[:600]
    )
