"""The statistics API at its boundary: every choice is checked by one `check_choice` against the
module's constant, a typo is refused (never silently run as the default), a declared warning is
raised where its fallback happens."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import anistat.stats as stats
from anistat.stats import bootstrap, energy, meta, multiplicity
from anistat.stats._validation import ALTERNATIVES, check_choice

RNG = np.random.default_rng(0)
P, T, E = RNG.uniform(1, 2, 12), RNG.uniform(3, 4, 12), RNG.uniform(1, 2, 12)
W = stats.bootstrap_weights(12, 50, seed=1)

#: (call with a misspelt choice, the parameter's name) for every exported function taking a choice.
TYPOS = {
    "studentized_ratio_test(alternative)": (
        lambda: stats.studentized_ratio_test(P, E, W, alternative="two_sided"),
        "alternative",
    ),
    "ci_from_replicates(method)": (lambda: stats.ci_from_replicates(1.0, RNG.normal(size=50), method="BCa"), "method"),
    "ci_from_replicates(bca_fallback)": (
        lambda: stats.ci_from_replicates(1.0, RNG.normal(size=50), bca_fallback="normal"),
        "bca_fallback",
    ),
    "sequence_bootstrap(method)": (
        lambda: stats.sequence_bootstrap(lambda w: w.sum(1), 12, n_resamples=20, method="pct"),
        "method",
    ),
    "sequence_bootstrap_columns(method)": (
        lambda: stats.sequence_bootstrap_columns(lambda w: w, 12, n_resamples=20, method="studentized"),
        "method",
    ),
    "sequence_bootstrap_columns(bca_fallback)": (
        lambda: stats.sequence_bootstrap_columns(lambda w: w, 12, n_resamples=20, bca_fallback="x"),
        "bca_fallback",
    ),
    "analyze_energy(ci_method)": (
        lambda: stats.analyze_energy(P, T, E, rank=2, dim=8, null_fractions=[0.2, 0.3], ci_method="basic"),
        "ci_method",
    ),
    "analyze_energy(reference)": (
        lambda: stats.analyze_energy(P, T, E, rank=2, dim=8, null_fractions=[0.2, 0.3], reference="draws"),
        "reference",
    ),
    "analyze_energy(alternative)": (
        lambda: stats.analyze_energy(P, T, E, rank=2, dim=8, null_fractions=[0.2, 0.3], alternative="more"),
        "alternative",
    ),
    "analyze_metric_vs_controls(alternative)": (
        lambda: stats.analyze_metric_vs_controls(1.0, [0.5, 0.7], alternative="Greater"),
        "alternative",
    ),
    "expected_control_energy(kind)": (lambda: stats.expected_control_energy("pca_span", P, T, 2, 8), "kind"),
    "control_energy_moments(kind)": (lambda: stats.control_energy_moments("cov_matched", 2, 8, 1.0, 1.0), "kind"),
    "monte_carlo_pvalue(alternative)": (lambda: stats.monte_carlo_pvalue(1.0, [0.5], alternative="up"), "alternative"),
    "sequential_monte_carlo_pvalue(alternative)": (
        lambda: stats.sequential_monte_carlo_pvalue(1.0, [0.5], 1, alternative="up"),
        "alternative",
    ),
    "sign_flip_test(alternative)": (lambda: stats.sign_flip_test(P - E, 99, alternative="up"), "alternative"),
    "adjust_pvalues(method)": (lambda: stats.adjust_pvalues([0.1, 0.2], method="BH"), "method"),
    "adjust_in_families(method)": (
        lambda: stats.adjust_in_families(pd.DataFrame({"p_value": [0.1]}), None, method="BH"),
        "method",
    ),
    "adjust_in_families(method), empty family": (
        lambda: stats.adjust_in_families(pd.DataFrame({"p_value": [np.nan], "m": ["a"]}), ["m"], method="BH"),
        "method",
    ),
    "min_controls_needed(method)": (lambda: stats.min_controls_needed(0.05, 3, method="fdr"), "method"),
    "random_effects_meta(method)": (lambda: stats.random_effects_meta([1, 2], [1, 1], method="REML"), "method"),
    "random_effects_meta(interval)": (lambda: stats.random_effects_meta([1, 2], [1, 1], interval="HKSJ"), "interval"),
    "run_calibration(ci_method)": (lambda: stats.run_calibration(1, ci_method="normal"), "ci_method"),
    "ratio_interval(method)": (lambda: stats.ratio_interval(P, E, "bca", W), "method"),
    "ratio_el_interval(adjustment)": (lambda: stats.ratio_el_interval(P, E, adjustment="bartlett"), "adjustment"),
    "ratio_el_statistic(adjustment)": (lambda: stats.ratio_el_statistic(P, E, 1.0, "AEL"), "adjustment"),
}


@pytest.mark.parametrize("case", sorted(TYPOS))
def test_a_misspelt_choice_is_refused_naming_the_parameter(case):
    call, name = TYPOS[case]
    with pytest.raises(ValueError, match=rf"^{name} must be one of "):
        call()


def test_check_choice_returns_the_value_and_names_every_choice():
    assert check_choice("alternative", "less", ALTERNATIVES) == "less"
    with pytest.raises(ValueError, match="alternative must be one of 'greater', 'less', 'two-sided'; got 3"):
        check_choice("alternative", 3, ALTERNATIVES)


def test_the_allowed_values_are_the_modules_constants():
    assert stats.sequence_bootstrap_columns.__module__ == "anistat.stats.bootstrap"
    assert set(bootstrap.COLUMN_METHODS) == set(bootstrap.METHODS) - {"studentized"}
    assert set(energy.CI_METHODS) <= set(bootstrap.METHODS) | set(energy.RATIO_CI_METHODS)
    assert set(energy.RATIO_CI_METHODS) < set(stats.RATIO_INTERVAL_METHODS)
    assert energy.CLOSED_FORM_KINDS == ("normal", "haar")
    assert meta.SMALL_SAMPLE_CORRECTIONS == ("CR2", "CR0")
    assert multiplicity.METHODS == ("holm", "fdr_bh", "bonferroni")


def test_the_studentized_test_runs_each_alternative_as_asked():
    tests = {
        alternative: stats.studentized_ratio_test(P, E, W, alternative=alternative) for alternative in ALTERNATIVES
    }
    greater, less = tests["greater"].p_value, tests["less"].p_value
    assert tests["two-sided"].p_value == pytest.approx(min(1.0, 2 * min(greater, less)))


def test_a_bca_fallback_raises_the_declared_warning_when_enabled():
    replicates = np.r_[np.zeros(49), 1.0]  # p0 = 0.98 but fewer than 3 jackknife units: BCa undefined
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", stats.DegenerateStatisticWarning)
        result = stats.ci_from_replicates(0.5, replicates, jackknife=np.array([0.4, 0.6]), method="bca")
    assert result.method == "percentile" and "BCa fell back to percentile" in result.note
    assert [w.category for w in caught] == [stats.DegenerateStatisticWarning]
    assert str(caught[0].message) == result.note.split("; ")[-1]


def test_the_warning_is_silent_by_default():
    """In a plain interpreter (no pytest filters), importing anistat.stats installs the ignore
    filter, so a fallback stays in `note` and prints nothing."""
    code = (
        "import warnings, numpy as np, anistat.stats as s\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    r = s.ci_from_replicates(0.5, np.r_[np.zeros(49), 1.0], jackknife=np.array([0.4, 0.6]))\n"
        "print(r.method, len(caught))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.split() == ["percentile", "0"] and done.stderr == ""


def _documented(name: str) -> bool:
    value = getattr(stats, name)
    return inspect.isfunction(value) or inspect.isclass(value)


@pytest.mark.parametrize("name", [name for name in stats.__all__ if _documented(name)])
def test_every_public_statistic_has_an_examples_section(name):
    doc = inspect.getdoc(getattr(stats, name)) or ""
    assert "\nExamples\n--------\n" in doc and ">>> " in doc, f"anistat.stats.{name} has no Examples section"


def _geometry_functions() -> list[str]:
    import anistat.geometry as geometry

    return [name for name in geometry.__all__ if inspect.isfunction(getattr(geometry, name))]


@pytest.mark.parametrize("name", _geometry_functions())
def test_every_public_geometry_function_has_an_examples_section(name):
    import anistat.geometry as geometry

    doc = inspect.getdoc(getattr(geometry, name)) or ""
    assert "\nExamples\n--------\n" in doc and ">>> " in doc, f"anistat.geometry.{name} has no Examples section"


def _modules_with_examples() -> list[str]:
    import pkgutil

    import anistat.geometry
    import anistat.stats

    return [
        info.name
        for package in (anistat.stats, anistat.geometry)
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + ".")
    ]


@pytest.mark.parametrize("module_name", _modules_with_examples())
def test_the_examples_run_as_written(module_name):
    """What `pytest --doctest-modules anistat/stats anistat/geometry` runs, inside the suite."""
    import doctest
    import importlib

    outcome = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS, verbose=False)
    assert outcome.failed == 0, f"{outcome.failed} of {outcome.attempted} examples in {module_name} fail"


#: A numpydoc entry: its name (``**options`` read as ``options``), a colon and its type.
SECTION_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*:\s*\S", re.MULTILINE)


def _numpydoc_section(doc: str, title: str) -> str | None:
    """The body of the section `title` (up to the next underlined heading), or None if absent."""
    match = re.search(rf"^{title}\n-+\n(.*?)(?=^\w[\w ]*\n-+\n|\Z)", doc, re.MULTILINE | re.DOTALL)
    return None if match is None else match.group(1)


def _numpydoc_documented() -> list[str]:
    """Every function and class of ``anistat.stats.__all__`` but the warning classes, which take
    only a message and carry no fields."""
    return [
        name
        for name in stats.__all__
        if _documented(name)
        and not (inspect.isclass(getattr(stats, name)) and issubclass(getattr(stats, name), Warning))
    ]


@pytest.mark.parametrize("name", _numpydoc_documented())
def test_every_public_statistic_documents_its_parameters_and_result(name):
    """A function: Parameters (when it takes any) naming its signature, and Returns. A result
    class: Parameters or Attributes naming its constructor's fields."""
    value = getattr(stats, name)
    doc = inspect.getdoc(value) or ""
    signature = list(inspect.signature(value).parameters)
    if inspect.isfunction(value):
        listed, result = _numpydoc_section(doc, "Parameters"), _numpydoc_section(doc, "Returns")
        assert result, f"anistat.stats.{name} has no Returns section"
    else:
        listed = _numpydoc_section(doc, "Parameters") or _numpydoc_section(doc, "Attributes")
    if signature or not inspect.isfunction(value):
        assert listed is not None, f"anistat.stats.{name} has no Parameters section"
        assert SECTION_ENTRY.findall(listed) == signature, f"anistat.stats.{name}: documented != signature"


@pytest.mark.parametrize("name", _geometry_functions())
def test_every_public_geometry_function_documents_its_parameters_and_result(name):
    """Parameters naming the signature in order, and Returns."""
    import anistat.geometry as geometry

    value = getattr(geometry, name)
    doc = inspect.getdoc(value) or ""
    listed, result = _numpydoc_section(doc, "Parameters"), _numpydoc_section(doc, "Returns")
    assert result, f"anistat.geometry.{name} has no Returns section"
    assert listed is not None, f"anistat.geometry.{name} has no Parameters section"
    assert SECTION_ENTRY.findall(listed) == list(inspect.signature(value).parameters), (
        f"anistat.geometry.{name}: documented != signature"
    )


def _geometry_result_types() -> list[str]:
    import dataclasses

    import anistat.geometry as geometry

    return [name for name in geometry.__all__ if dataclasses.is_dataclass(getattr(geometry, name))]


@pytest.mark.parametrize("name", _geometry_result_types())
def test_every_public_geometry_result_type_documents_its_fields(name):
    """Attributes naming the constructor's fields, in order."""
    import anistat.geometry as geometry

    value = getattr(geometry, name)
    listed = _numpydoc_section(inspect.getdoc(value) or "", "Attributes")
    assert listed is not None, f"anistat.geometry.{name} has no Attributes section"
    assert SECTION_ENTRY.findall(listed) == list(inspect.signature(value).parameters), name


def test_the_section_parser_reads_names_and_stops_at_the_next_section():
    doc = "Sum.\n\nParameters\n----------\nx : float\n    One.\ny_2 : int\n\nReturns\n-------\nfloat\n    Sum.\n"
    assert SECTION_ENTRY.findall(_numpydoc_section(doc, "Parameters")) == ["x", "y_2"]
    assert SECTION_ENTRY.findall("x : float\n**options : Any\n    Passed on.\n") == ["x", "options"]
    assert _numpydoc_section(doc, "Attributes") is None


#: Dataclasses that are not results: updated in place by design, with the reason.
MUTABLE_BY_DESIGN = {
    "anistat.geometry.moments.GradientMoments": "a streaming accumulator: update and merge add to it in place",
}


def _public_dataclasses() -> list[type]:
    """Every dataclass defined in a module of ``anistat.stats``, ``anistat.geometry`` or
    ``anistat.analyze`` (their exported result types among them)."""
    import dataclasses
    import importlib
    import pkgutil

    import anistat.analyze
    import anistat.geometry

    modules = [
        importlib.import_module(info.name)
        for package in (stats, anistat.geometry, anistat.analyze)
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + ".")
    ] + [stats, anistat.geometry, anistat.analyze]
    found = {
        value
        for module in modules
        for value in vars(module).values()
        if inspect.isclass(value) and value.__module__ == module.__name__ and dataclasses.is_dataclass(value)
    }
    return sorted(found, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


@pytest.mark.parametrize("cls", _public_dataclasses(), ids=lambda cls: cls.__qualname__)
def test_every_result_type_is_frozen_and_keyword_only(cls):
    import dataclasses

    params = cls.__dataclass_params__
    name = f"{cls.__module__}.{cls.__qualname__}"
    assert all(field.kw_only for field in dataclasses.fields(cls) if field.init), f"{name} takes positional fields"
    assert all(
        parameter.kind is inspect.Parameter.KEYWORD_ONLY for parameter in inspect.signature(cls).parameters.values()
    )
    if name not in MUTABLE_BY_DESIGN:
        assert params.frozen, f"{name} is not frozen"


def test_a_result_refuses_positional_fields_and_assignment():
    import dataclasses

    with pytest.raises(TypeError, match="positional argument"):
        stats.ExactTestResult(0.01, 99)  # type: ignore[misc]
    result = stats.ExactTestResult(p_value=0.01, n_draws=99)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.p_value = 0.5  # type: ignore[misc]
    assert len(_public_dataclasses()) >= 25
