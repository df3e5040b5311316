"""`anistat diff` of two runs whose protocols differ only in file paths or cosmetic fields: the
protocol's sha256 differs, the study does not — "same protocol up to paths", naming the fields,
and the verdict rests on the numbers. Real runs of one local checkpoint, real command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_bad_input_helpers import build_tiny_gpt2, corpus_text, local_protocol, no_figures

from anistat.cli import main
from anistat.comparison import compare, protocol_differences


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    """One checkpoint and one corpus measured twice: the second protocol names the corpus by
    another path (a copy in another folder) and the study by another name."""
    root = tmp_path_factory.mktemp("paths")
    model = build_tiny_gpt2(root / "ckpt", hidden=16, layers=2)
    text = corpus_text(2000)
    (root / "corpus.txt").write_text(text)
    (root / "copy").mkdir()
    (root / "copy" / "corpus.txt").write_text(text)
    protocols = [root / "a.yaml", root / "b.yaml"]
    protocols[0].write_text(local_protocol("first", model, root / "corpus.txt", kinds="[normal, haar]"))
    protocols[1].write_text(local_protocol("second", model, root / "copy" / "corpus.txt", kinds="[normal, haar]"))
    with pytest.MonkeyPatch.context() as patch:
        no_figures(patch)
        for protocol in protocols:
            assert main(["run", str(protocol), "--out", str(root / protocol.stem), "--threads", "1", "-q"]) == 0
    return root / "a", root / "b"


@pytest.mark.slow
def test_protocols_that_differ_only_in_paths_reproduce(two_runs, capsys):
    one, two = two_runs
    hashes = [json.loads((b / "manifest.json").read_text())["protocol_sha256"] for b in two_runs]
    assert hashes[0] != hashes[1]  # the case of the issue: the hash alone differs
    code = main(["diff", str(one), str(two)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "same protocol up to paths: only data.paths, name differ" in out
    assert f"{two} reproduces {one}" in out and "beyond it" not in out
    check = compare(one, two)
    assert check.ok and check.compared - check.identical == 1  # the hash: compared, within the rule


@pytest.mark.slow
def test_a_protocol_that_differs_in_what_it_measures_does_not(two_runs, tmp_path, capsys):
    """The same numbers under a protocol with another seed: the hash difference is a difference,
    and the note names the field."""
    one, two = two_runs
    other = Path(shutil.copytree(two, tmp_path / "other"))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["protocol"]["seed"] = 7
    manifest["protocol_sha256"] = "f" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    code = main(["diff", str(one), str(other)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "note: the protocols differ in data.paths, name, seed" in out
    assert "differs: manifest: protocol_sha256" in out and "does NOT reproduce" in out


def test_protocol_differences_name_nested_fields_and_skip_execution_settings():
    a = {"name": "a", "threads": 1, "models": [{"name": "m", "path": "x"}], "data": {"paths": ["c.txt"], "seq_len": 16}}
    b = {"name": "a", "threads": 4, "models": [{"name": "m", "path": "y"}], "data": {"paths": ["d.txt"], "seq_len": 32}}
    assert protocol_differences(a, b) == ("data.paths", "data.seq_len", "models[0].path")
    assert protocol_differences(a, a) == ()
