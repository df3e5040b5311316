"""Workflow around a finished bundle: `anistat.load`, `run --overwrite`, `verify --claims`,
`report --metrics` checks and the progress lines of `run` and `report` (real runs, in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import MINI_PROTOCOL

import anistat
from anistat.cli import main

CLAIM = """
claims:
  - {id: dec-early, metric: energy_fraction, where: {model: dec, phase: early}, compare: ">", threshold: 0.0}
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """(protocol path, bundle path, stdout of the run, the RunResult returned by anistat.run)."""
    import anistat.report.render

    root = tmp_path_factory.mktemp("workflow")
    protocol = root / "mini.yaml"
    protocol.write_text(MINI_PROTOCOL + CLAIM)
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as patch:  # figures are not what these tests are about
        patch.setattr(anistat.report.render, "render_figures", lambda *args, **kwargs: ([], {}))
        result = anistat.run(protocol, root / "bundle", log=lines.append)
    return protocol, root / "bundle", lines, result


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def digests(directory: Path) -> dict[str, str]:
    return json.loads((directory / "manifest.json").read_text())["files"]


@pytest.mark.slow
def test_load_returns_what_run_returned(bundle):
    _, path, _, result = bundle
    loaded = anistat.load(path)
    assert isinstance(loaded, anistat.Bundle)
    assert loaded.path == path and loaded.manifest == json.loads(json.dumps(result.manifest))
    assert loaded.claims == result.claims and loaded.claims[0]["id"] == "dec-early"
    # same columns, same dtypes (integers stay integers), numbers to the 10 digits written
    pd.testing.assert_frame_equal(loaded.results, result.results, check_exact=False, rtol=1e-9, atol=0)


def test_load_of_a_non_bundle_is_one_clear_error(tmp_path):
    with pytest.raises(anistat.AnistatInputError, match="not an anistat bundle"):
        anistat.load(tmp_path)


@pytest.mark.slow
def test_run_progress_between_analysing_and_wrote(bundle):
    _, _, lines, _ = bundle
    stages = ["analysing", "analysed:", "writing the bundle", "rendered", "wrote"]
    positions = [next(i for i, line in enumerate(lines) if stage in line) for stage in stages]
    assert positions == sorted(positions), lines
    # results and frequency rows come from one pass over the units, and the summary line counts both
    analysed = lines[positions[1]]
    assert "result rows" in analysed and "frequency rows" in analysed, analysed


@pytest.mark.slow
def test_run_refuses_to_overwrite_a_bundle(bundle, capsys, monkeypatch):
    protocol, path, _, _ = bundle
    before = digests(path)
    code, _, err = run_cli(capsys, "run", protocol, "--out", path)
    assert code == 2 and err.strip().splitlines() == [
        f"anistat: error: --out {path}: a bundle already exists there; pass --overwrite to replace it, or choose "
        "another --out"
    ]
    assert digests(path) == before
    import anistat.report.render

    monkeypatch.setattr(anistat.report.render, "render_figures", lambda *args, **kwargs: ([], {}))
    code, out, err = run_cli(capsys, "run", protocol, "--out", path, "--overwrite", "--quiet")
    assert code == 0 and err == "" and "claim dec-early: PASS" in out
    assert json.loads((path / "manifest.json").read_text())["started_at"]


@pytest.mark.slow
def test_verify_new_claims_against_an_existing_bundle(bundle, capsys, tmp_path):
    _, path, _, _ = bundle
    before = digests(path)
    claims = tmp_path / "new.yaml"
    claims.write_text(
        "- {id: enc-late, metric: energy_fraction, where: {model: enc, phase: late}, threshold: 0}\n"
        "- {id: too-much, metric: energy_fraction, where: {model: enc}, threshold: 1.0}\n"
    )
    code, out, err = run_cli(capsys, "verify", path, "--claims", claims)
    assert code == 1 and err == ""  # too-much fails: an energy fraction never exceeds 1
    assert f"claims: 2 from {claims}, evaluated against the existing bundle {path}" in out
    assert "not the claims of its protocol; nothing was re-run" in out
    assert "claim enc-late: PASS" in out and "claim too-much: FAIL" in out and "dec-early" not in out
    # a protocol file's claims section works as well, and a passing set exits 0
    protocol_like = tmp_path / "protocol-like.yaml"
    protocol_like.write_text(
        "name: x\nclaims:\n  - {id: ok, metric: oracle_fraction, where: {rank: 2}, threshold: 0}\n"
    )
    assert run_cli(capsys, "verify", path, "--claims", protocol_like)[0] == 0
    assert digests(path) == before  # the bundle is read, never changed


@pytest.mark.slow
@pytest.mark.parametrize(
    "text, needles",
    [
        (
            "- {id: t, metric: energy_ration}\n",
            ["claims[0] 't'", "metric 'energy_ration' is not in this bundle", "energy_ratio"],
        ),
        ("- {id: t, metric: energy_ratio, where: {modle: dec}}\n", ["where key 'modle'", "valid keys: model"]),
        ("- {id: t, metric: energy_ratio, where: {model: [dec, dek]}}\n", ["where.model = 'dek'", "values: dec, enc"]),
        ("- {id: t, metric: energy_ratio, compare: '=>'}\n", ["claims[0]: compare", "'=>'"]),
        ("[]\n", ["expected a non-empty list of claims"]),
    ],
)
def test_verify_claims_file_mistakes(bundle, capsys, tmp_path, text, needles):
    _, path, _, _ = bundle
    claims = tmp_path / "new.yaml"
    claims.write_text(text)
    code, _, err = run_cli(capsys, "verify", path, "--claims", claims)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.slow
def test_report_rejects_unknown_metrics(bundle, capsys):
    _, path, _, _ = bundle
    before = digests(path)
    code, out, err = run_cli(capsys, "report", path, "--metrics", "energy_ratio,energy_ratoi", "--no-pdf")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "anistat: error: --metrics: unknown metric(s) energy_ratoi; this bundle has: "
        + ", ".join(sorted(pd.read_csv(path / "results.csv").metric.unique()))
    ]
    assert digests(path) == before


@pytest.mark.slow
def test_report_progress_and_quiet(bundle, capsys, monkeypatch):
    import anistat.report.render

    monkeypatch.setattr(anistat.report.render, "render_figures", lambda *args, **kwargs: ([], {}))
    _, path, _, _ = bundle
    code, out, err = run_cli(capsys, "report", path, "--metrics", "energy_ratio", "--no-pdf")
    assert code == 0 and err.splitlines()[0].startswith(f"re-rendering {path}:") and "rendered (" in err
    assert out.splitlines() == [f"re-rendered 3 file(s) in {path}"]  # progress on stderr, the result on stdout
    code, out, _ = run_cli(capsys, "report", path, "--no-pdf", "-q")
    assert code == 0 and out.splitlines() == [f"re-rendered 3 file(s) in {path}"]
