"""From one line and from a notebook (issue #39): `anistat run --model` without a protocol file
(its protocol.yaml re-runs to the same numbers), the bundle object's summary, HTML, LaTeX,
Markdown, figures and kept bases, `anistat summary` and `anistat runs` through the CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from _helpers import CHROMIUM, run_chromium
from test_bad_input_helpers import build_tiny_gpt2, corpus_text, no_figures

import anistat
from anistat.cli import main
from anistat.errors import AnistatInputError
from anistat.protocol import load_protocol, protocol_from_options, protocol_yaml

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "reports" / "quickstart"


def cli(capfd, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capfd.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str) -> None:
    assert code == 2, (code, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def anistat_cli(*args, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The `anistat` command in a fresh interpreter (what a user's shell runs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "anistat", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


# ----------------------------------------------------------------------------------------------
# anistat run --model: no YAML
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny real GPT-2 written by save_pretrained (reads the default 64-token sequences)."""
    root = tmp_path_factory.mktemp("models")
    build_tiny_gpt2(root / "ckpt", hidden=16, positions=64)
    return root


@pytest.fixture(scope="module")
def option_bundle(checkpoint) -> Path:
    """`anistat run --model ckpt --out runs/x`, run from the models' folder with a relative path."""
    with pytest.MonkeyPatch.context() as patch:
        no_figures(patch)
        patch.chdir(checkpoint)
        (checkpoint / "corpus.txt").write_text(corpus_text(4000))
        assert main(["run", "--model", "ckpt", "--data", "corpus.txt", "--out", "runs/x", "--ranks", "2,4", "-q"]) == 0
    return checkpoint / "runs" / "x"


def test_run_from_options_writes_its_protocol_into_the_bundle(option_bundle, checkpoint):
    manifest = json.loads((option_bundle / "manifest.json").read_text())
    assert "protocol.yaml" in manifest["files"]  # recorded: anistat wrote it, verify checks it
    written = load_protocol(option_bundle / "protocol.yaml")
    assert written.sha256() == manifest["protocol_sha256"]
    assert written.normalised() == manifest["protocol"]
    model = written.models[0]
    assert (model.name, model.source, model.path) == ("ckpt", "local", str(checkpoint / "ckpt"))
    assert written.data.source == "text" and written.data.paths == [str(checkpoint / "corpus.txt")]
    assert written.proxies.ranks == [2, 4] and written.name == "x"
    assert anistat.load(option_bundle).integrity == ()


def test_the_bundles_protocol_yaml_reruns_to_the_same_numbers(option_bundle, tmp_path, capfd, monkeypatch):
    """`anistat run runs/x/protocol.yaml --out runs/y` from another folder, checked by `anistat diff`."""
    no_figures(monkeypatch)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capfd, "run", option_bundle / "protocol.yaml", "--out", "y", "-q")
    assert code == 0, err
    assert not (tmp_path / "y" / "protocol.yaml").exists()  # a protocol file's run keeps no copy
    code, out, err = cli(capfd, "diff", option_bundle, tmp_path / "y")
    assert code == 0, out + err
    assert "reproduces" in out and re.search(r"(\d+) numbers compared: \1 identical", out), out


def test_validate_takes_the_same_options(checkpoint, capfd, monkeypatch):
    monkeypatch.chdir(checkpoint)
    code, out, err = cli(capfd, "validate", "--model", "ckpt", "--ranks", "4")
    assert code == 0, err
    built = protocol_from_options([str(checkpoint / "ckpt")], ranks=[4])
    assert f"valid protocol 'ckpt' (sha256 {built.sha256()})" in out
    assert "ckpt: local, d=16, 2 layers, 1 checkpoint(s)" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["validate"], "name a protocol file, or a model with --model"),
        (["validate", "protocols/quickstart.yaml", "--model", "ckpt"], "not both"),
        (["validate", "--model", "ckpt", "--ranks", "8,x"], "--ranks 8,x: expected comma-separated integers"),
        (["validate", "--model", "./missing"], "--model ./missing: folder missing not found"),
        (["validate", "--model", "not a hub id!"], "neither an existing folder nor a Hugging Face hub id"),
        (["validate", "--model", "ckpt", "--ranks", "16"], "proxies.ranks"),
        (["run", "--model", "ckpt@"], "name at least one checkpoint or revision"),
    ],
)
def test_bad_options_are_one_line(checkpoint, capfd, monkeypatch, args, needle):
    monkeypatch.chdir(checkpoint)
    code, _, err = cli(capfd, *args)
    assert_one_line_error(code, err)
    assert needle in err, err


def test_protocol_from_options_reads_hub_ids_series_and_datasets(tmp_path):
    (tmp_path / "series" / "step10").mkdir(parents=True)
    (tmp_path / "notes.jsonl").write_text('{"text": "a"}\n')
    built = protocol_from_options(
        ["EleutherAI/pythia-70m@step1000,step2000", f"{tmp_path / 'series'}@step10,step20", "org/pythia-70m"],
        data=str(tmp_path / "notes.jsonl"),
        ranks=[8, 32],
        name="my study!",
    )
    hub, series, second = built.models
    assert (hub.name, hub.source, hub.hub_id, hub.revisions) == (
        "pythia-70m",
        "hub",
        "EleutherAI/pythia-70m",
        ["step1000", "step2000"],
    )
    assert (series.source, series.checkpoints) == (
        "local",
        [str(tmp_path / "series" / s) for s in ("step10", "step20")],
    )
    assert second.name == "pythia-70m-2"  # names stay unique
    assert built.name == "my-study" and built.data.source == "jsonl" and built.proxies.ranks == [8, 32]
    dataset = protocol_from_options(["gpt2"], data="wikitext:wikitext-2-raw-v1")
    assert (dataset.data.source, dataset.data.dataset, dataset.data.dataset_config) == (
        "hf_dataset",
        "wikitext",
        "wikitext-2-raw-v1",
    )
    text = protocol_yaml(built, "anistat run --model …")
    assert text.startswith("# anistat protocol, built by `anistat run --model …`")
    assert "seed" not in yaml.safe_load(text)  # defaults are left to the defaults
    (tmp_path / "p.yaml").write_text(text)
    assert load_protocol(tmp_path / "p.yaml").sha256() == built.sha256()
    with pytest.raises(AnistatInputError, match="--model"):
        protocol_from_options([])


def test_keep_bases_stores_orthonormal_proxy_bases_outside_the_hash(option_bundle, tmp_path, monkeypatch):
    """report.keep_bases added to the bundle's protocol.yaml: same sha256, and bases.safetensors
    holds one d × k orthonormal basis per unit and rank, the one whose energy results.csv reports."""
    no_figures(monkeypatch)
    data = yaml.safe_load((option_bundle / "protocol.yaml").read_text())
    data["report"] = {**data.get("report", {}), "keep_bases": True}
    (tmp_path / "kept.yaml").write_text(yaml.safe_dump(data))
    protocol = load_protocol(tmp_path / "kept.yaml")
    assert protocol.sha256() == load_protocol(option_bundle / "protocol.yaml").sha256()
    assert main(["run", str(tmp_path / "kept.yaml"), "--out", str(tmp_path / "kept"), "-q"]) == 0
    bundle = anistat.load(tmp_path / "kept")
    bases = bundle.bases()
    units = bundle.results[bundle.results["metric"] == "energy_fraction"][["checkpoint", "site"]].drop_duplicates()
    assert len(bases) == len(units) * 2  # ranks 2 and 4, one pca proxy each
    for key, basis in bases.items():
        assert basis.shape == (16, key.rank) and basis.dtype == np.float64
        np.testing.assert_allclose(basis.T @ basis, np.eye(key.rank), atol=1e-6)  # fitted in float32
    assert set(bundle.bases(rank=2)) == {k for k in bases if k.rank == 2}
    with pytest.raises(AnistatInputError, match="keep_bases: true"):
        anistat.load(option_bundle).bases()


# ----------------------------------------------------------------------------------------------
# the bundle object: summary, HTML, LaTeX, Markdown, figures
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quickstart():
    return anistat.load(QUICKSTART)


def expected_headline_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The report's headline cells, selected from results.csv here: energy ratio of pca against
    normal controls at each model's last checkpoint (largest step) of each phase."""
    rows = results[
        (results["metric"] == "energy_ratio") & (results["proxy"] == "pca") & (results["control"] == "normal")
    ]
    last = rows.groupby(["model", "phase"])["step"].transform("max")
    return rows[rows["step"] == last]


def test_summary_has_one_row_per_claim_and_headline_cell_with_results_numbers(quickstart):
    results = pd.read_csv(QUICKSTART / "results.csv")
    claims = json.loads((QUICKSTART / "claims.json").read_text())
    table = anistat.load(QUICKSTART).summary().table
    expected = expected_headline_rows(results)
    assert len(table) == len(claims) + len(expected) and len(expected) == 48
    claim_rows = table[table["kind"] == "claim"]
    assert list(claim_rows["name"]) == [c["id"] for c in claims]
    for (_, row), claim in zip(claim_rows.iterrows(), claims):
        assert row["verdict"] == claim["status"] and row["test"] == claim["decided_by"]
        assert row["p"] == claim["p_value"]["value"]
        if claim["interval"]:
            assert (row["estimate"], row["ci_low"], row["ci_high"]) == tuple(
                claim["interval"][k] for k in ("estimate", "low", "high")
            )
    cells = table[table["kind"] == "cell"]
    keys = ["model", "checkpoint", "site", "rank"]
    merged = cells.astype({"rank": int}).merge(expected, on=keys, suffixes=("", "_csv"), validate="one_to_one")
    assert len(merged) == len(expected)
    for column, source in [("estimate", "estimate"), ("se", "se"), ("ci_low", "ci_low"), ("ci_high", "ci_high")]:
        np.testing.assert_array_equal(merged[column].to_numpy(float), merged[f"{source}_csv"].to_numpy(float))
    np.testing.assert_array_equal(merged["p"].to_numpy(float), merged["p_adjusted"].to_numpy(float))
    assert set(merged["test"]) == set(merged["p_test"]) == {"haar_monte_carlo"}


def test_summary_renders_as_text_markdown_latex(quickstart):
    summary = quickstart.summary(precision=4)
    text = str(summary)
    assert text.splitlines()[1].startswith("anistat summary: quickstart — 48 unit(s), claims 4 passed / 0 failed")
    assert "decoder-doubling" in text and "19.60" in text  # the claim's estimate 19.5966 at 4 digits
    markdown = summary.to_markdown()
    assert sum(line.startswith("| ") for line in markdown.splitlines()) == len(summary.table) + 1
    latex = summary.to_latex()
    assert latex.count(r"\\") == len(summary.table) + 1 and r"\toprule" in latex and "haar\\_monte\\_carlo" in latex
    assert summary.to_dict()["rows"][4]["ci_high"] == "inf"  # an unbounded interval, in strict JSON
    json.dumps(summary.to_dict(), allow_nan=False)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not on PATH")
def test_summary_html_renders_in_headless_chromium(quickstart, tmp_path):
    summary = quickstart.summary()
    page = tmp_path / "summary.html"
    page.write_text(f"<!doctype html><meta charset='utf-8'><body>{summary._repr_html_()}</body>", encoding="utf-8")
    proc = run_chromium(tmp_path / "profile", "--dump-dom", page.resolve().as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = proc.stdout[proc.stdout.index("<tbody>") : proc.stdout.index("</tbody>")]
    assert body.count("<tr>") == len(summary.table)
    assert "decoder-early-enrichment" in body and "tiny-encoder residual.3 step400 k=16" in body


def test_figure_draws_one_site(quickstart):
    from matplotlib.figure import Figure

    figure = quickstart.figure("energy_ratio_trajectory", model="tiny-decoder", site="residual.1")
    assert isinstance(figure, Figure) and [ax.get_title() for ax in figure.axes] == ["tiny-decoder · L1"]
    lines = [line for line in figure.axes[0].get_lines() if len(line.get_xdata()) > 2]
    rows = quickstart.results.query(
        "metric == 'energy_ratio' and model == 'tiny-decoder' and site == 'residual.1' and proxy == 'pca'"
    )
    assert len(lines) == rows.groupby(["control", "rank"]).ngroups  # one line per control kind and rank
    with pytest.raises(ValueError, match="unknown figure"):
        quickstart.figure("nope")
    with pytest.raises(ValueError, match="no row"):
        quickstart.figure("forest_effects", site="residual.99")


def test_typed_records(quickstart):
    assert quickstart.record.protocol_sha256 == quickstart.manifest["protocol_sha256"]
    assert [c.id for c in quickstart.claim_outcomes] == [c["id"] for c in quickstart.claims]
    assert len(quickstart.cards) == len(quickstart.concept_cards) and quickstart.cards[0].top_tokens


# ----------------------------------------------------------------------------------------------
# anistat summary, anistat runs (through the command line)
# ----------------------------------------------------------------------------------------------
def test_summary_command_prints_the_table_and_json():
    text = anistat_cli("summary", "reports/quickstart")
    assert text.returncode == 0, text.stderr
    assert "decoder-early-enrichment" in text.stdout and "haar_monte_carlo" in text.stdout
    as_json = anistat_cli("summary", "reports/quickstart", "--json")
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)["rows"]
    assert len(rows) == 52 and rows[0]["name"] == "decoder-early-enrichment" and rows[0]["verdict"] == "pass"
    missing = anistat_cli("summary", "no/such/bundle")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr


def test_runs_lists_bundles_under_a_folder_read_only(tmp_path):
    shutil.copytree(QUICKSTART, tmp_path / "study" / "quickstart")
    deep = tmp_path / "a" / "b" / "c" / "d"  # too-deep is 5 levels below tmp_path, 4 below a
    shutil.copytree(QUICKSTART, deep / "too-deep")
    (tmp_path / "notes").mkdir()
    before = sorted((p.as_posix(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    listed = anistat_cli("runs", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (found,) = json.loads(listed.stdout)
    size = sum(p.stat().st_size for p in (tmp_path / "study" / "quickstart").rglob("*") if p.is_file())
    assert found == {
        "path": os.path.join("study", "quickstart"),
        "name": "quickstart",
        "finished_at": json.loads((QUICKSTART / "manifest.json").read_text())["finished_at"],
        "models": ["tiny-decoder", "tiny-encoder"],
        "units": 48,
        "failed_units": 0,
        "claims_passed": 4,
        "claims_failed": 0,
        "size_bytes": size,
    }
    table = anistat_cli("runs", tmp_path / "a")
    assert table.returncode == 0 and "too-deep" in table.stdout, table.stderr
    assert "quickstart  " in table.stdout and "4/0" in table.stdout and "MiB" in table.stdout
    assert sorted((p.as_posix(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    empty = anistat_cli("runs", tmp_path / "notes")
    assert empty.returncode == 0 and "no bundle under" in empty.stdout
