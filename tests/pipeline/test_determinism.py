"""Determinism: the same protocol and seed give byte-identical results on CPU (run twice)."""

from __future__ import annotations

import json

import pytest
from test_resume import skip_figures, write_protocol

from anistat.cli import main


@pytest.mark.slow
def test_same_protocol_same_seed_same_bytes(tmp_path, capsys, monkeypatch):
    skip_figures(monkeypatch)
    protocol = write_protocol(tmp_path)
    bundles = []
    for name in ("first", "second"):
        code = main(["run", str(protocol), "--out", str(tmp_path / name), "--quiet"])
        capsys.readouterr()
        assert code == 0
        bundles.append(tmp_path / name)
    first, second = bundles
    for name in ("results.csv", "frequency.csv", "concept_cards.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    manifests = [json.loads((d / "manifest.json").read_text()) for d in bundles]
    assert manifests[0]["protocol_sha256"] == manifests[1]["protocol_sha256"]
    assert manifests[0]["files"]["results.csv"] == manifests[1]["files"]["results.csv"]
    assert manifests[0]["models"]["dec"]["fit_checkpoints"] == manifests[1]["models"]["dec"]["fit_checkpoints"]
