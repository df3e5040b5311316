"""The preflight (anistat/preflight.py): every mistake class the issue lists is caught by
`anistat validate` AND by `anistat run` before any model is trained or loaded, in one line.

"Before any model is trained" is checked directly: the protocols below put a built-in model that
would train first, and the rejected run must leave no cache (units are cached as soon as a
checkpoint is measured), print no "training" line and write nothing at all.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_bad_input_helpers import build_tiny_gpt2, corpus_text

from anistat._columns import RESULT_KEYS
from anistat.cli import main
from anistat.preflight import preflight, row_plan
from anistat.protocol import load_protocol, parse_protocol

TRAINED_FIRST = (
    "  - {name: first, architecture: gpt2, hidden_size: 16, num_layers: 3, num_heads: 2,\n"
    "     train: {steps: 40, batch_size: 4, checkpoints: [0, 20, 40]}}\n"
)


def protocol_text(models: str, *, ranks: str = "[2]", kinds: str = "[normal, haar]", extra: str = "") -> str:
    return (
        "name: pf\n"
        "data: {source: text, paths: [corpus.txt], seq_len: 16, n_fit_sequences: 8, n_test_sequences: 8, "
        "vocab_size: 300, batch_size: 8}\n"
        "models:\n" + TRAINED_FIRST + models + f"proxies: {{ranks: {ranks}, max_fit_tokens: 200}}\n"
        f"controls: {{kinds: {kinds}, n: 5}}\n"
        "stats: {n_bootstrap: 20, n_permutations: 20}\nreport: {compile_pdf: false}\n" + extra
    )


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A study folder: corpus.txt and a local checkpoint series ckpt/a, ckpt/b (d = 8, 2 blocks)."""
    root = tmp_path_factory.mktemp("study")
    (root / "corpus.txt").write_text(corpus_text())
    build_tiny_gpt2(root / "ckpt" / "a")
    build_tiny_gpt2(root / "ckpt" / "b")
    return root


def write(study: Path, tmp_path: Path, text: str) -> Path:
    """The protocol lives in a fresh folder beside copies of the study's relative paths' targets."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "corpus.txt").write_text((study / "corpus.txt").read_text())
    (folder / "ckpt").symlink_to(study / "ckpt")
    path = folder / "p.yaml"
    path.write_text(text)
    return path


def both_reject(capsys, monkeypatch, tmp_path: Path, protocol: Path, *needles: str) -> None:
    """validate and run: exit 2, one line naming the mistake; run trains nothing, writes nothing."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative paths must not depend on the working directory
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    for command in (["validate", protocol], ["run", protocol, "--out", tmp_path / "reports" / "out"]):
        started = time.perf_counter()
        code = main([str(a) for a in command])
        seconds = time.perf_counter() - started
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("anistat: error: "), (command[0], err)
        for needle in needles:
            assert needle in lines[0], (command[0], needle, lines[0])
        assert "training" not in out and "step 40" not in out, out
        assert seconds < 20, seconds  # the built-in model trains for 40 steps only after the preflight
    after = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert after == before, "a rejected run wrote something (cache, bundle or staging)"


def local_series(paths: str = "[ckpt/a, ckpt/b]") -> str:
    return f"  - {{name: loc, source: local, checkpoints: {paths}}}\n"


def test_relative_checkpoints_resolve_against_the_protocol_file(study, tmp_path, monkeypatch, capsys):
    protocol = write(study, tmp_path, protocol_text(local_series()))
    monkeypatch.chdir(tmp_path)  # not the protocol's folder
    assert main(["validate", str(protocol)]) == 0
    out = capsys.readouterr().out
    assert "loc: local, d=8, 2 layers, 2 checkpoint(s), sites residual.0, residual.1" in out
    # the hash does not depend on where the study folder is
    assert (
        load_protocol(protocol).sha256() == parse_protocol(__import__("yaml").safe_load(protocol.read_text())).sha256()
    )


def test_wrong_checkpoint_directory(study, tmp_path, monkeypatch, capsys):
    protocol = write(study, tmp_path, protocol_text(local_series("[ckpt/a, ckpt/typo]")))
    both_reject(
        capsys,
        monkeypatch,
        tmp_path,
        protocol,
        "models.loc",
        "model directory not found: ckpt/typo",
        str(protocol.parent / "ckpt" / "typo"),
    )


def test_rank_against_the_configs_hidden_size(study, tmp_path, monkeypatch, capsys):
    protocol = write(study, tmp_path, protocol_text(local_series(), ranks="[8]", kinds="[haar]"))
    both_reject(capsys, monkeypatch, tmp_path, protocol, "models.loc", "rank 8 must be smaller than the hidden size 8")


def test_normal_controls_need_2k_at_most_d(study, tmp_path, monkeypatch, capsys):
    protocol = write(study, tmp_path, protocol_text(local_series(), ranks="[5]"))
    both_reject(capsys, monkeypatch, tmp_path, protocol, "models.loc", "controls.kinds 'normal'", "5", "hidden size 8")


def test_site_name_beyond_the_blocks(study, tmp_path, monkeypatch, capsys):
    protocol = write(study, tmp_path, protocol_text("", extra="sites: {names: [residual.7]}\n"))
    both_reject(capsys, monkeypatch, tmp_path, protocol, "sites.names", "residual.7", "models.first", "3 block(s)")


def test_site_name_beyond_a_local_models_blocks(study, tmp_path, monkeypatch, capsys):
    protocol = write(study, tmp_path, protocol_text(local_series(), extra="sites: {names: [residual.1, mlp.2]}\n"))
    both_reject(capsys, monkeypatch, tmp_path, protocol, "models.loc", "mlp.2", "2 blocks")


def test_module_site_that_does_not_exist(study, tmp_path, monkeypatch, capsys):
    protocol = write(
        study,
        tmp_path,
        protocol_text(
            local_series(), extra="sites: {names: ['module:transformer.h.0.mlp.c_proj', 'module:transformer.h.9']}\n"
        ),
    )
    both_reject(capsys, monkeypatch, tmp_path, protocol, "models.first", "no module named 'transformer.h.9'")


@pytest.mark.parametrize(
    "claim, needles",
    [
        (
            "{id: c, metric: energy_ration}",
            [
                "claims[0] 'c'",
                "metric 'energy_ration'",
                "did you mean 'energy_ratio'",
                "valid metrics:",
                "oracle_fraction",
            ],
        ),
        (
            "{id: c, metric: energy_ratio, where: {modle: first}}",
            ["where key 'modle'", "did you mean 'model'", "valid keys:", "checkpoint"],
        ),
        (
            "{id: c, metric: energy_ratio, where: {model: frist}}",
            ["where.model = 'frist'", "did you mean 'first'", "values in this plan: first, loc"],
        ),
        ("{id: c, metric: energy_ratio, where: {rank: 4}}", ["where.rank = 4", "values in this plan: 2"]),
        (
            "{id: c, metric: energy_ratio, where: {checkpoint: [step20, step30]}}",
            ["where.checkpoint = 'step30'", "a, b, step0, step20, step40"],
        ),
        (
            "{id: c, metric: oracle_fraction, where: {control: normal}}",
            ["where.control = 'normal'", "no 'oracle_fraction' row", "none"],
        ),
        ("{id: c, metric: energy_ratio, where: {model: loc, checkpoint: step20}}", ["selects no row", "not together"]),
    ],
)
def test_claim_typos(study, tmp_path, monkeypatch, capsys, claim, needles):
    protocol = write(study, tmp_path, protocol_text(local_series(), extra=f"claims:\n  - {claim}\n"))
    both_reject(capsys, monkeypatch, tmp_path, protocol, *needles)


def test_external_models_are_not_run(study, tmp_path, monkeypatch, capsys):
    protocol = write(study, tmp_path, protocol_text("  - {name: mine, source: external}\n"))
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(protocol)]) == 0  # a TrainingMeter protocol is valid …
    assert "mine: external" in capsys.readouterr().out
    code = main(["run", str(protocol), "--out", str(tmp_path / "out")])  # … but not for `anistat run`
    assert code == 2 and "source 'external' is measured inside a training loop" in capsys.readouterr().err


def test_claims_that_match_are_accepted(study, tmp_path):
    claims = (
        "claims:\n"
        "  - {id: a, metric: energy_ratio, where: {model: first, phase: early, rank: 2.0, control: normal}}\n"
        "  - {id: b, metric: energy_ratio, where: {model: loc, checkpoint: b, bucket: '0'}}\n"
        "  - {id: c, metric: spearman_logfreq_distance, where: {bucket: all, layer: [0, 2]}}\n"
        "  - {id: d, metric: gradient_isoscore, where: {control: none, site: residual.1}}\n"
    )
    checked = preflight(load_protocol(write(study, tmp_path, protocol_text(local_series(), extra=claims))))
    assert [m.name for m in checked.models] == ["first", "loc"]
    assert [label for label, _ in checked.models[1].checkpoints] == ["a", "b"]


@pytest.mark.slow
def test_the_plan_is_exactly_the_rows_a_run_writes(tmp_path, monkeypatch):
    """The planned rows (keys of results.csv and frequency.csv) cover every row of a real run, so
    the claim checks never reject a claim that would have selected something."""
    import pandas as pd
    from conftest import MINI_PROTOCOL
    from test_bad_input_helpers import no_figures

    from anistat.pipeline import run

    no_figures(monkeypatch)
    path = tmp_path / "mini.yaml"
    path.write_text(MINI_PROTOCOL)
    protocol = load_protocol(path)
    result = run(protocol, tmp_path / "out")
    keys = [*RESULT_KEYS, "bucket"]  # a row's identity in results.csv and frequency.csv

    def as_keys(frame: pd.DataFrame) -> set[tuple]:
        frame = frame.assign(**({} if "bucket" in frame else {"bucket": ""}))
        return {
            tuple("" if pd.isna(v) else str(int(v)) if isinstance(v, float) else str(v) for v in row)
            for row in frame[keys].itertuples(index=False)
        }

    actual = as_keys(result.results) | as_keys(pd.read_csv(tmp_path / "out" / "frequency.csv", dtype={"bucket": str}))
    planned = {
        tuple("" if row.get(k) is None else str(row[k]) for k in keys)
        for row in row_plan(protocol, list(preflight(protocol).models)).rows()
    }
    assert actual <= planned  # every row written was planned
    # planned but not written: only per-frequency-bucket rows of a bucket that no measured token
    # fell in (here: one of the encoder's buckets has no masked token), which depends on the data
    assert {row[-1] for row in planned - actual} <= {"0", "1", "2", "3"}
    assert len(planned - actual) < len(planned) // 20


def test_the_column_lists_are_analyzes():
    """preflight keeps its own copy of the column names (importing analyze would import torch
    into `anistat validate`); they must be analyze's."""
    from anistat import analyze
    from anistat import preflight as module

    assert list(module.RESULT_COLUMNS) == list(analyze.RESULT_COLUMNS)
    assert set(analyze.FREQUENCY_COLUMNS) <= set(module.RESULT_COLUMNS) | set(module.FREQUENCY_ONLY_COLUMNS)
    assert set(module.PROXY_METRICS) == set(analyze.ENERGY_METRICS) | {"delta_isoscore_star"}
