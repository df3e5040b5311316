"""Every user-facing choice is named once, in `anistat.vocabulary`, and every table that acts on
or describes a choice covers the vocabulary exactly."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from anistat import vocabulary as vocab

PACKAGE = Path(__file__).resolve().parents[2] / "anistat"

#: The names the one-definition rule covers: interval methods, control kinds, proxy methods and
#: multiplicity procedures. ``none`` (no correction) is left out: the same word is the results'
#: "no control" / "no interval" / "no fallback" value in dozens of places, none of them the
#: multiplicity choice.
NAMES = {
    *vocab.CI_METHODS,
    *vocab.FREQUENCY_INTERVALS,
    *vocab.CONTROL_KINDS,
    *vocab.PROXY_KINDS,
    *vocab.CORRECTIONS,
}
#: String literals that spell a vocabulary name but mean something else, each with its reason.
OTHER_MEANINGS = {
    ("claims.py", "normal"): "the normal law of a Wald statistic with infinite degrees of freedom",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def string_literals(names: set[str]) -> dict[str, list[str]]:
    """``name -> ["file:line", …]`` for every string constant of the package (outside the
    vocabulary module, docstrings excluded) equal to one of ``names``."""
    hits: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "vocabulary.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in names
                and id(node) not in skip
                and (rel, node.value) not in OTHER_MEANINGS
            ):
                hits[node.value].append(f"{rel}:{node.lineno}")
    return hits


def test_every_name_is_written_out_once():
    """Outside `anistat/vocabulary.py`, a choice's name appears as a string literal at most once
    (the implementations use the vocabulary's constants)."""
    repeated = {name: where for name, where in string_literals(NAMES).items() if len(where) > 1}
    assert not repeated, repeated


def test_the_scan_finds_a_literal():
    """The scan itself can fail: it sees the one exception it is told about when not told."""
    tree = ast.parse((PACKAGE / "claims.py").read_text(encoding="utf-8"))
    assert any(isinstance(n, ast.Constant) and n.value == vocab.NORMAL for n in ast.walk(tree))
    assert string_literals({"energy_ratio"})["energy_ratio"], "a metric name used in many places is found"


def test_every_choice_is_complete():
    tables = (vocab.CI_METHODS, vocab.FREQUENCY_INTERVALS, vocab.CONTROL_KINDS, vocab.PROXY_KINDS, vocab.MULTIPLICITY)
    for table in (*tables, vocab.SCENARIOS):
        for name, choice in table.items():
            assert choice.name == name
            assert choice.label and choice.latex and choice.sentence, name
    for kind in vocab.CONTROL_KINDS.values():
        assert kind.sentence_latex
    assert vocab.DEFAULT_CI_METHOD in vocab.CI_METHODS
    assert vocab.DEFAULT_MULTIPLICITY in vocab.MULTIPLICITY
    assert vocab.DEFAULT_PROXY_METHOD in vocab.PROXY_KINDS
    assert set(vocab.DEFAULT_CONTROL_KINDS) <= set(vocab.CONTROL_KINDS)
    assert set(vocab.DOCUMENT_SCENARIOS) <= set(vocab.SCENARIOS)


def test_energy_intervals_dispatch_covers_the_ci_methods():
    from anistat.stats import energy

    assert set(energy.INTERVALS) == set(vocab.CI_METHODS)
    assert energy.CI_METHODS == tuple(vocab.CI_METHODS)


def test_ratio_intervals_cover_the_ratio_methods():
    from anistat.stats import energy, ratio_intervals

    bootstrap_only = {vocab.BCA, vocab.PERCENTILE, vocab.STUDENTIZED}
    assert set(energy.RATIO_CI_METHODS) == set(vocab.CI_METHODS) - bootstrap_only
    assert set(ratio_intervals.RATIO_INTERVAL_METHODS) == {ratio_intervals.STUDENTIZED_LOG, *energy.RATIO_CI_METHODS}
    # the intervals that read no resamples are exactly the empirical-likelihood ones
    no_resamples = {name for name, m in vocab.CI_METHODS.items() if not m.resamples}
    assert no_resamples == set(ratio_intervals.RATIO_INTERVAL_METHODS) - set(ratio_intervals.BOOTSTRAP_RATIO_METHODS)


def test_every_ci_method_runs_through_analyze_energy():
    from anistat import stats

    rng = np.random.default_rng(0)
    p, t = rng.uniform(1, 2, 24), rng.uniform(4, 6, 24)
    for method in vocab.CI_METHODS:
        a = stats.analyze_energy(
            p,
            t,
            t * 2 / 16,
            rank=2,
            dim=16,
            null_fractions=rng.uniform(0.05, 0.2, 99),
            n_bootstrap=200,
            ci_method=method,
        )
        ratio = a["energy_ratio"]
        assert ratio.ci_low < ratio.estimate < ratio.ci_high, method


def test_control_draws_cover_the_control_kinds():
    import torch

    from anistat.geometry import controls
    from anistat.stats import energy

    assert set(controls.CONTROL_DRAWS) == set(vocab.CONTROL_KINDS)
    basis = torch.eye(8, dtype=torch.float64)[:, :2]
    acts = torch.randn(50, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for kind in vocab.CONTROL_KINDS:
        q = controls.draw_controls(kind, basis, n=3, seed=1, activations=acts)
        assert tuple(q.shape) == (3, 8, 2), kind
    for kind in set(vocab.CONTROL_KINDS) - set(vocab.CLOSED_FORM_KINDS):
        with pytest.raises(ValueError):
            energy.expected_control_energy(kind, [1.0], [4.0], rank=2, dim=8)
    for kind in vocab.CLOSED_FORM_KINDS:
        assert energy.expected_control_energy(kind, [1.0], [4.0], rank=2, dim=8).shape == (1,)


def test_proxy_registry_covers_the_proxy_kinds():
    from anistat.geometry import proxies

    built_in = {name for name, cls in proxies.PROXY_METHODS.items() if cls.__module__ == proxies.__name__}
    assert built_in == set(vocab.PROXY_KINDS)


def test_multiplicity_covers_the_procedures():
    from anistat.stats import multiplicity, resampling_risk

    assert multiplicity.METHODS == vocab.CORRECTIONS
    assert set(resampling_risk.FAMILY_METHODS) == set(vocab.MULTIPLICITY)
    for name in vocab.CORRECTIONS:
        assert multiplicity.adjust_pvalues([0.01, 0.04], name).shape == (2,)


def test_the_protocol_offers_the_vocabulary():
    from anistat.protocol import Protocol, StatsSpec

    schema = Protocol.model_json_schema()["$defs"]
    assert schema["StatsSpec"]["properties"]["ci_method"]["enum"] == list(vocab.CI_METHODS)
    assert schema["StatsSpec"]["properties"]["multiplicity"]["enum"] == list(vocab.MULTIPLICITY)
    assert schema["ControlSpec"]["properties"]["kinds"]["items"]["enum"] == list(vocab.CONTROL_KINDS)
    with pytest.raises(ValueError):
        StatsSpec(ci_method="not_a_method")


def test_one_default_interval():
    """The protocol, the analysis, the planner and the calibration default to the same interval."""
    import inspect

    from anistat import plan
    from anistat.protocol import StatsSpec
    from anistat.stats import analyze_energy, calibrate, ratio_intervals

    assert StatsSpec().ci_method == vocab.DEFAULT_CI_METHOD
    assert inspect.signature(analyze_energy).parameters["ci_method"].default == vocab.DEFAULT_CI_METHOD
    assert inspect.signature(calibrate.run_calibration).parameters["ci_method"].default == vocab.DEFAULT_CI_METHOD
    assert inspect.signature(ratio_intervals.calibrated_concentration).parameters["method"].default == (
        vocab.DEFAULT_CI_METHOD
    )
    assert plan.DEFAULT_CI_METHOD == vocab.DEFAULT_CI_METHOD


def test_the_report_labels_every_choice():
    from anistat.report import _content, _data, answer

    assert set(_data.CI_METHOD_TEXT) == set(vocab.CI_METHODS) | set(vocab.FREQUENCY_INTERVALS)
    assert set(_content.RATIO_METHOD_SENTENCES) == set(vocab.CI_METHODS)
    assert set(_content.CONTROL_DESCRIPTIONS) == set(vocab.CONTROL_KINDS)
    assert set(_content.PROXY_DESCRIPTIONS) | set(_content.DATA_FREE_PROXIES) == set(vocab.PROXY_KINDS)
    assert set(_content.MULTIPLICITY_NAMES) == set(vocab.MULTIPLICITY)
    assert set(answer.ADJUSTED_NAMES) == set(vocab.CORRECTIONS)
    assert answer.ADJUSTED_NAMES[vocab.FDR_BH] == "BH-adjusted"
