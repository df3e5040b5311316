"""One bundle object: `anistat.load` (= `anistat.bundle.Bundle.load`) reads a bundle once, and `verify`, `diff`,
`compare`, `report` and `verify --against` take it. Real bundles (the session's mini run), real
command lines; the comparison's renderers live in `anistat.report.comparison`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import anistat
import anistat.bundle as bundle_module
from anistat.bundle import Bundle, IntegrityProblem, read_results
from anistat.cli import main
from anistat.comparison import compare, compare_results
from anistat.errors import AnistatInputError
from anistat.replicate import compare_bundles
from anistat.report.comparison import ComparisonInputs, render_comparison_html, render_comparison_tex
from anistat.rerender import rerender
from anistat.verify import verify_bundle


def _copy(bundle: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(bundle, tmp_path / name))


@pytest.mark.slow
def test_load_reads_every_part_typed(mini_bundle):
    bundle = Bundle.load(mini_bundle)
    manifest = json.loads((mini_bundle / "manifest.json").read_text())
    assert bundle.path == mini_bundle and bundle.kind == "anistat_bundle" and bundle.manifest == manifest
    assert bundle.protocol.name == "mini" and bundle.protocol.sha256() == manifest["protocol_sha256"]
    assert bundle.results.equals(read_results(mini_bundle)) and str(bundle.results["rank"].dtype) == "Int64"
    assert bundle.concept_cards == json.loads((mini_bundle / "concept_cards.json").read_text())
    assert bundle.claims == [] and not bundle.has_claims_file
    assert bundle.integrity == () and bundle.files_recorded == len(manifest["files"])
    # the one public loader is this one
    assert anistat.load == Bundle.load and anistat.load(mini_bundle).results.equals(bundle.results)


@pytest.mark.slow
def test_the_integrity_check_runs_before_any_table_is_read(mini_bundle, tmp_path):
    edited = _copy(mini_bundle, tmp_path)
    (edited / "results.csv").write_text('model,metric,estimate\n"unclosed\n')
    with pytest.raises(AnistatInputError, match="cannot be read as CSV"):
        Bundle.load(edited)
    seen: list[tuple[IntegrityProblem, ...]] = []

    def refuse(path: Path, manifest: dict, problems: tuple[IntegrityProblem, ...]) -> None:
        seen.append(problems)
        raise AnistatInputError(f"{path}: refused")

    with pytest.raises(AnistatInputError, match="refused"):
        Bundle.load(edited, check=refuse)
    assert [(p.name, p.kind) for p in seen[0]] == [("results.csv", "modified")]
    # a check that lets the bundle through hands its integrity data to the bundle: computed once
    intact = Bundle.load(mini_bundle, check=lambda path, manifest, problems: seen.append(problems))
    assert intact.integrity is seen[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, reads",
    [
        (["verify", "{a}"], 1),
        (["verify", "{a}", "--json"], 1),
        (["diff", "{a}", "{b}"], 2),
        (["compare", "{a}", "{b}", "--out", "{out}"], 2),
        (["report", "{b}", "--no-pdf"], 1),
        (["summary", "{a}"], 1),
        (["summary", "{a}", "--json"], 1),
    ],
)
def test_each_command_reads_each_bundle_once(mini_bundle, tmp_path, monkeypatch, capsys, command, reads):
    copy = _copy(mini_bundle, tmp_path)
    calls: dict[str, list[Path]] = {"read_manifest": [], "read_results": []}
    for name in calls:
        original = getattr(bundle_module, name)

        def counted(path: Path, _name: str = name, _original=original):
            calls[_name].append(Path(path))
            return _original(path)

        monkeypatch.setattr(bundle_module, name, counted)
    args = [part.format(a=mini_bundle, b=copy, out=tmp_path / "cmp") for part in command]
    assert main(args) == 0, capsys.readouterr()
    for name, paths in calls.items():
        assert len(paths) == reads and len(set(paths)) == reads, (name, paths)


@pytest.mark.slow
def test_functions_take_a_loaded_bundle_or_a_path(mini_bundle, tmp_path):
    loaded = Bundle.load(mini_bundle)
    assert verify_bundle(loaded).to_json() == verify_bundle(mini_bundle).to_json()
    check = compare(loaded, loaded)
    assert check.ok and check.compared > 0 and check == compare(mini_bundle, mini_bundle)
    from_object = compare_bundles(loaded, loaded, out=tmp_path / "a")
    from_path = compare_bundles(mini_bundle, mini_bundle, out=tmp_path / "b")
    assert from_object[1:] == from_path[1:]
    for name in ("comparison.csv", "comparison.html", "comparison.tex"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    by_path, by_object = _copy(mini_bundle, tmp_path, "by-path"), _copy(mini_bundle, tmp_path, "by-object")
    (by_object / "report.html").write_text("edited")  # a rendered output: simply rendered again
    rerender(by_path, compile_pdf=False)
    written = rerender(Bundle.load(by_object), compile_pdf=False)
    assert by_object / "report.html" in written
    for name in ("report.html", "report.tex", "tables.tex"):
        assert (by_object / name).read_bytes() == (by_path / name).read_bytes(), name


def _results(model: str) -> pd.DataFrame:
    rows = [
        {"model": model, "checkpoint": "step0", "site": f"residual.{layer}", "rank": 2, "proxy": "pca"}
        | {"control": "normal", "metric": metric, "estimate": estimate, "ci_low": estimate - 0.1}
        | {"ci_high": estimate + 0.1, "p_adjusted": 0.01, "status": "ok"}
        for layer in (0, 1)
        for metric, estimate in (("energy_ratio", 1.5 + layer), ("energy_fraction", 0.2))
    ]
    return pd.DataFrame(rows)


def test_the_comparison_is_rendered_from_typed_inputs_and_escaped():
    hostile = _results("<i>d&c_%")
    comparison = compare_results(hostile, hostile.assign(estimate=hostile["estimate"] * 1.01))
    inputs = ComparisonInputs(
        comparison=comparison,
        claims=(
            {"id": "c<1>", "statement": "R > 1 & more", "original": "pass", "replication": "fail", "agree": False},
        ),
        environment=({"field": "torch", "original": "2.1", "replication": "2.2", "differs": True},),
        summary={"rows": len(comparison), "sign_agreement": 1.0},
        titles=("runs/<a>", "runs/b_%"),
    )
    html = render_comparison_html(inputs)
    assert "&lt;i&gt;d&amp;c_%" in html and "<i>d" not in html
    assert "c&lt;1&gt;" in html and "R &gt; 1 &amp; more" in html and '<tr class="diff">' in html
    energy = html.split("<h2>Energy ratios</h2>", 1)[1].split("<h2>", 1)[0]
    assert energy.count("<tr><td>") == 2 and "<td>0.015</td>" in energy and "<td>0.025</td>" in energy
    tex = render_comparison_tex(inputs)
    assert r"\textless{}i\textgreater{}d\&c\_\%" in tex and "runs/b\\_\\%" in tex
    assert tex.count(r"$\checkmark$") == 2 and "0.015 [" in tex
