"""`anistat report` checks the bundle's integrity first (issue #22): edited data are refused
unless the user says so, and then the manifest records the edit and `verify` keeps reporting it;
`--no-pdf` keeps an existing report.pdf. Real bundles from a real run, real CLI calls."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _helpers import edit_a_number  # noqa: E402
from conftest import MINI_PROTOCOL  # noqa: E402

import anistat  # noqa: E402
from anistat.cli import main  # noqa: E402

CLAIM = """
claims:
  - {id: dec-early, metric: energy_ratio, where: {model: dec, phase: early, control: normal}, compare: ">",
     threshold: 1.0, aggregate: meta, alpha: 0.05}
"""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("integrity")
    protocol = root / "mini.yaml"
    # the run compiles report.pdf where pdflatex is installed (the mini protocol switches it off)
    text = MINI_PROTOCOL.replace("report: {compile_pdf: false}\n", "") if shutil.which("pdflatex") else MINI_PROTOCOL
    protocol.write_text(text + CLAIM)
    anistat.run(protocol, root / "bundle")
    return root / "bundle"


@pytest.fixture
def bundle(pristine, tmp_path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(pristine, copy)
    return copy


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_verify_prints_the_evidence_and_json_for_scripts(bundle, capsys):
    code, out, err = cli(capsys, "verify", bundle)
    assert code == 0 and err == ""
    assert "claim dec-early: PASS — " in out and "  95 % interval [" in out and "decided by: interval" in out
    assert "  p = " in out and "H0: ln pooled energy_ratio = ln 1" in out
    code, out, err = cli(capsys, "verify", bundle, "--json")
    document = json.loads(out)
    assert code == 0 and err == "" and document["ok"] and document["integrity"]["ok"]
    assert document["integrity"]["files_checked"] == len(json.loads((bundle / "manifest.json").read_text())["files"])
    # the same records as claims.json
    assert document["claims"] == json.loads((bundle / "claims.json").read_text())
    code, out, err = cli(capsys, "verify", bundle, "--json", "--against", bundle)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--json" in err


@pytest.mark.slow
def test_report_refuses_edited_data_and_changes_nothing(bundle, capsys):
    assert cli(capsys, "verify", bundle)[0] == 0
    edit_a_number(bundle)
    before = snapshot(bundle)
    code, out, err = cli(capsys, "report", bundle, "--no-pdf")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "results.csv: modified (sha256 differs from the manifest)" in lines[0]
    assert "--allow-edited-data" in lines[0] and "anistat verify" in lines[0]
    assert snapshot(bundle) == before and out == ""  # nothing written, not even a progress line
    code, out, _ = cli(capsys, "verify", bundle)
    assert code == 3 and "integrity: results.csv: modified" in out and "files match" not in out


@pytest.mark.slow
def test_allowed_edit_is_recorded_and_verify_keeps_reporting_it(bundle, capsys):
    recorded = json.loads((bundle / "manifest.json").read_text())["files"]["results.csv"]
    edit_a_number(bundle)
    code, _, err = cli(capsys, "report", bundle, "--no-pdf", "--allow-edited-data", "-q")
    assert code == 0, err
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["files"]["results.csv"] == recorded  # the run's digest, not the edited file's
    (edit,) = manifest["edited_data"]
    assert edit["file"] == "results.csv" and edit["recorded_sha256"] == recorded and edit["sha256"] != recorded
    assert manifest["rerenders"][-1]["edited_data"] == ["results.csv"]
    html = (bundle / "report.html").read_text()
    assert "results.csv was edited after the run" in html.split('id="run-warnings"', 1)[1][:3000]
    code, out, _ = cli(capsys, "verify", bundle)
    assert code == 3 and "files match" not in out
    assert "results.csv: modified" in out and "--allow-edited-data" in out
    code, out, _ = cli(capsys, "verify", bundle, "--json")
    document = json.loads(out)
    assert code == 3 and not document["ok"] and not document["integrity"]["ok"]
    assert any(p.startswith("results.csv: modified") for p in document["integrity"]["problems"])
    # the recorded edit does not need the flag again; a new edit does
    assert cli(capsys, "report", bundle, "--no-pdf", "-q")[0] == 0
    (bundle / "results.csv").write_text((bundle / "results.csv").read_text().replace("123.456", "7.5"))
    assert cli(capsys, "report", bundle, "--no-pdf", "-q")[0] == 2


@pytest.mark.slow
def test_edited_rendered_outputs_are_simply_re_rendered(bundle, capsys):
    (bundle / "report.html").write_text("<p>defaced</p>")
    (bundle / "tables.tex").unlink()
    assert cli(capsys, "verify", bundle)[0] == 3  # a file differs from the manifest
    assert cli(capsys, "report", bundle, "--no-pdf", "-q")[0] == 0
    code, out, _ = cli(capsys, "verify", bundle)
    assert code == 0 and "integrity: all" in out and "defaced" not in (bundle / "report.html").read_text()


@pytest.mark.slow
def test_a_data_file_added_after_the_run_is_an_edit(bundle, capsys):
    results = (bundle / "results.csv").read_text().splitlines()
    (bundle / "frequency.csv").unlink(missing_ok=True)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"].pop("frequency.csv", None)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert cli(capsys, "report", bundle, "--no-pdf", "-q")[0] == 0  # no frequency table: intact
    (bundle / "frequency.csv").write_text("model,metric,estimate\n" + results[1].split(",")[0] + ",x,1\n")
    code, _, err = cli(capsys, "report", bundle, "--no-pdf")
    assert code == 2 and "frequency.csv: not in the manifest (added after the run)" in err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_no_pdf_keeps_an_existing_report_pdf(bundle, capsys):
    pdf = (bundle / "report.pdf").read_bytes()  # compiled by the run
    assert pdf.startswith(b"%PDF")
    code, _, err = cli(capsys, "report", bundle, "--no-pdf", "--precision", "4", "-q")
    assert code == 0, err
    assert (bundle / "report.pdf").read_bytes() == pdf
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["rerenders"][-1]["kept_from_an_earlier_rendering"] == ["report.pdf"]
    assert "report.pdf" not in manifest["rerenders"][-1]["rendered"]
    code, out, _ = cli(capsys, "verify", bundle)
    assert code == 0 and "integrity: all" in out


@pytest.mark.slow
def test_a_bundle_without_digests_is_refused_and_stays_unverified(bundle, capsys):
    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["files"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli(capsys, "report", bundle, "--no-pdf")
    assert code == 2 and "the manifest records no file digests" in err
    assert cli(capsys, "report", bundle, "--no-pdf", "--allow-edited-data", "-q")[0] == 0
    assert "no file digests" in (bundle / "report.html").read_text()
    # the re-render wrote digests, but they are not the run's: verify never says all files match
    code, out, _ = cli(capsys, "verify", bundle)
    assert code == 3 and "the manifest records no file digests" in out and "files match" not in out
