"""The small items of issue #22, each through the real command line: "did you mean" for misspelt
keys and for case, YAML errors on the line to fix, the "already exists" message naming what the
user typed, the interrupt message saying where finished units are (and only when there are
some), results.parquet never dropped silently, and `calibrate` never calling a goal met that its
simulation cannot resolve."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml
from conftest import MINI_PROTOCOL
from test_bad_input_helpers import no_figures

from anistat.cli import main
from anistat.stats.calibrate import describe_goal, goal_check


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(code: int, err: str) -> str:
    """Exit 2 and exactly one error line, the last of stderr (progress may come before it)."""
    assert code == 2, err
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("anistat: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and errors[0].startswith("anistat: error: "), err
    return lines[-1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------------------------
# did you mean
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "old, new, expected",
    [
        (
            "stats: {n_bootstrap: 100",
            "stats: {n_bootsrap: 100",
            "unknown key 'stats.n_bootsrap'; did you mean 'n_bootstrap'?",
        ),
        ("methods: [pca]", "methods: [PCA]", "did you mean 'pca'?"),
        (
            "kinds: [normal, haar]",
            "kinds: [Normal, haar]",
            "controls.kinds[0]: Input should be 'normal', 'haar', "
            "'pca_span' or 'cov_matched' (got 'Normal'); did you mean 'normal'?",
        ),
        (
            "    hidden_size: 16\n    num_layers: 2",
            "    hiden_size: 16\n    num_layers: 2",
            "unknown key 'models[0].hiden_size'; did you mean 'hidden_size'?",
        ),
        ("train: {steps: 6", "train: {step: 6", "unknown key 'models[0].train.step'; did you mean 'steps'?"),
        ("seed: 7", "Seed: 7", "unknown key 'Seed'; did you mean 'seed'?"),
        ("multiplicity: fdr_bh", "multiplicity: FDR_BH", "did you mean 'fdr_bh'?"),
    ],
)
def test_did_you_mean(capsys, tmp_path, old, new, expected):
    assert old in MINI_PROTOCOL
    code, _, err = run_cli(capsys, "validate", write(tmp_path, MINI_PROTOCOL.replace(old, new, 1)))
    assert expected in one_line(code, err)


def test_no_suggestion_when_nothing_is_close(capsys, tmp_path):
    code, _, err = run_cli(capsys, "validate", write(tmp_path, MINI_PROTOCOL + "zzzzqq: 1\n"))
    line = one_line(code, err)
    assert line.endswith("unknown key 'zzzzqq'") and "did you mean" not in line


def test_did_you_mean_in_a_claims_file(capsys, tmp_path):
    """`verify --claims` validates claims alone: the suggestion comes from the claim's fields."""
    from anistat.errors import AnistatInputError
    from anistat.verify import load_claims

    path = tmp_path / "claims.yaml"
    path.write_text("- {id: a, metric: energy_ratio, wher: {rank: 2}}\n")
    with pytest.raises(AnistatInputError, match=r"unknown key 'wher'; did you mean 'where'\?"):
        load_claims(path)


def test_a_claim_metric_in_the_wrong_case(capsys, tmp_path):
    text = MINI_PROTOCOL + "claims:\n  - {id: c, metric: Energy_Ratio, where: {rank: 2}}\n"
    code, _, err = run_cli(capsys, "validate", write(tmp_path, text))
    assert "metric 'Energy_Ratio' is not produced by this protocol; did you mean 'energy_ratio'?" in one_line(code, err)


# ----------------------------------------------------------------------------------------------
# YAML errors point at the line to fix
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("name: x\nseed 0\nmodels: []\n", 2, "could not find expected ':'"),  # PyYAML says line 3
        ("name: x\nseed: 0\nstats:\n  alpha 0.05\n  n_bootstrap: 10\n", 4, "line 4 has no ':'"),  # PyYAML: 5
        ("name: x\nranks: [1, 2\nseed: 0\n", 2, "while parsing a flow sequence"),  # PyYAML: 3
        ("name: 'x\nseed: 0\n", 1, "while scanning a quoted scalar"),  # PyYAML: 3
        ("name: x\nstatement: a: b\n", 2, "mapping values are not allowed here"),
        ("name: x\nseed: 1\nseed: 2\n", 3, "duplicate key 'seed'"),
        ("name: x\nstats:\n  alpha: 0.05\n n_bootstrap: 10\n", 4, "expected <block end>"),
    ],
)
def test_yaml_errors_name_the_line_to_fix(capsys, tmp_path, text, line, fragment):
    code, _, err = run_cli(capsys, "validate", write(tmp_path, text))
    message = one_line(code, err)
    assert f"YAML error at line {line}," in message and fragment in message, message


def test_the_offending_line_is_quoted(capsys, tmp_path):
    code, _, err = run_cli(capsys, "validate", write(tmp_path, "name: x\nseed 0\nmodels: []\n"))
    assert one_line(code, err).endswith("near 'seed 0'")


# ----------------------------------------------------------------------------------------------
# "already exists" names what the user typed
# ----------------------------------------------------------------------------------------------
def _existing_bundle(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")


def test_already_exists_without_out_names_the_default_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _existing_bundle(tmp_path / "reports" / "mini")
    code, _, err = run_cli(capsys, "run", write(tmp_path, MINI_PROTOCOL))
    assert one_line(code, err) == (
        "anistat: error: reports/mini (the default bundle folder of protocol 'mini'): a bundle already exists there; "
        "pass --overwrite to replace it, or choose another folder with --out DIR"
    )


def test_already_exists_with_out_names_the_option(capsys, tmp_path):
    _existing_bundle(tmp_path / "b")
    code, _, err = run_cli(capsys, "run", write(tmp_path, MINI_PROTOCOL), "--out", tmp_path / "b")
    assert one_line(code, err).startswith(f"anistat: error: --out {tmp_path / 'b'}: a bundle already exists there")


def test_a_foreign_default_folder_is_not_called_out(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports" / "mini").mkdir(parents=True)
    (tmp_path / "reports" / "mini" / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "run", write(tmp_path, MINI_PROTOCOL))
    line = one_line(code, err)
    assert "reports/mini (the default bundle folder of protocol 'mini'): directory exists" in line
    assert "--out reports" not in line


# ----------------------------------------------------------------------------------------------
# the interrupt message
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def _sigint_delivered():
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _interrupt_after_call(monkeypatch, module, name: str, after: int) -> None:
    original = getattr(module, name)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == after:
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(module, name, wrapper)


def test_interrupted_while_training_says_nothing_was_kept(capsys, tmp_path, monkeypatch, _sigint_delivered):
    import anistat.models

    _interrupt_after_call(monkeypatch, anistat.models, "lm_loss", after=2)  # the second training step
    code, _, err = run_cli(capsys, "run", write(tmp_path, MINI_PROTOCOL), "--out", tmp_path / "b")
    line = one_line(code, err)
    assert line == "anistat: error: interrupted before any unit was finished; nothing was kept, a rerun starts over"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


@pytest.mark.slow
def test_interrupted_after_units_finished_says_where_they_are(capsys, tmp_path, monkeypatch, _sigint_delivered):
    from anistat.collect import artifact

    original = artifact.UnitArtifact.save
    calls = {"n": 0}

    def save(self, directory):
        result = original(self, directory)
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(artifact.UnitArtifact, "save", save)
    code, _, err = run_cli(capsys, "run", write(tmp_path, MINI_PROTOCOL), "--out", tmp_path / "b")
    line = one_line(code, err)
    units = next(tmp_path.glob(".anistat-cache/b-*/units"))
    assert line == f"anistat: error: interrupted; 2 finished units are kept in {units}; a rerun resumes from them"
    assert len(list(units.glob("*.json"))) == 2
    monkeypatch.undo()
    no_figures(monkeypatch)
    code, _, err = run_cli(capsys, "run", write(tmp_path, MINI_PROTOCOL), "--out", tmp_path / "b")
    assert code == 0 and "resumed from cache" in err, err


def test_an_interrupt_outside_a_run_says_nothing_about_units(capsys, monkeypatch, _sigint_delivered, tmp_path):
    import anistat.stats

    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(anistat.stats, "run_calibration", interrupted)
    code, _, err = run_cli(capsys, "calibrate", "--out", tmp_path / "c", "--n-simulations", "10")
    assert one_line(code, err) == "anistat: error: interrupted; nothing was written"


# ----------------------------------------------------------------------------------------------
# results.parquet
# ----------------------------------------------------------------------------------------------
WITHOUT_PYARROW = """\
import sys
sys.modules["pyarrow"] = None  # as if not installed: every `import pyarrow` raises ImportError
sys.path.insert(0, {tests!r})
import pytest
from test_bad_input_helpers import no_figures
from anistat.cli import main
with pytest.MonkeyPatch.context() as patch:
    no_figures(patch)
    sys.exit(main({args!r}))
"""


@pytest.mark.slow
def test_without_pyarrow_the_missing_parquet_is_said_and_recorded(tmp_path):
    """In a process where pyarrow cannot be imported (pandas then keeps its own string types): the
    run says, even with -q, that results.parquet was not written and why, and the manifest
    records it; with pyarrow the file is there and nothing is said."""
    import subprocess

    protocol = yaml.safe_load(MINI_PROTOCOL)
    protocol["models"] = protocol["models"][:1]
    path = write(tmp_path, yaml.safe_dump(protocol))
    args = ["run", str(path), "--out", str(tmp_path / "b"), "-q"]
    script = WITHOUT_PYARROW.format(tests=str(Path(__file__).parents[1]), args=args)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    note = "note: results.parquet was not written: pyarrow is not installed (pip install 'anistat[parquet]')"
    assert done.stderr.splitlines() == [note] and done.stdout == ""  # a note goes to stderr, even with -q
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["omitted_files"] == {"results.parquet": "pyarrow is not installed (pip install 'anistat[parquet]')"}
    assert not (tmp_path / "b" / "results.parquet").exists() and "results.parquet" not in manifest["files"]


@pytest.mark.slow
def test_with_pyarrow_nothing_is_omitted(capsys, tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    no_figures(monkeypatch)
    protocol = yaml.safe_load(MINI_PROTOCOL)
    protocol["models"] = protocol["models"][:1]
    code, out, err = run_cli(capsys, "run", write(tmp_path, yaml.safe_dump(protocol)), "--out", tmp_path / "b", "-q")
    assert code == 0 and "note:" not in err and out == "", err
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["omitted_files"] == {} and "results.parquet" in manifest["files"]


# ----------------------------------------------------------------------------------------------
# calibrate: Monte-Carlo error, and no "met" that the simulation cannot resolve
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, n, verdict",
    [
        (0.05, 20, "unresolved"),  # the issue: "met (0.0500 in [0.04, 0.06])" at 20 simulations
        (0.05, 2000, "met"),
        (0.052, 2000, "met"),
        (0.065, 2000, "NOT met"),  # resolvable, outside the band
        (0.30, 20, "NOT met"),  # even 20 simulations exclude the band
        (0.10, 20, "unresolved"),  # 2 of 20: within the Monte-Carlo error of the band
        (float("nan"), 2000, "NOT met"),
    ],
)
def test_goal_verdicts(value, n, verdict):
    check = goal_check(value, (0.04, 0.06), n)
    assert check["verdict"] == verdict and check["passed"] is (verdict == "met")
    assert check["se"] == pytest.approx((0.05 * 0.95 / n) ** 0.5)
    assert check["needed"] == 1825  # 1.96² · 0.05 · 0.95 / 0.01²


def test_goal_lines():
    assert describe_goal("g", goal_check(0.05, (0.04, 0.06), 20)) == (
        "goal g: unresolved (0.0500 ± 0.0955 at 20 simulated studies: this Monte-Carlo error cannot resolve "
        "[0.04, 0.06]; it needs at least 1825)"
    )
    assert describe_goal("g", goal_check(0.05, (0.04, 0.06), 2000)) == (
        "goal g: met (0.0500 ± 0.0096 at 2000 simulated studies, goal [0.04, 0.06])"
    )


@pytest.mark.slow
def test_calibrate_at_20_simulations_calls_nothing_met(capsys, tmp_path):
    # small everywhere (one scenario, 12-document studies, no 200-document coverage studies, 20
    # family studies): what is checked is the wording at too few simulations, not the rates
    code, out, err = run_cli(
        capsys,
        "calibrate",
        "--out",
        tmp_path / "c",
        "--n-simulations",
        "20",
        "--scenario",
        "isotropic",
        "--n-documents",
        "12",
        "--coverage-documents",
        "12",
        "--family-simulations",
        "20",
    )
    assert code == 0, err
    goals = [line for line in out.splitlines() if line.startswith("goal ")]
    assert goals and not [line for line in goals if ": met (" in line], goals
    assert any("unresolved" in line and "it needs at least" in line for line in goals)
    assert " ± " in next(line for line in out.splitlines() if "uninformative proxy" in line)
    checks = json.loads((tmp_path / "c" / "calibration.json").read_text())["checks"]
    assert all(c["verdict"] in ("unresolved", "NOT met") for c in checks.values())
