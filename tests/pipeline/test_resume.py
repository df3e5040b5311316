"""No data lost: a run killed with SIGKILL resumes from its unit cache and ends with a
byte-identical results.csv (on CPU); a finished bundle is only ever replaced atomically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bad_input_helpers import corpus_text

from anistat.cli import main

REPO = Path(__file__).resolve().parents[2]

RESUME_PROTOCOL = """\
name: resume
seed: 3
data: {source: text, paths: ['CORPUS'], seq_len: 24, n_fit_sequences: 10, n_test_sequences: 16, vocab_size: 300,
       batch_size: 8}
models:
  - name: dec
    architecture: gpt2
    hidden_size: 16
    num_layers: 2
    num_heads: 2
    train: {steps: 8, batch_size: 4, warmup_steps: 1, checkpoints: [0, 2, 4, 6, 8]}
  - name: enc
    architecture: bert
    hidden_size: 16
    num_layers: 1
    num_heads: 2
    train: {steps: 4, batch_size: 4, warmup_steps: 1, checkpoints: [0, 4]}
proxies: {methods: [pca], ranks: [2], max_fit_tokens: 200, concept_card_tokens: 2}
controls: {kinds: [normal, haar], n: 8}
stats: {n_bootstrap: 50, n_permutations: 50}
report: {compile_pdf: false}
"""
N_UNITS = 5 * 2 + 2 * 1


def write_protocol(directory: Path) -> Path:
    (directory / "corpus.txt").write_text(corpus_text(4000))
    protocol = directory / "resume.yaml"
    protocol.write_text(RESUME_PROTOCOL.replace("CORPUS", str(directory / "corpus.txt")))
    return protocol


def skip_figures(monkeypatch) -> None:
    """These tests are about data, not pictures: skip the (slow) figure rendering."""
    import anistat.bundle

    original = anistat.bundle.report_options
    monkeypatch.setattr(
        anistat.bundle,
        "report_options",
        lambda protocol, **overrides: original(protocol, **{"figures": False, **overrides}),
    )


def cached_units(directory: Path) -> list[Path]:
    return sorted(directory.glob(".anistat-cache/*/units/*.json"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted run (in-process)."""
    root = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as monkeypatch:
        skip_figures(monkeypatch)
        code = main(["run", str(write_protocol(root)), "--out", str(root / "out"), "--quiet"])
    assert code == 0
    return root / "out"


@pytest.mark.slow
def test_sigkill_then_rerun_is_byte_identical(reference, tmp_path, capsys, monkeypatch):
    protocol = write_protocol(tmp_path)
    # Same arithmetic as this process (conftest pins torch to one thread): float32 reductions may
    # round differently with another thread count, and byte-identity is promised per machine setup.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "ANISTAT_PROGRESS": "0",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "anistat", "run", str(protocol), "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    try:
        # kill -9 as soon as the first checkpoint's units are safely in the cache
        while len(cached_units(tmp_path)) < 2:
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no unit was cached in time"
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    survived = cached_units(tmp_path)
    assert 2 <= len(survived) < N_UNITS, "the kill should land mid-collection"
    assert not (tmp_path / "out").exists()

    skip_figures(monkeypatch)
    code = main(["run", str(protocol), "--out", str(tmp_path / "out")])
    progress = capsys.readouterr().err  # progress goes to stderr
    assert code == 0
    assert "resumed from cache" in progress  # the finished checkpoints were not measured again
    assert (tmp_path / "out" / "results.csv").read_bytes() == (reference / "results.csv").read_bytes()
    assert (tmp_path / "out" / "frequency.csv").read_bytes() == (reference / "frequency.csv").read_bytes()
    assert not (tmp_path / ".anistat-cache").exists(), "the cache is removed after a successful run"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")], "no staging directory left"


@pytest.mark.slow
def test_a_finished_bundle_is_replaced_only_whole(reference, tmp_path, capsys, monkeypatch):
    """A rerun into an existing bundle that is interrupted while writing keeps the old bundle
    intact (the new one is staged beside it and swapped in with one rename)."""
    import shutil

    import anistat.bundle

    shutil.copytree(reference, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    protocol = write_protocol(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(anistat.bundle, "write_results", interrupted)
    code = main(["run", str(protocol), "--out", str(tmp_path / "out"), "--quiet", "--overwrite"])
    assert code == 2 and "interrupted" in capsys.readouterr().err
    after = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    assert after == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".partial", ".old"))]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_leftovers_of_a_killed_writer_are_recovered(tmp_path):
    """SIGKILL while a bundle was being swapped in: the next write removes the dead process's
    staging directory and puts a retired bundle back instead of leaving it hidden."""
    from anistat.bundle import _staging_prefix, staged_bundle

    out = tmp_path / "out"
    dead = _staging_prefix(out).rsplit("-", 1)[0] + f"-{_dead_pid()}."
    partial = tmp_path / f"{dead}abc123.partial"
    partial.mkdir()
    (partial / "results.csv").write_text("half")
    retired = tmp_path / f"{dead}def456.old"
    (retired / "bundle").mkdir(parents=True)
    (retired / "bundle" / "manifest.json").write_text("{}")
    alive = tmp_path / f"{_staging_prefix(out)}zzz.partial"  # ours: a live writer, left alone
    alive.mkdir()
    someone_else = tmp_path / ".out.otherhost-1.abc.partial"
    someone_else.mkdir()

    with staged_bundle(out) as staging:
        assert (out / "manifest.json").read_text() == "{}", "the retired bundle is back in place"
        assert not partial.exists() and not retired.exists()
        (staging / "manifest.json").write_text('{"new": 1}')
    assert (out / "manifest.json").read_text() == '{"new": 1}'
    assert alive.exists() and someone_else.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, someone_else.name, "out"])


def _small_unit(layer: int):
    import numpy as np

    from anistat.collect import UnitArtifact, UnitKey

    rng = np.random.default_rng(layer)
    x = rng.standard_normal((20, 4))
    moments = {"count": 20, "sum": x.sum(0), "outer": x.T @ x}
    return UnitArtifact(
        key=UnitKey("m", "clm", "step0", 0, "early", layer, f"residual.{layer}"),
        dim=4,
        bases=[],
        n_tokens=np.full(5, 4),
        sequence_documents=np.arange(5),
        total_energy=np.ones((5, 1)),
        energy=np.ones((5, 1, 0)),
        delta_isoscore_star=np.zeros(0),
        gradient_moments=dict(moments),
        activation_moments=dict(moments),
        gradient_unit_sum=x.sum(0),
        activation_unit_sum=x.sum(0),
        type_count=np.zeros(3, dtype=np.int64),
        type_rms_distance=np.full(3, np.nan),
    )


def test_the_background_writer_saves_each_unit_as_handed_over_and_raises_a_failed_write(tmp_path, monkeypatch):
    """`UnitWriter`: a unit's file holds it as it was when handed over (the analysis may mark the
    original failed meanwhile); a failed write is raised by `wait`, or by the next hand-over once
    it has failed; leaving the block waits for every write."""
    import errno

    from anistat.collect import UnitArtifact
    from anistat.pipeline import UnitWriter

    first, second = _small_unit(0), _small_unit(1)
    with UnitWriter() as writer:
        writer.save(first, tmp_path)
        first.status, first.note = "failed", "marked after the hand-over"
        writer.wait()
        writer.save(second, tmp_path)
    saved = {path.name: UnitArtifact.load(path) for path in tmp_path.glob("*.json")}
    assert len(saved) == 2 and all(unit.status == "ok" for unit in saved.values())

    def full(self, directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(UnitArtifact, "save", full)
    with UnitWriter() as writer:
        writer.save(first, tmp_path / "full")
        with pytest.raises(OSError, match="No space left"):
            writer.wait()
    with UnitWriter() as writer, pytest.raises(OSError, match="No space left"):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a hand-over after a write has failed raises its error
            writer.save(first, tmp_path / "full")
            time.sleep(0.05)
