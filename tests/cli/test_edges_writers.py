"""At the edges, second round: a bundle folder that cannot be renamed, one writer per bundle and
cache, failures that name what failed, where the cache lives and how it is cleaned, exit codes
with one meaning each, remote model code only with the caller's consent, results on stdout.

Each reproduction of the issue is a test that fails on the code before the change. Commands run
in-process (``anistat.cli.main``, stderr captured at the file descriptor) or, where two
processes or a SIGKILL are the point, as real processes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bad_input_helpers import build_tiny_gpt2, corpus_text, local_protocol, no_figures
from test_fault_injection import IS_ROOT, cli, snapshot, write_study

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def study_template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study")
    write_study(root)
    return root


@pytest.fixture
def study(study_template, tmp_path) -> Path:
    """A fresh copy of the study: two checkpoints of a tiny GPT-2, a corpus, a claim."""
    shutil.copytree(study_template, tmp_path / "study")
    return tmp_path / "study"


def error_lines(err: str) -> list[str]:
    """The `anistat: error:` lines of stderr (progress and warnings share stderr)."""
    return [line for line in err.splitlines() if line.startswith("anistat: ")]


def assert_one_error(code: int, err: str, expected: int = 2) -> str:
    """Exit `expected`, no traceback, exactly one error line, and it is the last line."""
    assert code == expected, (code, err)
    assert "Traceback" not in err, err
    errors = error_lines(err)
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    return errors[0]


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs mounted at `path` (root only): yields False where it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    if not IS_ROOT:
        yield False
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    try:
        yield mounted.returncode == 0
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(path)], capture_output=True)


# ----------------------------------------------------------------------------------------------
# a bundle folder that cannot be renamed (a mount point)
# ----------------------------------------------------------------------------------------------
def busy_folder(monkeypatch, folder: Path) -> None:
    """Make renaming `folder` itself fail with EBUSY, as for a mount point (files in it still
    rename: they are on the same file system)."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(src) == folder:
            raise OSError(errno.EBUSY, "Device or resource busy", str(src), None, str(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


def assert_intact_bundle(out: Path, capfd) -> None:
    code, stdout, err = cli(capfd, "verify", out)
    assert code in (0, 1) and "integrity: all" in stdout, stdout + err
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no staging left


def test_an_out_folder_that_cannot_be_renamed_is_written_in_place(study, tmp_path, capfd, monkeypatch):
    """The issue's traceback (`OSError: [Errno 16] … -> .out….old/bundle` after the whole run) is
    a bundle written file by file into the folder, with its integrity record; then replaced."""
    no_figures(monkeypatch)
    out = tmp_path / "volume"
    out.mkdir()
    busy_folder(monkeypatch, out)
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", out, "--quiet")
    assert code in (0, 1) and "Traceback" not in err and not error_lines(err), err
    assert (out / "manifest.json").is_file()
    assert_intact_bundle(out, capfd)
    (out / "tables.tex").write_text("stale")  # an old bundle's file the new one replaces
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", out, "--quiet", "--overwrite")
    assert code in (0, 1) and not error_lines(err), err
    assert_intact_bundle(out, capfd)


def test_a_tmpfs_mount_point_as_out(study, tmp_path, capfd, monkeypatch):
    """The same with a real mount point (a tmpfs), where the test may mount one."""
    no_figures(monkeypatch)
    out = tmp_path / "mounted"
    with tmpfs(out, "64m") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (needs root); the EBUSY test above stands in")
        assert os.path.ismount(out)
        for extra in ((), ("--overwrite",)):
            code, _, err = cli(capfd, "run", study / "study.yaml", "--out", out, "--quiet", *extra)
            assert code in (0, 1) and not error_lines(err), err
            assert_intact_bundle(out, capfd)


# ----------------------------------------------------------------------------------------------
# one writer per bundle folder and per cache
# ----------------------------------------------------------------------------------------------
HOLDER = (
    "import sys, time\nfrom pathlib import Path\nfrom anistat.locking import exclusive\n"
    "with exclusive(Path(sys.argv[1]), 'a test'):\n    print('held', flush=True)\n    time.sleep(float(sys.argv[2]))\n"
)


def hold(lock: Path, seconds: float) -> subprocess.Popen:
    """Another process holding the lock file `lock` for `seconds` (returned once it holds it)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def anistat(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "anistat", *map(str, args)], capture_output=True, text=True, env=ENV, timeout=timeout
    )


def test_a_second_writer_is_refused_at_once_naming_the_holder_and_a_killed_one_blocks_nothing(study, tmp_path):
    """Two processes, one --out: the second refuses in one line naming the first (pid, start),
    before any work; once the holder is SIGKILLed the next run goes through."""
    from anistat.locking import bundle_lock_path

    out = tmp_path / "out"
    holder = hold(bundle_lock_path(out), 300)
    try:
        started = time.perf_counter()
        second = anistat("run", study / "study.yaml", "--out", out, "--quiet")
        line = assert_one_error(second.returncode, second.stderr)
        assert f"the bundle folder {out} is in use by another anistat run (pid {holder.pid}" in line
        assert "started 20" in line and "--wait" in line
        assert not out.exists() and time.perf_counter() - started < 60
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    done = anistat("run", study / "study.yaml", "--out", out, "--quiet")
    assert done.returncode in (0, 1), done.stderr
    assert not bundle_lock_path(out).exists() and not list(tmp_path.glob(".anistat-cache"))


def test_the_cache_has_one_writer_too(study, tmp_path):
    """Two bundle folders sharing one cache (the same protocol, --cache-dir, the same bundle
    name): the second run refuses naming the cache and its holder."""
    from anistat.locking import cache_lock_path
    from anistat.pipeline import cache_dir
    from anistat.protocol import load_protocol

    cache = cache_dir(tmp_path / "a" / "out", load_protocol(study / "study.yaml").sha256(), tmp_path / "caches")
    cache.mkdir(parents=True)
    holder = hold(cache_lock_path(cache), 300)
    try:
        second = anistat(
            "run", study / "study.yaml", "--out", tmp_path / "b" / "out", "--cache-dir", tmp_path / "caches"
        )
        line = assert_one_error(second.returncode, second.stderr)
        assert f"the cache {cache} is in use by another anistat run (pid {holder.pid}" in line
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not (tmp_path / "b").exists()  # nothing left by the refused run


def test_wait_waits_for_the_holder(study, tmp_path, capfd, monkeypatch):
    from anistat.locking import bundle_lock_path

    no_figures(monkeypatch)
    out = tmp_path / "out"
    holder = hold(bundle_lock_path(out), 3)
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", out, "--wait")
    holder.wait()
    assert code in (0, 1) and not error_lines(err), err
    assert f"waiting for the bundle folder {out}: in use by pid {holder.pid}" in err


def test_no_lock_survives_a_sigkilled_run(study, tmp_path):
    """A real run killed with SIGKILL while it holds both locks: the next run is not blocked and
    resumes or starts over."""
    out = tmp_path / "out"
    running = subprocess.Popen(
        [sys.executable, "-m", "anistat", "run", str(study / "study.yaml"), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert running.stderr is not None
    for line in running.stderr:  # the cache line comes once both locks are held
        if line.startswith("cache: "):
            break
    running.send_signal(signal.SIGKILL)
    running.wait()
    done = anistat("run", study / "study.yaml", "--out", out, "--quiet")
    assert done.returncode in (0, 1), done.stderr
    assert (out / "manifest.json").is_file()


# ----------------------------------------------------------------------------------------------
# failures name what failed; the cache's place, size and cleaning
# ----------------------------------------------------------------------------------------------
def test_disk_full_while_writing_the_bundle_names_the_bundle(study, tmp_path, capfd, monkeypatch):
    """The issue: ENOSPC in the bundle's writer was reported as "cannot write the cache"."""
    import anistat.bundle

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(anistat.bundle, "write_results", full)
    out = tmp_path / "out"
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", out, "--quiet")
    line = assert_one_error(code, err)
    assert f"cannot write the bundle {out} (No space left on device)" in line and "the disk is full" in line
    assert "the cache (" not in line and "kept in" in line and not out.exists()


def test_disk_full_while_writing_the_cache_names_the_cache(study, tmp_path, capfd, monkeypatch):
    from anistat.collect import UnitArtifact

    def full(self, directory):
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(directory) / "unit.json"))

    monkeypatch.setattr(UnitArtifact, "save", full)
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", tmp_path / "out", "--quiet")
    line = assert_one_error(code, err)
    assert f"cannot write the cache {tmp_path / '.anistat-cache'}/" in line and "unit.json: No space left" in line


def test_a_full_tmpfs_names_the_bundle_file(study, tmp_path, capfd, monkeypatch):
    """A real full disk: the bundle's folder on a 48 kB tmpfs, the cache elsewhere."""
    no_figures(monkeypatch)
    volume = tmp_path / "small"
    with tmpfs(volume, "48k") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (needs root); the patched writer above stands in")
        out = volume / "out"
        code, _, err = cli(capfd, "run", study / "study.yaml", "--out", out, "--cache-dir", tmp_path / "c", "--quiet")
        line = assert_one_error(code, err)
        assert f"cannot write the bundle {out} (" in line and "No space left on device" in line
        assert list(volume.iterdir()) == []  # no staging folder, no lock left


def test_cache_dir_is_said_with_its_size_listed_and_cleaned_never_a_bundle(study, tmp_path, capfd, monkeypatch):
    no_figures(monkeypatch)
    caches, out = tmp_path / "caches", tmp_path / "out"
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", out, "--cache-dir", caches, "--keep-cache")
    assert code in (0, 1) and not error_lines(err), err
    (cache,) = caches.iterdir()
    assert f"cache: {cache} (new)" in err and f"kept the cache {cache} (" in err and " MB" in err
    # a folder named like a cache that holds a bundle, and a cache of an older unit format
    lookalike = caches / "x-0123456789abcdef-a6"
    lookalike.mkdir()
    (lookalike / "manifest.json").write_text("{}")
    old = caches / "y-0123456789abcdef-a1"
    (old / "units").mkdir(parents=True)
    (old / "units" / "u.json").write_text("{}")
    code, listed, _ = cli(capfd, "cache", "list", caches)
    assert code == 0 and re.search(rf"^finished .* {re.escape(str(cache))} ", listed, re.M), listed
    assert re.search(rf"^stale .* {re.escape(str(old))} ", listed, re.M) and "x-0123" not in listed
    before = snapshot(out)
    code, cleaned, _ = cli(capfd, "cache", "clean", caches)
    assert code == 0 and "removed 2 cache(s)" in cleaned
    assert not cache.exists() and not old.exists() and (lookalike / "manifest.json").is_file()
    assert snapshot(out) == before


def test_the_environment_chooses_the_cache_and_a_resumable_one_is_kept(study, tmp_path, capfd, monkeypatch):
    import anistat.pipeline

    caches = tmp_path / "env-caches"
    monkeypatch.setenv("ANISTAT_CACHE_DIR", str(caches))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(anistat.pipeline, "publish_bundle", interrupted)
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", tmp_path / "out", "--quiet")
    line = assert_one_error(code, err)
    assert f"kept in {caches}/" in line and not (tmp_path / ".anistat-cache").exists()
    code, listed, _ = cli(capfd, "cache", "list")
    assert code == 0 and listed.startswith("resumable") and str(tmp_path / "out") in listed
    assert cli(capfd, "cache", "clean")[0] == 0 and len(list(caches.iterdir())) == 1
    code, cleaned, _ = cli(capfd, "cache", "clean", "--all")
    assert code == 0 and "removed resumable cache" in cleaned and not caches.exists()


# ----------------------------------------------------------------------------------------------
# exit codes
# ----------------------------------------------------------------------------------------------
def test_an_internal_error_has_its_own_code_and_its_traceback_in_a_file(study, tmp_path, capfd, monkeypatch):
    import anistat.pipeline

    def bug(*args, **kwargs):
        raise ZeroDivisionError("a bug in the analysis")

    monkeypatch.setattr(anistat.pipeline, "analyze_run", bug)
    monkeypatch.setenv("ANISTAT_CACHE_DIR", str(tmp_path / "caches"))
    code, _, err = cli(capfd, "run", study / "study.yaml", "--out", tmp_path / "out", "--quiet")
    line = assert_one_error(code, err, expected=70)
    assert "internal error (ZeroDivisionError: a bug in the analysis)" in line and "please report it" in line
    log = Path(re.search(r"the traceback is in (\S+\.log)", line).group(1))
    assert log.parent == tmp_path / "caches"
    text = log.read_text()
    assert "Traceback" in text and "ZeroDivisionError: a bug in the analysis" in text and "command: anistat run" in text


def test_the_exit_code_table_of_the_docs_is_the_codes_of_the_code():
    import anistat.errors

    codes = {value for name, value in vars(anistat.errors).items() if name.startswith("EXIT_")}
    table = (ROOT / "docs" / "cli.md").read_text().split("## Exit codes", 1)[1]
    documented = {int(m) for m in re.findall(r"^\| `?(\d+)`? \|", table, re.M)}
    assert documented == codes
    source = (ROOT / "anistat" / "cli.py").read_text()
    assert not re.findall(r"Exit\(\d+\)|return [1-9]\d*\b", source)  # every code by its name


# ----------------------------------------------------------------------------------------------
# remote model code only with the caller's consent
# ----------------------------------------------------------------------------------------------
def remote_code_study(root: Path) -> tuple[Path, Path]:
    """A local checkpoint whose config names a custom module (auto_map) that writes a marker
    file when imported, and a protocol with trust_remote_code: true; (protocol, marker)."""
    folder = build_tiny_gpt2(root / "custom")
    marker = root / "MARKER"
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": "configuration_custom.CustomConfig",
        "AutoModelForCausalLM": "modeling_custom.CustomModel",
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_custom.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "from transformers import GPT2Config\n\n\nclass CustomConfig(GPT2Config):\n    pass\n"
    )
    (folder / "modeling_custom.py").write_text(
        "from transformers import GPT2LMHeadModel\n\nfrom .configuration_custom import CustomConfig\n\n\n"
        "class CustomModel(GPT2LMHeadModel):\n    config_class = CustomConfig\n"
    )
    (root / "corpus.txt").write_text(corpus_text())
    protocol = root / "remote.yaml"
    protocol.write_text(local_protocol("remote", folder, root / "corpus.txt", extra_model=", trust_remote_code: true"))
    return protocol, marker


@pytest.mark.parametrize(
    "command", [["validate"], ["run", "--out", "{root}/out"], ["verify", "--against", "{root}/someone"]]
)
def test_remote_code_is_refused_without_the_callers_flag(tmp_path, capfd, command):
    protocol, marker = remote_code_study(tmp_path)
    args = [command[0], protocol, *(a.replace("{root}", str(tmp_path)) for a in command[1:])]
    code, _, err = cli(capfd, *args)
    line = assert_one_error(code, err)
    assert "models.m: trust_remote_code: true would run the model's own Python code" in line
    assert "--trust-remote-code" in line
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_with_the_flag_validate_names_the_model_that_runs_its_own_code(tmp_path):
    """The consent works (and the marker shows the test above could fail)."""
    protocol, marker = remote_code_study(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "anistat", "validate", str(protocol), "--trust-remote-code"],
        capture_output=True,
        text=True,
        env={**ENV, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert marker.exists(), done.stderr
    assert done.returncode == 0, done.stderr
    assert "m: runs the model's own Python code (trust_remote_code, allowed by --trust-remote-code)" in done.stdout
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "anistat", "run", str(protocol), "--out", str(out), "--trust-remote-code", "-q"],
        capture_output=True,
        text=True,
        env={**ENV, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["models"]["m"]["trust_remote_code_consent"] == "--trust-remote-code"  # the consent, recorded


# ----------------------------------------------------------------------------------------------
# results on stdout, progress on stderr
# ----------------------------------------------------------------------------------------------
def test_results_go_to_stdout_and_progress_to_stderr(study, tmp_path, capfd, monkeypatch):
    no_figures(monkeypatch)
    code, stdout, err = cli(capfd, "run", study / "study.yaml", "--out", tmp_path / "out")
    assert code in (0, 1), err
    assert stdout.startswith("claim m-above-zero: ") and "anistat run" not in stdout and "wrote" not in stdout
    assert "anistat run study" in err and f"wrote {tmp_path / 'out'}/" in err and "claim " not in err
    code, stdout, err = cli(capfd, "verify", tmp_path / "out", "--json", "--quiet")
    assert json.loads(stdout)["integrity"]["ok"] and err == ""


# ----------------------------------------------------------------------------------------------
# documents
# ----------------------------------------------------------------------------------------------
def test_a_text_file_splits_into_documents_by_the_stated_rule(tmp_path):
    from anistat.corpus import load_corpus, split_documents
    from anistat.protocol import DataSpec

    assert split_documents("a\nb\n\n  \n\nc\n", None) == ["a\nb\n\n  \n\nc\n"]
    assert split_documents("a\nb\n\n  \n\nc\n", "blank_line") == ["a\nb", "c\n"]
    assert split_documents("x<|endoftext|>y<|endoftext|>\n", "<|endoftext|>") == ["x", "y"]
    (tmp_path / "c.txt").write_text("one\n\ntwo\n\n\nthree\n")
    spec = DataSpec(source="text", paths=[str(tmp_path / "c.txt")], document_separator="blank_line")
    assert load_corpus(spec).documents == ("one", "two", "three\n")
    with pytest.raises(ValueError, match="only used with source 'text'"):
        DataSpec(source="jsonl", paths=["x.jsonl"], document_separator="blank_line")


def test_the_protocol_hash_is_unchanged_by_the_unset_separator():
    from anistat.protocol import load_protocol

    shipped = json.loads((ROOT / "reports" / "quickstart" / "manifest.json").read_text())
    assert load_protocol(ROOT / "protocols" / "quickstart.yaml").sha256() == shipped["protocol_sha256"]


def test_validate_warns_when_a_text_file_is_one_document(tmp_path, capfd):
    model = build_tiny_gpt2(tmp_path / "ckpt")
    paragraphs = "\n\n".join(" ".join(corpus_text(40, seed).split()) for seed in range(12))
    (tmp_path / "corpus.txt").write_text(paragraphs + "\n")
    (tmp_path / "one.yaml").write_text(local_protocol("one", model, tmp_path / "corpus.txt"))
    code, stdout, err = cli(capfd, "validate", tmp_path / "one.yaml")
    assert code == 0 and "valid protocol" in stdout
    assert "warning: data: the corpus holds 1 document(s) (each text file is one document" in err
    assert "fewer than the 10 the intervals need" in err
    text = (tmp_path / "one.yaml").read_text().replace("seq_len: 16", "document_separator: blank_line, seq_len: 16")
    (tmp_path / "split.yaml").write_text(text)
    code, _, err = cli(capfd, "validate", tmp_path / "split.yaml")
    assert code == 0 and "warning" not in err, err
