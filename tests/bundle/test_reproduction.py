"""`anistat diff ORIGINAL RERUN`: same protocol, same numbers (issue #22).

* a local saved checkpoint series measured with 1 and with 2 threads reproduces (real runs,
  real CLI); the per-sequence energies are compared too;
* the comparison catches what it must: a number moved beyond the tolerance, a missing row, a
  changed count, status or claim verdict, a NaN for a number, another protocol — and lets pass
  what the README says may differ (rounding-level moves, Monte-Carlo p-values within two of
  their standard errors);
* it reads numbers, never the bytes of files holding times or paths.

The committed quickstart itself is re-run and compared by `.ci/run` (about 2–4 minutes with one
thread on 2 cores, too long for the suite).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from test_bad_input_helpers import build_tiny_gpt2, corpus_text, no_figures

from anistat.cli import DEFAULT_RELATIVE, main
from anistat.comparison import DEFAULT_TOLERANCE, Tolerance, compare

STUDY = """\
name: local-threads
seed: 3
data: {source: text, paths: [corpus.txt], seq_len: 24, n_fit_sequences: 24, n_test_sequences: 24, vocab_size: 300,
       batch_size: 8}
models:
  - {name: mine, source: local, checkpoints: [ckpt/a, ckpt/b], steps: [100, 200]}
proxies: {methods: [pca], ranks: [2, 4], fit_window: 0.5, max_fit_tokens: 400}
controls: {kinds: [normal, haar], n: 19}
stats: {n_bootstrap: 200, n_permutations: 199}
report: {compile_pdf: false}
claims:
  - {id: enriched, metric: energy_ratio, where: {rank: 2, control: normal}, compare: ">", threshold: 0.0}
"""


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[Path, Path]:
    """The same local checkpoints (d = 32, 3 blocks) measured with --threads 1 and --threads 2."""
    root = tmp_path_factory.mktemp("local-threads")
    (root / "corpus.txt").write_text(corpus_text(6000))
    build_tiny_gpt2(root / "ckpt" / "a", hidden=32, layers=3)
    build_tiny_gpt2(root / "ckpt" / "b", hidden=32, layers=3)
    protocol = root / "study.yaml"
    protocol.write_text(STUDY)
    with pytest.MonkeyPatch.context() as patch:
        no_figures(patch)
        for threads in ("1", "2"):
            assert main(["run", str(protocol), "--out", str(root / f"t{threads}"), "--threads", threads, "-q"]) == 0
    return root / "t1", root / "t2"


@pytest.mark.slow
def test_a_local_checkpoint_measured_with_1_and_2_threads_reproduces(bundles, capsys):
    one, two = bundles
    assert json.loads((one / "manifest.json").read_text())["machine"]["threads"]["setting"] == 1
    assert json.loads((two / "manifest.json").read_text())["machine"]["threads"]["setting"] == 2
    code, out, err = run_cli(capsys, "diff", one, two)
    assert code == 0 and err == "", out + err
    assert f"{two} reproduces {one}" in out
    check = compare(one, two)
    assert check.ok and check.compared > 1000
    # the per-sequence energy sums are float64 sums of float32 products: the energy metrics stay
    # far inside the tolerance (1e-4 of it; bit-identical on the machines measured)
    results = [pd.read_csv(b / "results.csv") for b in bundles]
    energy = [r[r.metric == "energy_fraction"].estimate.to_numpy() for r in results]
    assert abs(energy[0] - energy[1]).max() <= 1e-4 * DEFAULT_TOLERANCE.relative * abs(energy[0]).max()


@pytest.mark.slow
def test_the_cli_default_is_the_modules(bundles):
    assert DEFAULT_RELATIVE == DEFAULT_TOLERANCE.relative


def _copy(bundle: Path, tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(bundle, copy)
    return copy


def _edit_results(bundle: Path, edit) -> None:
    """Rewrite the bundle's results.csv with `edit(table)` applied (it may return a new table)."""
    table = pd.read_csv(bundle / "results.csv", keep_default_na=False, na_values=[""])
    edited = edit(table)
    table = table if edited is None else edited
    table.to_csv(bundle / "results.csv", index=False, float_format="%.10g", lineterminator="\n")


def _first(table: pd.DataFrame, metric: str, **where) -> int:
    rows = table[(table.metric == metric) & (table.status == "ok")]
    for key, value in where.items():
        rows = rows[rows[key] == value]
    return rows.index[0]


@pytest.mark.slow
@pytest.mark.parametrize("factor, reproduces", [(1.02, False), (1.004, True)])
def test_an_estimate_moved_beyond_the_tolerance_is_named(bundles, tmp_path, capsys, factor, reproduces):
    one, _ = bundles
    edited = _copy(one, tmp_path, "edited")
    _edit_results(
        edited,
        lambda t: t.__setitem__(
            "estimate", t["estimate"].where(t.index != _first(t, "energy_ratio"), t["estimate"] * factor)
        ),
    )
    code, out, _ = run_cli(capsys, "diff", one, edited)
    if reproduces:
        assert code == 0, out
    else:
        assert code == 3 and "does NOT reproduce" in out
        line = next(line for line in out.splitlines() if line.startswith("differs:"))
        assert "metric=energy_ratio" in line and "estimate" in line and "allowed" in line


@pytest.mark.slow
def test_a_number_near_zero_is_read_at_its_metrics_scale(bundles, tmp_path):
    """A ΔIsoScore* of 1e-6 moving to 2e-6 is a rounding-level move when its metric's other
    values are ~0.1 (100 % of itself, 1e-5 of the scale)."""
    one, _ = bundles
    edited = _copy(one, tmp_path, "edited")

    def edit(table):
        index = _first(table, "delta_isoscore_star")
        scale = table.loc[table.metric == "delta_isoscore_star", "estimate"].abs().max()
        table.loc[index, "estimate"] = table.loc[index, "estimate"] + 1e-4 * scale

    _edit_results(edited, edit)
    assert compare(one, edited).ok
    assert not compare(one, edited, Tolerance(relative=1e-5)).ok


@pytest.mark.slow
@pytest.mark.parametrize(
    "column, change",
    [
        ("n_tokens", lambda v: v + 1),
        ("status", lambda v: "failed"),
        ("n_clusters", lambda v: v - 1),
        ("ci_low", lambda v: float("nan")),
        ("p_value", lambda v: min(1.0, v + 0.2)),
    ],
)
def test_counts_statuses_missing_values_and_p_values_are_checked(bundles, tmp_path, column, change):
    one, _ = bundles
    edited = _copy(one, tmp_path, "edited")

    def edit(table):
        index = _first(table, "energy_ratio", control="haar")
        table[column] = table[column].astype(object)
        table.loc[index, column] = change(table.loc[index, column])

    _edit_results(edited, edit)
    check = compare(one, edited)
    assert [d.column for d in check.differences] == [column], check.differences


@pytest.mark.slow
def test_a_monte_carlo_p_value_may_move_by_its_own_error(bundles, tmp_path):
    """Two Monte-Carlo standard errors (+ 2 draws): a p of 0.5 from 9,999 draws may move by 0.01,
    one of 0.0001 (the floor) only by about 4 draws."""
    one, _ = bundles
    table = pd.read_csv(one / "results.csv")
    index = _first(table, "energy_ratio", control="haar")
    draws = int(table.loc[index, "n_controls"])
    for p, move, ok in (
        (0.5, 0.9 * 2 * (0.5 / (draws + 1) ** 0.5 + 1 / (draws + 1)), True),
        (0.5, 0.02, False),
        (1 / (draws + 1), 2 / (draws + 1), True),
        (1 / (draws + 1), 8 / (draws + 1), False),
    ):
        original, edited = _copy(one, tmp_path, f"o{p}{move}"), _copy(one, tmp_path, f"e{p}{move}")
        _edit_results(original, lambda t, p=p: t.__setitem__("p_value", t["p_value"].where(t.index != index, p)))
        _edit_results(
            edited, lambda t, p=p, move=move: t.__setitem__("p_value", t["p_value"].where(t.index != index, p + move))
        )
        assert compare(original, edited).ok is ok, (p, move)


@pytest.mark.slow
def test_rows_claims_and_the_protocol_must_match(bundles, tmp_path):
    one, _ = bundles
    dropped = _copy(one, tmp_path, "dropped")
    _edit_results(dropped, lambda t: t.drop(index=_first(t, "z")))
    assert [d.column for d in compare(one, dropped).differences] == ["row"]
    flipped = _copy(one, tmp_path, "flipped")
    claims = json.loads((flipped / "claims.json").read_text())
    claims[0]["status"] = "fail" if claims[0]["status"] == "pass" else "pass"
    (flipped / "claims.json").write_text(json.dumps(claims))
    assert [(d.table, d.column) for d in compare(one, flipped).differences] == [("claims.json", "status")]
    other = _copy(one, tmp_path, "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["protocol_sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    assert [d.column for d in compare(one, other).differences] == ["protocol_sha256"]


@pytest.mark.slow
def test_files_with_times_and_paths_are_not_compared(bundles, tmp_path):
    """Timestamps, the command line, report.html: a rerun differs there by design."""
    one, _ = bundles
    rerun = _copy(one, tmp_path, "rerun")
    manifest = json.loads((rerun / "manifest.json").read_text())
    manifest.update(started_at="2099-01-01T00:00:00+00:00", seconds=1.0, command="elsewhere")
    (rerun / "manifest.json").write_text(json.dumps(manifest))
    (rerun / "report.html").write_text("<html>rendered elsewhere</html>")
    check = compare(one, rerun)
    assert check.ok and check.identical == check.compared


@pytest.mark.slow
def test_bad_input_is_one_line(bundles, tmp_path, capsys):
    one, _ = bundles
    code, _, err = run_cli(capsys, "diff", one, tmp_path / "missing")
    assert code == 2 and len(err.splitlines()) == 1 and "bundle directory not found" in err
    broken = _copy(one, tmp_path, "broken")
    (broken / "results.csv").write_text('model,metric,estimate\n"unclosed\n')
    code, _, err = run_cli(capsys, "diff", one, broken)
    assert code == 2 and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_text_where_a_number_belongs_is_a_difference_not_a_crash(bundles, tmp_path, capsys):
    one, _ = bundles
    edited = _copy(one, tmp_path, "edited")

    def edit(table):
        table["estimate"] = table["estimate"].astype(object)
        table.loc[_first(table, "energy_ratio"), "estimate"] = "abc"

    _edit_results(edited, edit)
    code, out, err = run_cli(capsys, "diff", one, edited)
    assert code == 3 and err == "", err
    differs = [line for line in out.splitlines() if line.startswith("differs:")]
    assert len(differs) == 1 and "metric=energy_ratio: estimate" in differs[0] and differs[0].endswith("vs 'abc'")


def test_monte_carlo_sizes_read_from_the_manifests_protocol():
    """The tolerance of a p-value whose row records no draws uses the protocol's data-test
    resamples, under its current name or the one manifests were written with before."""
    from anistat.comparison import _protocol_settings
    from anistat.errors import AnistatInputError

    assert _protocol_settings({"protocol": {"controls": {"n": 30}, "stats": {"n_test_resamples": 4999}}}) == (30, 4999)
    assert _protocol_settings({"protocol": {"stats": {"n_permutations": 199}}}) == (20, 199)
    assert _protocol_settings({}) == (20, 2000)
    with pytest.raises(AnistatInputError, match="n_test_resamples"):
        _protocol_settings({"protocol": {"stats": {"n_test_resamples": 0}}})
