"""At the edges (issue #28, files and failures): nothing of the user's is ever deleted, and every
failure a user can cause is one line on stderr, exit 2, naming the file and the fix.

* the issue's reproductions, each a test that fails on the code before the fix;
* fault injection: every file of a real checkpoint folder (a tiny transformers model written by
  ``save_pretrained``) and of a real bundle is deleted, truncated, corrupted or made
  unreadable, and ``validate`` / ``run`` / ``report`` / ``verify`` / ``diff`` / ``compare`` must
  exit 0–3 with at most one line on stderr, no traceback, and nothing outside what anistat
  wrote changed or removed;
* the preflight's safetensors check against the safetensors library itself (hypothesis).

Commands run in-process (``anistat.cli.main``) with stderr captured at the file descriptor, so
library log lines count too. The bundle is built once per module.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _helpers import edit_a_number
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_input_helpers import build_tiny_gpt2, corpus_text, local_protocol, no_figures

from anistat.cli import main

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
METER_SETTINGS = dict(
    sites={"kind": ["residual"], "layers": [0]},
    proxies={"ranks": [2], "max_fit_tokens": 80},
    controls={"kinds": ["normal"], "n": 4},
    stats={"n_bootstrap": 20, "n_permutations": 20},
    report={"compile_pdf": False},
)
CLAIM = (
    "claims:\n  - {id: m-above-zero, metric: energy_ratio, where: {model: m, control: normal}, compare: '>', "
    "threshold: 0.0}\n"
)


def cli(capfd, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capfd.readouterr()
    return code, out, err


def assert_one_line(code: int, err: str, allowed=(0, 1, 2, 3, 4)) -> None:
    """An allowed exit code, no traceback, and at most one error line, the last of stderr
    (progress lines, on stderr too, may come before it)."""
    assert code in allowed, (code, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("anistat: ")]
    assert len(errors) <= 1 and (not errors or lines[-1] == errors[0]), err


def snapshot(directory: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple[bytes, int]]:
    """Every file below `directory` (not below `skip`) with its bytes and mode."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if any(path == s or s in path.parents for s in skip):
            continue
        if path.is_symlink() or path.is_file():
            try:
                out[path.relative_to(directory).as_posix()] = (path.read_bytes(), path.lstat().st_mode)
            except OSError:  # an unreadable file: its mode still counts
                out[path.relative_to(directory).as_posix()] = (b"<unreadable>", path.lstat().st_mode)
    return out


# ----------------------------------------------------------------------------------------------
# faults
# ----------------------------------------------------------------------------------------------
def delete(path: Path) -> None:
    path.unlink()


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 24] = bytes(range(0xE8, 0x100))[: len(data[middle : middle + 24])]
    if len(data) < 24:
        data = bytearray(b"\xff\xfe\x00garbage")
    path.write_bytes(bytes(data))


def unreadable(path: Path) -> None:
    path.chmod(0)


FAULTS = {"delete": delete, "truncate": truncate, "corrupt": corrupt, "unreadable": unreadable}


def apply_fault(fault: str, path: Path) -> None:
    if fault == "unreadable" and IS_ROOT:
        pytest.skip("root reads every file whatever its mode (the read-only --out test runs as nobody instead)")
    FAULTS[fault](path)


# ----------------------------------------------------------------------------------------------
# a study: a checkpoint series of two real save_pretrained folders, a corpus, a protocol
# ----------------------------------------------------------------------------------------------
def write_study(root: Path) -> Path:
    """root/ckpt/step10, root/ckpt/step20 (tiny GPT-2s), root/corpus.txt, root/study.yaml."""
    build_tiny_gpt2(root / "ckpt" / "step10")
    shutil.copytree(root / "ckpt" / "step10", root / "ckpt" / "step20")
    (root / "corpus.txt").write_text(corpus_text())
    # relative paths (against the protocol's folder): a copied study reads its own files
    text = local_protocol("study", Path("ckpt/step10"), Path("corpus.txt"), extra=CLAIM)
    text = text.replace("path: 'ckpt/step10'", "checkpoints: ['ckpt/step10', 'ckpt/step20']")
    assert "checkpoints:" in text
    (root / "study.yaml").write_text(text)
    return root / "study.yaml"


@pytest.fixture(scope="module")
def study_template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study")
    write_study(root)
    return root


@pytest.fixture
def study(study_template, tmp_path) -> Path:
    """A fresh copy of the study (the tests damage it)."""
    shutil.copytree(study_template, tmp_path / "study")
    return tmp_path / "study"


@pytest.fixture(scope="module")
def pristine(study_template, tmp_path_factory) -> Path:
    """One real bundle of the study (figures skipped: these tests are about files)."""
    root = tmp_path_factory.mktemp("bundle")
    with pytest.MonkeyPatch.context() as patch:
        no_figures(patch)
        assert main(["run", str(study_template / "study.yaml"), "--out", str(root / "bundle"), "--quiet"]) == 0
    return root / "bundle"


@pytest.fixture
def bundle(pristine, tmp_path) -> Path:
    shutil.copytree(pristine, tmp_path / "bundle")
    return tmp_path / "bundle"


# ----------------------------------------------------------------------------------------------
# the reproductions
# ----------------------------------------------------------------------------------------------
def test_overwrite_refuses_a_bundle_holding_the_users_notes(study, bundle, capfd, monkeypatch):
    """`run P --out b --overwrite` where the user added MY_NOTES.md to b: refused before any
    work, one line naming the file, and b is left exactly as it was."""
    no_figures(monkeypatch)
    (bundle / "MY_NOTES.md").write_text("my notes\n")
    before = snapshot(bundle)
    code, out, err = cli(capfd, "run", study / "study.yaml", "--out", bundle, "--overwrite")
    assert_one_line(code, err, allowed=(2,))
    assert "MY_NOTES.md" in err and "1 file(s) anistat did not write" in err and "move them" in err
    assert "corpus" not in out  # refused before the run started
    assert snapshot(bundle) == before


def test_overwrite_replaces_a_bundle_holding_only_what_anistat_wrote(study, bundle, capfd, monkeypatch):
    no_figures(monkeypatch)
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", bundle, "--overwrite", "--quiet")
    assert code == 0, err


def test_foreign_files_lists_unknown_files_only(bundle):
    from anistat.bundle import foreign_files

    assert foreign_files(bundle) == []
    (bundle / "figures").mkdir(exist_ok=True)
    (bundle / "figures" / "mine.png").write_bytes(b"x")
    (bundle / ".results.csv.abc123.tmp").write_bytes(b"x")  # an interrupted atomic write of anistat's
    (bundle / "notes").mkdir()
    assert foreign_files(bundle) == ["figures/mine.png", "notes/"]


def test_report_refuses_to_replace_a_figures_folder_holding_the_users_picture(bundle, capfd, monkeypatch):
    no_figures(monkeypatch)
    (bundle / "figures").mkdir(exist_ok=True)
    (bundle / "figures" / "mine.png").write_bytes(b"my picture")
    code, _, err = cli(capfd, "report", bundle, "--no-pdf")
    assert_one_line(code, err, allowed=(2,))
    assert "figures/mine.png" in err
    assert (bundle / "figures" / "mine.png").read_bytes() == b"my picture"


def test_compare_and_verify_against_refuse_before_any_work(bundle, study, capfd, tmp_path):
    out = tmp_path / "comparison"
    out.mkdir()
    (out / "manifest.json").write_text('{"anistat_comparison": 1}\n')
    (out / "draft.txt").write_text("mine")
    code, _, err = cli(capfd, "compare", bundle, bundle, "--out", out)
    assert_one_line(code, err, allowed=(2,))
    assert "draft.txt" in err and (out / "draft.txt").read_text() == "mine"
    # verify --against: the comparison folder beside the re-run is checked before the re-run
    rerun = tmp_path / "rerun"
    shutil.copytree(out, tmp_path / "rerun-comparison")
    code, out_text, err = cli(capfd, "verify", study / "study.yaml", "--against", bundle, "--out", rerun)
    assert_one_line(code, err, allowed=(2,))
    assert "draft.txt" in err and not rerun.exists() and "corpus" not in out_text


def test_meter_close_removes_only_the_units_it_saved(tmp_path):
    """TrainingMeter's units folder is named after `out`; a file of the user's there survives."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from anistat.callbacks import TrainingMeter

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=48, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=None, eos_token_id=None)
    )
    out = tmp_path / "meter"
    (tmp_path / "meter.units").mkdir()
    (tmp_path / "meter.units" / "keep.txt").write_text("mine")
    meter = TrainingMeter(model, out=out, fit_steps=[0], measure_steps=[1, 2], verbose=False, **METER_SETTINGS)
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for step in range(3):
        batch = torch.randint(0, 48, (4, 12), generator=generator)
        with meter.step(step):
            model(input_ids=batch, labels=batch).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    with pytest.MonkeyPatch.context() as patch:
        no_figures(patch)
        meter.close()
    assert sorted(p.name for p in (tmp_path / "meter.units").iterdir()) == ["keep.txt"]


def test_truncated_safetensors_is_named_by_validate(study, capfd):
    """`truncate -s 300000 ckpt/step20/model.safetensors` (here: to half its size): validate
    names step20 and the file; before the fix it passed and run ended in a traceback."""
    weights = study / "ckpt" / "step20" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    code, _, err = cli(capfd, "validate", study / "study.yaml")
    assert_one_line(code, err, allowed=(2,))
    assert "step20" in err and "model.safetensors" in err and "truncated" in err


def test_extended_safetensors_is_named_by_validate(study, capfd):
    weights = study / "ckpt" / "step20" / "model.safetensors"
    with open(weights, "ab") as stream:
        stream.write(b"\0" * 100)
    code, _, err = cli(capfd, "validate", study / "study.yaml")
    assert_one_line(code, err, allowed=(2,))
    assert "step20" in err and "extended" in err


def test_checkpoint_without_tokenizer_files_is_named_by_validate(study, capfd):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (study / "ckpt" / "step10" / name).unlink()
    code, _, err = cli(capfd, "validate", study / "study.yaml")
    assert_one_line(code, err, allowed=(2,))
    assert "step10" in err and "tokenizer" in err and "save_pretrained" in err


def test_weights_of_another_model_are_named_by_validate_in_under_a_second(study, tmp_path, capfd):
    """A header-valid safetensors file whose shapes are another model's (d = 16 weights under a
    d = 8 config): validate names the tensor, both shapes and the fix, exit 2, in under 1 s."""
    import time

    other = build_tiny_gpt2(tmp_path / "wider", hidden=16)
    shutil.copy(other / "model.safetensors", study / "ckpt" / "step20" / "model.safetensors")
    cli(capfd, "validate", study / "study.yaml")  # once to warm the imports: the second call is timed
    started = time.perf_counter()
    code, _, err = cli(capfd, "validate", study / "study.yaml")
    seconds = time.perf_counter() - started
    assert_one_line(code, err, allowed=(2,))
    assert "step20" in err and "in model.safetensors has shape [48] but the config (config.json) makes it [24]" in err
    assert "the config and the weights come from different models" in err
    assert seconds < 1.0, seconds


def test_weights_that_fail_at_load_time_name_the_tensor_and_the_kept_units(study, tmp_path, capfd, monkeypatch):
    """The same mismatch found only when `run` loads the weights (the preflight skipped): the
    line names the checkpoint, the tensor and where the finished units are, never transformers'
    "see the above report" (no report is shown) nor "save the checkpoint again" (the wrong fix)."""
    import anistat.pipeline

    no_figures(monkeypatch)
    monkeypatch.setattr(anistat.pipeline, "preflight", lambda protocol: None)
    other = build_tiny_gpt2(tmp_path / "wider", hidden=16)
    shutil.copy(other / "model.safetensors", study / "ckpt" / "step20" / "model.safetensors")
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", tmp_path / "out", "--quiet")
    assert_one_line(code, err, allowed=(2,))
    assert "step20" in err and "tensor 'transformer." in err and "come from different models" in err
    assert "kept in" in err and "a rerun resumes" in err
    assert "above report" not in err and "save the checkpoint again" not in err
    assert not (tmp_path / "out").exists()


def test_compare_of_bundles_with_no_row_in_common_is_one_line(bundle, tmp_path, capfd):
    other = tmp_path / "other"
    shutil.copytree(bundle, other)
    lines = (other / "results.csv").read_text().splitlines()
    header = lines[0].split(",")
    model = header.index("model")
    rows = [line.split(",") for line in lines[1:]]
    for cells in rows:
        cells[model] = "another"
    (other / "results.csv").write_text("\n".join([lines[0], *(",".join(c) for c in rows)]) + "\n")
    code, _, err = cli(capfd, "compare", bundle, other, "--out", tmp_path / "cmp")
    assert_one_line(code, err, allowed=(2,))
    assert "no result row in common" in err and not (tmp_path / "cmp").exists()


@pytest.mark.slow
def test_an_existing_read_only_out_folder_is_found_before_the_run(tmp_path):
    """Run as user nobody (root writes anywhere): an existing --out folder it cannot write is
    refused at once with the hint for its cause, not after the whole run."""
    if not IS_ROOT or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the command as another user")
    from conftest import MINI_PROTOCOL

    shared = Path(tempfile.mkdtemp(prefix="anistat-nobody-"))
    try:
        shared.chmod(0o777)
        (shared / "mini.yaml").write_text(MINI_PROTOCOL)
        (shared / "mini.yaml").chmod(0o644)
        out = shared / "out"
        out.mkdir()
        out.chmod(0o555)  # root's, read-only for nobody; its parent is writable
        env = {
            **os.environ,
            "HOME": str(shared),
            "MPLCONFIGDIR": str(shared / "mpl"),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable]
        probe = subprocess.run(
            [*as_nobody, "-c", "import anistat.cli, torch"], capture_output=True, text=True, env=env, timeout=120
        )
        if probe.returncode != 0:  # e.g. a virtual environment in a folder only root may enter
            pytest.skip(f"user nobody cannot run this Python with anistat: {probe.stderr.strip()[-200:]}")
        done = subprocess.run(
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                sys.executable,
                "-m",
                "anistat",
                "run",
                str(shared / "mini.yaml"),
                "--out",
                str(out),
                "--overwrite",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert f"cannot write in {out}" in done.stderr and "permission denied: make the folder writable" in done.stderr
        assert "training" not in done.stdout + done.stderr  # nothing was trained
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_write_failure_at_the_end_names_its_cause_and_the_kept_units(study, tmp_path, capfd, monkeypatch):
    """The disk turns read-only while the bundle is written: the hint matches the cause and the
    message says where the finished units are."""
    import anistat.finalize

    out = tmp_path / "out"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(out))

    monkeypatch.setattr(anistat.finalize, "publish_bundle", read_only)
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", out, "--quiet")
    assert_one_line(code, err, allowed=(2,))
    assert "read-only: choose another --out" in err
    units = tmp_path / ".anistat-cache"
    kept = list(units.rglob("units/*.json"))
    assert kept and f"{len(kept)} finished units are kept in" in err and "a rerun resumes" in err


def test_an_empty_file_and_few_documents_are_run_warnings(tmp_path, capfd, monkeypatch):
    """Six documents and an empty file among data.paths: both said on the terminal and in the
    manifest's warnings (the report shows those first)."""
    no_figures(monkeypatch)
    model = build_tiny_gpt2(tmp_path / "ckpt")
    words = corpus_text().splitlines()
    paths = []
    for index in range(6):
        path = tmp_path / f"doc{index}.txt"
        path.write_text("\n".join(words[index * 40 : (index + 1) * 40]) + "\n")
        paths.append(path)
    (tmp_path / "empty.txt").write_text("\n  \n")
    text = local_protocol("few", model, paths[0]).replace(
        f"paths: ['{paths[0]}']", "paths: [" + ", ".join(f"'{p}'" for p in [*paths, tmp_path / "empty.txt"]) + "]"
    )
    (tmp_path / "few.yaml").write_text(text)
    code, out, err = cli(capfd, "run", tmp_path / "few.yaml", "--out", tmp_path / "bundle")
    assert_one_line(code, err)
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    empty = [w for w in manifest["warnings"] if "empty.txt is empty and was skipped" in w]
    few = [w for w in manifest["warnings"] if "fewer than 10 resampling units (documents)" in w]
    assert empty and few, manifest["warnings"]
    assert f"warning: {empty[0]}" in err and f"warning: {few[0]}" in err and "warning" not in out
    assert "empty.txt is empty" in (tmp_path / "bundle" / "report.html").read_text()


def test_blank_jsonl_records_are_a_warning(tmp_path):
    from anistat.corpus import load_corpus
    from anistat.protocol import DataSpec

    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a b c"}\n\n{"text": "  "}\n{"text": "d e"}\n')
    corpus = load_corpus(DataSpec(source="jsonl", paths=[str(path)]))
    assert len(corpus.documents) == 2
    assert corpus.warnings == (
        f"data.paths: 1 blank line(s) and 1 record(s) with an empty 'text' in {path} were skipped",
    )


def test_editing_results_csv_and_its_digest_is_caught_by_the_parquet_copy(bundle, capfd):
    """The issue's reproduction: results.csv edited and its sha256 in manifest.json updated;
    verify fails naming results.parquet and the column."""
    from anistat.bundle import sha256_file

    edit_a_number(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["results.csv"] = sha256_file(bundle / "results.csv")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = cli(capfd, "verify", bundle)
    assert code == 3, out + err
    assert "integrity: results.parquet differs from results.csv: column estimate" in out and "123.456" in out


def test_claims_json_edited_with_its_digest_is_caught(bundle, capfd):
    from anistat.bundle import sha256_file

    claims = json.loads((bundle / "claims.json").read_text())
    claims[0]["status"] = "fail" if claims[0]["status"] == "pass" else "pass"
    claims[0]["passed"] = not claims[0]["passed"]
    (bundle / "claims.json").write_text(json.dumps(claims))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["claims.json"] = sha256_file(bundle / "claims.json")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    code, out, _ = cli(capfd, "verify", bundle)
    assert code == 3 and "claims.json: claim 'm-above-zero' recorded as" in out


def test_figure_names_match_the_report():
    from anistat.bundle import FIGURE_NAMES
    from anistat.report.figures import FIGURES

    assert FIGURE_NAMES == tuple(name for name, _, _ in FIGURES)


# ----------------------------------------------------------------------------------------------
# fault injection: the checkpoint folder
# ----------------------------------------------------------------------------------------------
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_checkpoint_fault(study, tmp_path, capfd, monkeypatch, name, fault):
    no_figures(monkeypatch)
    target = study / "ckpt" / "step20" / name
    assert target.is_file(), sorted(p.name for p in target.parent.iterdir())
    apply_fault(fault, target)
    before = snapshot(study)
    code, _, err = cli(capfd, "validate", study / "study.yaml")
    assert_one_line(code, err, allowed=(0, 2))
    if code == 0:  # what validate accepts, run must handle too
        code, _, err = cli(capfd, "run", study / "study.yaml", "--out", tmp_path / "out", "--quiet")
        assert_one_line(code, err)
    elif name == "model.safetensors":
        assert "step20" in err and name in err
    assert snapshot(study, skip=(study / ".anistat-cache",)) == before


# ----------------------------------------------------------------------------------------------
# fault injection: the bundle
# ----------------------------------------------------------------------------------------------
BUNDLE_FILES = (
    "results.csv",
    "results.parquet",
    "frequency.csv",
    "claims.json",
    "concept_cards.json",
    "manifest.json",
    "report.html",
    "tables.tex",
    "report.tex",
)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", BUNDLE_FILES)
def test_bundle_fault(pristine, bundle, tmp_path, capfd, monkeypatch, name, fault):
    no_figures(monkeypatch)
    target = bundle / name
    assert target.is_file(), sorted(p.name for p in bundle.iterdir())
    apply_fault(fault, target)
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's")
    damaged = snapshot(bundle)
    for args in (
        ("verify", bundle),
        ("diff", pristine, bundle),
        ("compare", pristine, bundle, "--out", tmp_path / "cmp"),
    ):
        code, _, err = cli(capfd, *args)
        assert_one_line(code, err)
        assert snapshot(bundle) == damaged, args  # read-only commands change nothing
    code, _, err = cli(capfd, "report", bundle, "--no-pdf")
    assert_one_line(code, err)
    if code != 0:
        assert snapshot(bundle) == damaged  # refused: nothing written
    else:  # only rendered outputs and the manifest's record of the rendering changed
        from anistat.bundle import is_rendered

        now = snapshot(bundle)
        for key, value in damaged.items():
            if not is_rendered(key) and key != "manifest.json":
                assert now.get(key) == value, key
    assert outside.read_text() == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) in (["bundle", "outside.txt"], ["bundle", "cmp", "outside.txt"])


#: A function each command calls, where an injected bug stands for any bug of that command.
INTERNAL_ERRORS = [
    (["validate", "{study}/study.yaml"], "anistat.preflight", "preflight"),
    (["run", "{study}/study.yaml", "--out", "{tmp}/out"], "anistat.pipeline", "analyze_run"),
    (["report", "{bundle}", "--no-pdf"], "anistat.rerender", "rerender"),
    (["verify", "{bundle}"], "anistat.verify", "verify_bundle"),
    (["diff", "{pristine}", "{bundle}"], "anistat.comparison", "compare"),
    (["compare", "{pristine}", "{bundle}", "--out", "{tmp}/cmp"], "anistat.replicate", "compare_bundles"),
    (["cache", "list", "{tmp}"], "anistat.caches", "list_caches"),
]


@pytest.mark.parametrize("command, module, name", INTERNAL_ERRORS, ids=[c[0][0] for c in INTERNAL_ERRORS])
def test_an_internal_error_exits_70_with_its_traceback_in_a_file(
    study, pristine, bundle, tmp_path, capfd, monkeypatch, command, module, name
):
    """A bug anywhere: exit 70 (never 1, a failed claim), one line naming the log file that holds
    the traceback, and nothing of the user's — study, bundle — changed."""
    import importlib

    no_figures(monkeypatch)

    def bug(*args, **kwargs):
        raise RuntimeError("an injected bug")

    monkeypatch.setattr(importlib.import_module(module), name, bug)
    monkeypatch.setenv("ANISTAT_CACHE_DIR", str(tmp_path / "logs"))
    places = {"study": study, "bundle": bundle, "pristine": pristine, "tmp": tmp_path}
    before = (snapshot(study), snapshot(bundle))
    code, _, err = cli(capfd, *(part.format(**places) for part in command))
    assert code == 70 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("anistat: internal error (RuntimeError: an injected bug)"), err
    assert [line for line in lines if line.startswith("anistat: ")] == [lines[-1]]
    (log,) = (tmp_path / "logs").glob("anistat-error-*.log")
    assert f"the traceback is in {log}" in lines[-1] and "RuntimeError: an injected bug" in log.read_text()
    assert (snapshot(study), snapshot(bundle)) == before
    assert not (tmp_path / "out").exists() and not (tmp_path / "cmp").exists()


# ----------------------------------------------------------------------------------------------
# the safetensors header check against the safetensors library
# ----------------------------------------------------------------------------------------------
DTYPES = {"F32": 4, "F16": 2, "I64": 8, "U8": 1, "BF16": 2}


def safetensors_bytes(tensors: list[tuple[str, str, list[int]]], extra: int, header_pad: int) -> bytes:
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        size = DTYPES[dtype]
        for v in shape:
            size *= v
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode() + b" " * header_pad
    return struct.pack("<Q", len(text)) + text + b"\0" * max(0, offset + extra)


tensor_lists = st.lists(
    st.tuples(
        st.text("abcdefgh", min_size=1, max_size=4),
        st.sampled_from(sorted(DTYPES)),
        st.lists(st.integers(0, 5), max_size=3),
    ),
    max_size=4,
    unique_by=lambda t: t[0],
)


def library_accepts(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():
                handle.get_tensor(key)
    except Exception:  # noqa: BLE001 - any refusal of the library
        return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tensors=tensor_lists,
    extra=st.integers(-6, 6),
    header_pad=st.integers(0, 3),
    cut=st.one_of(st.none(), st.integers(0, 200)),
)
def test_the_header_check_agrees_with_safetensors(tmp_path, tensors, extra, header_pad, cut):
    """A file the library opens and reads passes the check; a truncated, extended or cut file
    that the library refuses is refused by the check (reading only the header)."""
    from anistat.preflight import safetensors_problem

    data = safetensors_bytes(tensors, extra, header_pad)
    if cut is not None:
        data = data[:cut]
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    assert (safetensors_problem(path) is None) == library_accepts(path), (data[:120], safetensors_problem(path))


def test_a_real_checkpoint_passes_and_each_cut_fails(study):
    from anistat.preflight import safetensors_problem

    weights = study / "ckpt" / "step10" / "model.safetensors"
    assert safetensors_problem(weights) is None and library_accepts(weights)
    size = weights.stat().st_size
    for cut in (0, 7, 8, 100, size // 2, size - 1):
        os.truncate(weights, cut)
        assert safetensors_problem(weights) is not None and not library_accepts(weights), cut


def test_a_truncated_pytorch_bin_is_named_by_validate(study, capfd):
    """A checkpoint saved as pytorch_model.bin (a zip): healthy, it passes; cut short, its zip
    directory is gone and validate names the file."""
    import torch

    folder = study / "ckpt" / "step20"
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    code, _, err = cli(capfd, "validate", study / "study.yaml")
    assert code == 0, err
    truncate(folder / "pytorch_model.bin")
    code, _, err = cli(capfd, "validate", study / "study.yaml")
    assert_one_line(code, err, allowed=(2,))
    assert "step20" in err and "pytorch_model.bin" in err and "zip directory" in err


def test_a_sharded_checkpoint_missing_a_shard_is_named_by_validate(study, capfd):
    folder = study / "ckpt" / "step20"
    index = {"metadata": {}, "weight_map": {"transformer.wte.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    code, _, err = cli(capfd, "validate", study / "study.yaml")
    assert_one_line(code, err, allowed=(2,))
    assert "model-00001-of-00002.safetensors" in err and "step20" in err
