"""Bad input never crashes with a traceback and never leaves anything behind.

Every case runs the real command line in-process (`anistat.cli.main`, which returns the exit
code) and asserts the contract of DESIGN.md §5: exit code 2, exactly one line on stderr that
starts with `anistat: error:` and names what is wrong (and where), no traceback, and nothing
written — no bundle, no staging directory, no cache, no created parent directory.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
from conftest import MINI_PROTOCOL
from test_bad_input_helpers import (
    build_tiny_gpt2,
    corpus_text,
    local_protocol,
    no_figures,
)

from anistat.cli import main

# A valid protocol small enough that run-time failures (data, models) surface in milliseconds.
SMALL = """\
name: small
data: {source: text, paths: ['CORPUS'], seq_len: 16, n_fit_sequences: 4, n_test_sequences: 4, vocab_size: 270}
models: [{name: m, architecture: gpt2, hidden_size: 8, num_layers: 1, num_heads: 2,
          train: {steps: 0, checkpoints: [0]}}]
proxies: {ranks: [2]}
controls: {n: 3}
report: {compile_pdf: false}
"""

MODEL = "models: [{name: m, architecture: gpt2, hidden_size: 16, num_layers: 2, num_heads: 2}]\n"


def alias_bomb() -> str:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def snapshot(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, err: str, *needles: str, exit_code: int = 2) -> str:
    """Exit `exit_code`, no traceback, and exactly one error line, the last of stderr (progress
    lines, on stderr too, may come before it)."""
    assert code == exit_code, (code, err)
    assert "Traceback" not in err
    lines = err.strip("\n").splitlines()
    errors = [line for line in lines if line.startswith("anistat: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    line = lines[-1]
    assert line.startswith("anistat: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def expect_rejected(capsys, tmp_path: Path, text: str | bytes, *needles: str, command: str = "run") -> str:
    """Write `text` as a protocol, run `command` on it: exit 2, one line, nothing written."""
    protocol = tmp_path / "p.yaml"
    if isinstance(text, bytes):
        protocol.write_bytes(text)
    else:
        protocol.write_text(text.replace("CORPUS", str(tmp_path / "corpus.txt")), encoding="utf-8")
    before = snapshot(tmp_path)
    args = ["run", protocol, "--out", tmp_path / "reports" / "out"] if command == "run" else [command, protocol]
    code, _, err = run_cli(capsys, *args)
    line = assert_one_line(code, err, *needles)
    assert snapshot(tmp_path) == before, "a failed run left files behind"
    return line


# ----------------------------------------------------------------------------------------------
# protocol files: YAML, structure, keys, types, ranges, names (all fail at validation, in ms)
# ----------------------------------------------------------------------------------------------
PROTOCOL_CASES = [
    # YAML syntax errors: the message gives line and column
    ("yaml-unclosed-bracket", "name: [unclosed\n" + MODEL, ["YAML error at line"]),
    ("yaml-tab-indent", "name: x\n\tmodels: []\n", ["YAML error at line 2", "'\\t'"]),
    ("yaml-bad-indent", "name: x\n  models: 1\n", ["YAML error at line 2"]),
    ("yaml-unterminated-quote", 'name: "abc\n' + MODEL, ["YAML error"]),
    ("yaml-duplicate-key", "name: a\nname: b\n" + MODEL, ["duplicate key 'name'", "line 2"]),
    (
        "yaml-duplicate-nested-key",
        "name: a\nmodels: [{name: m, architecture: gpt2, name: n}]\n",
        ["duplicate key 'name'"],
    ),
    ("yaml-two-documents", "name: a\n---\nname: b\n", ["YAML error", "another document"]),
    ("yaml-python-tag", "name: !!python/object/apply:os.system ['echo pwned']\n" + MODEL, ["YAML error"]),
    ("yaml-unhashable-key", "? [a, b]\n: x\n", ["YAML error", "unhashable"]),
    ("yaml-int-tag-not-int", "name: x\nseed: !!int abc\n" + MODEL, ["YAML error at line 2", "int value"]),
    ("yaml-empty-int-tag", "name: x\nseed: !!int\n" + MODEL, ["YAML error"]),
    ("yaml-impossible-date", "name: 2020-13-45\n" + MODEL, ["YAML error at line 1", "timestamp"]),
    ("yaml-map-tag-on-list", "name: x\ndata: !!map [1]\n" + MODEL, ["YAML error at line 2", "expected a mapping"]),
    ("yaml-deep-nesting", "a: " + "[" * 5000 + "]" * 5000 + "\n", ["nested too deeply"]),
    ("yaml-alias-bomb", alias_bomb(), ["aliases", "not allowed"]),
    ("yaml-simple-alias", "name: &n x\ndescription: *n\n" + MODEL, ["aliases"]),
    # documents that are not a mapping
    ("not-mapping-list", "- a\n- b\n", ["must be a YAML mapping, got list"]),
    ("not-mapping-scalar", "hello\n", ["must be a YAML mapping, got str"]),
    ("not-mapping-empty", "", ["got empty"]),
    ("not-mapping-comment-only", "# nothing here\n", ["got empty"]),
    ("not-mapping-null", "~\n", ["got empty"]),
    ("not-mapping-binary", "!!binary aGVsbG8=\n", ["got bytes"]),
    # unknown keys, with their full path
    ("unknown-top-key", "name: x\nsead: 1\n" + MODEL, ["unknown key 'sead'"]),
    (
        "unknown-nested-key",
        "name: x\nmodels: [{name: m, architecture: gpt2, train: {stepz: 3}}]\n",
        ["unknown key 'models[0].train.stepz'"],
    ),
    ("unknown-data-key", "name: x\ndata: {sequence_length: 8}\n" + MODEL, ["unknown key 'data.sequence_length'"]),
    ("unknown-controls-key", "name: x\ncontrols: {number: 3}\n" + MODEL, ["unknown key 'controls.number'"]),
    ("missing-models", "name: x\n", ["models: required field is missing"]),
    ("missing-name", MODEL, ["name: required field is missing"]),
    # wrong types (strict: no silent coercion)
    ("type-seed-word", "name: x\nseed: abc\n" + MODEL, ["seed:", "'abc'"]),
    ("type-seed-bool", "name: x\nseed: true\n" + MODEL, ["seed:", "True"]),
    ("type-seed-quoted-number", "name: x\nseed: '5'\n" + MODEL, ["seed:", "'5'"]),
    ("type-seed-fraction", "name: x\nseed: 1.5\n" + MODEL, ["seed:", "1.5"]),
    ("type-models-mapping", "name: x\nmodels: {name: m}\n", ["models:"]),
    ("type-data-string", "name: x\ndata: lots\n" + MODEL, ["data:", "'lots'"]),
    ("type-ranks-string", "name: x\nproxies: {ranks: '4'}\n" + MODEL, ["proxies.ranks"]),
    ("type-alpha-word", "name: x\nstats: {alpha: high}\n" + MODEL, ["stats.alpha", "'high'"]),
    ("type-compile-pdf-word", "name: x\nreport: {compile_pdf: maybe}\n" + MODEL, ["report.compile_pdf"]),
    ("type-name-number", "name: 123\n" + MODEL, ["name:", "123"]),
    ("type-name-date", "name: 2020-01-01\n" + MODEL, ["name:", "datetime.date"]),
    ("type-version-2", "anistat_protocol: 2\nname: x\n" + MODEL, ["anistat_protocol"]),
    ("type-version-bool", "anistat_protocol: true\nname: x\n" + MODEL, ["anistat_protocol"]),
    ("type-key-not-string", "1: x\nname: a\n" + MODEL, ["Keys should be strings"]),
    # negative or zero sizes
    (
        "size-hidden-negative",
        "name: x\nmodels: [{name: m, architecture: gpt2, hidden_size: -3}]\n",
        ["models[0].hidden_size", "-3"],
    ),
    (
        "size-hidden-zero",
        "name: x\nmodels: [{name: m, architecture: gpt2, hidden_size: 0}]\n",
        ["models[0].hidden_size", "0"],
    ),
    ("size-layers-zero", "name: x\nmodels: [{name: m, architecture: gpt2, num_layers: 0}]\n", ["models[0].num_layers"]),
    ("size-controls-zero", "name: x\ncontrols: {n: 0}\n" + MODEL, ["controls.n"]),
    ("size-seq-len-zero", "name: x\ndata: {seq_len: 0}\n" + MODEL, ["data.seq_len"]),
    ("size-test-sequences-negative", "name: x\ndata: {n_test_sequences: -1}\n" + MODEL, ["data.n_test_sequences"]),
    ("size-rank-zero", "name: x\nproxies: {ranks: [0]}\n" + MODEL, ["proxies.ranks[0]"]),
    (
        "size-steps-negative",
        "name: x\nmodels: [{name: m, architecture: gpt2, train: {steps: -5}}]\n",
        ["models[0].train.steps"],
    ),
    ("size-batch-zero", "name: x\ndata: {batch_size: 0}\n" + MODEL, ["data.batch_size"]),
    ("size-no-models", "name: x\nmodels: []\n", ["models:"]),
    ("size-no-ranks", "name: x\nproxies: {ranks: []}\n" + MODEL, ["proxies.ranks"]),
    # cross-field impossibilities known before any model is loaded
    ("rank-equals-hidden", "name: x\nproxies: {ranks: [16]}\n" + MODEL, ["proxies.ranks", "hidden_size 16"]),
    ("rank-normal-needs-2k", "name: x\nproxies: {ranks: [9]}\n" + MODEL, ["controls.kinds 'normal'", "9"]),
    (
        "pca-span-dim-below-rank",
        "name: x\nproxies: {ranks: [4]}\ncontrols: {kinds: [pca_span], pca_span_dim: 3}\n" + MODEL,
        ["controls.pca_span_dim 3"],
    ),
    (
        "pca-span-dim-above-hidden",
        "name: x\ncontrols: {kinds: [pca_span], pca_span_dim: 40}\n" + MODEL,
        ["controls.pca_span_dim 40", "hidden size 16"],
    ),
    (
        "heads-do-not-divide",
        "name: x\nmodels: [{name: m, architecture: gpt2, hidden_size: 18, num_heads: 4}]\n",
        ["not divisible"],
    ),
    (
        "checkpoint-beyond-steps",
        "name: x\nmodels: [{name: m, architecture: gpt2, train: {steps: 5, checkpoints: [0, 9]}}]\n",
        ["beyond steps=5"],
    ),
    (
        "checkpoints-unordered",
        "name: x\nmodels: [{name: m, architecture: gpt2, train: {steps: 9, checkpoints: [5, 2]}}]\n",
        ["strictly increasing"],
    ),
    ("layer-out-of-range", "name: x\nsites: {layers: [7]}\n" + MODEL, ["sites.layers [7]", "2 layers"]),
    (
        "duplicate-model-names",
        "name: x\nmodels: [{name: m, architecture: gpt2}, {name: m, architecture: bert}]\n",
        ["unique"],
    ),
    ("text-source-without-paths", "name: x\ndata: {source: text}\n" + MODEL, ["data", "paths"]),
    (
        "claim-between-one-number",
        "name: x\n" + MODEL + "claims: [{id: c, metric: energy_ratio, compare: between, threshold: 1}]\n",
        ["claims[0]", "between"],
    ),
    (
        "claim-threshold-nan",
        "name: x\n" + MODEL + "claims: [{id: c, metric: energy_ratio, threshold: .nan}]\n",
        ["claims[0]", "threshold must be finite"],
    ),
    # unknown names of models, sources, sites, proxies, controls, …
    (
        "unknown-architecture",
        "name: x\nmodels: [{name: m, architecture: llama}]\n",
        ["models[0].architecture", "llama"],
    ),
    ("builtin-without-architecture", "name: x\nmodels: [{name: m}]\n", ["architecture"]),
    ("unknown-model-source", "name: x\nmodels: [{name: m, source: s3}]\n", ["models[0].source", "s3"]),
    ("unknown-site-kind", "name: x\nsites: {kind: attention}\n" + MODEL, ["sites.kind", "attention"]),
    ("unknown-proxy-method", "name: x\nproxies: {methods: [pcaa]}\n" + MODEL, ["proxies.methods", "pcaa", "pca"]),
    ("unknown-control-kind", "name: x\ncontrols: {kinds: [gaussian]}\n" + MODEL, ["controls.kinds[0]", "gaussian"]),
    ("unknown-multiplicity", "name: x\nstats: {multiplicity: sidak}\n" + MODEL, ["stats.multiplicity", "sidak"]),
    ("unknown-device", "name: x\ndevice: tpu\n" + MODEL, ["device", "tpu"]),
    ("unknown-data-source", "name: x\ndata: {source: hf, paths: [x]}\n" + MODEL, ["data.source", "hf"]),
    (
        "revision-path-traversal",
        "name: x\nmodels: [{name: m, source: hub, hub_id: gpt2, revisions: ['../../etc']}]\n",
        ["models[0].revisions[0]", "../../etc"],
    ),
    ("hub-id-absolute-path", "name: x\nmodels: [{name: m, source: hub, hub_id: /etc/passwd}]\n", ["models[0].hub_id"]),
    # names that would escape the output directory or inject markup
    ("name-dotdot", "name: ../escape\n" + MODEL, ["name:", "../escape"]),
    ("name-absolute", "name: /etc/passwd\n" + MODEL, ["name:", "/etc/passwd"]),
    ("name-slash", "name: a/b\n" + MODEL, ["name:", "a/b"]),
    ("name-hidden", "name: .hidden\n" + MODEL, ["name:", ".hidden"]),
    ("name-script", "name: <script>alert(1)</script>\n" + MODEL, ["name:"]),
    ("model-name-slash", "name: x\nmodels: [{name: a/../../b, architecture: gpt2}]\n", ["models[0].name"]),
    ("claim-id-markup", "name: x\n" + MODEL + "claims: [{id: '<b>c</b>', metric: energy_ratio}]\n", ["claims[0].id"]),
    # huge integers and non-finite floats
    ("huge-seed", "name: x\nseed: " + "9" * 40 + "\n" + MODEL, ["seed:", "4294967295"]),
    ("huge-int-literal", "name: x\nseed: " + "9" * 5000 + "\n" + MODEL, ["YAML error at line 2", "int value"]),
    ("huge-seq-len", "name: x\ndata: {seq_len: " + "1" * 30 + "}\n" + MODEL, ["data.seq_len"]),
    ("huge-controls", "name: x\ncontrols: {n: 1000000000000}\n" + MODEL, ["controls.n"]),
    (
        "huge-steps",
        "name: x\nmodels: [{name: m, architecture: gpt2, train: {steps: 1" + "0" * 100 + "}}]\n",
        ["models[0].train.steps"],
    ),
    (
        "huge-hidden",
        "name: x\nmodels: [{name: m, architecture: gpt2, hidden_size: 9223372036854775808}]\n",
        ["models[0].hidden_size"],
    ),
    ("nan-alpha", "name: x\nstats: {alpha: .nan}\n" + MODEL, ["stats.alpha", "nan"]),
    (
        "inf-learning-rate",
        "name: x\nmodels: [{name: m, architecture: gpt2, train: {learning_rate: .inf}}]\n",
        ["models[0].train.learning_rate", "inf"],
    ),
    # encoding
    ("not-utf8", b"name: caf\xe9\n" + MODEL.encode(), ["not valid UTF-8", "byte 9"]),
]


@pytest.mark.parametrize("text, needles", [c[1:] for c in PROTOCOL_CASES], ids=[c[0] for c in PROTOCOL_CASES])
def test_bad_protocol(capsys, tmp_path, text, needles):
    line = expect_rejected(capsys, tmp_path, text, *needles)
    assert str(tmp_path / "p.yaml") in line  # says which file


@pytest.mark.parametrize("command", ["validate", "run"])
def test_validate_and_run_agree(capsys, tmp_path, command):
    expect_rejected(capsys, tmp_path, "name: x\nsead: 1\n" + MODEL, "unknown key 'sead'", command=command)


def test_scientific_notation_is_a_number(capsys, tmp_path):
    """PyYAML reads `1e-3` as a string; protocols use YAML 1.2 floats, so strictness costs nothing."""
    protocol = tmp_path / "p.yaml"
    protocol.write_text("name: x\nmodels: [{name: m, architecture: gpt2, train: {learning_rate: 1e-3}}]\n")
    code, out, err = run_cli(capsys, "validate", protocol)
    assert code == 0 and err == "" and "valid protocol" in out


# ----------------------------------------------------------------------------------------------
# protocol file problems
# ----------------------------------------------------------------------------------------------
def test_protocol_file_missing(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", tmp_path / "nope.yaml", "--out", tmp_path / "out")
    assert_one_line(code, err, "nope.yaml", "not found")
    assert list(tmp_path.iterdir()) == []


def test_protocol_is_a_directory(capsys, tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    code, _, err = run_cli(capsys, "validate", tmp_path / "dir.yaml")
    assert_one_line(code, err, "is a directory")


def test_protocol_too_large(capsys, tmp_path):
    text = "name: x\n" + MODEL + "description: '" + "a" * 5_100_000 + "'\n"
    expect_rejected(capsys, tmp_path, text, "larger than 5 MB")


def _deny_reading(monkeypatch, target: Path):
    """Make `target` unreadable: chmod where that binds, a simulated EACCES when running as root."""
    if os.geteuid() != 0:
        target.chmod(0)
        return
    original = Path.read_bytes

    def read_bytes(self):
        if Path(self) == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


def test_protocol_unreadable(capsys, tmp_path, monkeypatch):
    protocol = tmp_path / "p.yaml"
    protocol.write_text(MINI_PROTOCOL)
    _deny_reading(monkeypatch, protocol)
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "out")
    assert_one_line(code, err, "p.yaml", "cannot read", "Permission denied")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


# ----------------------------------------------------------------------------------------------
# data files (fail when the corpus is read, before any model is trained)
# ----------------------------------------------------------------------------------------------
def _small(tmp_path: Path, corpus: str | bytes | None, **replace: str) -> str:
    path = tmp_path / "corpus.txt"
    if isinstance(corpus, bytes):
        path.write_bytes(corpus)
    elif corpus is not None:
        path.write_text(corpus, encoding="utf-8")
    text = SMALL
    for old, new in replace.items():
        text = text.replace(old, new)
    return text


def test_data_file_missing(capsys, tmp_path):
    expect_rejected(capsys, tmp_path, _small(tmp_path, None), "data.paths: file not found", "corpus.txt")


def test_data_glob_matches_nothing(capsys, tmp_path):
    text = _small(tmp_path, None).replace("'CORPUS'", f"'{tmp_path}/texts/*.txt'")
    expect_rejected(capsys, tmp_path, text, "data.paths: no file matches", "*.txt")


def test_data_path_is_directory(capsys, tmp_path):
    (tmp_path / "corpus.txt").mkdir()
    expect_rejected(capsys, tmp_path, _small(tmp_path, None), "data.paths: not a regular file")


def test_data_file_unreadable(capsys, tmp_path, monkeypatch):
    text = _small(tmp_path, corpus_text())
    _deny_reading(monkeypatch, tmp_path / "corpus.txt")
    expect_rejected(capsys, tmp_path, text, "data.paths: cannot read", "corpus.txt")


@pytest.mark.parametrize("corpus", ["", "   \n\n\t\n"], ids=["empty", "whitespace"])
def test_empty_corpus(capsys, tmp_path, corpus):
    expect_rejected(capsys, tmp_path, _small(tmp_path, corpus), "corpus", "is empty")


def test_corpus_shorter_than_one_sequence(capsys, tmp_path):
    expect_rejected(capsys, tmp_path, _small(tmp_path, "hi"), "fewer than one sequence of seq_len=16")


def test_corpus_too_short_for_the_splits(capsys, tmp_path):
    expect_rejected(capsys, tmp_path, _small(tmp_path, corpus_text(15)), "n_test_sequences + n_fit_sequences")


def test_corpus_not_utf8(capsys, tmp_path):
    corpus = corpus_text().encode() + b"\xff\xfe latin-1 caf\xe9\n"
    expect_rejected(capsys, tmp_path, _small(tmp_path, corpus), "not UTF-8", "corpus.txt", "offset")


def test_jsonl_invalid_line(capsys, tmp_path):
    (tmp_path / "corpus.txt").write_text('{"text": "fine"}\n{not json}\n')
    text = SMALL.replace("source: text", "source: jsonl")
    expect_rejected(capsys, tmp_path, text, "corpus.txt:2", "invalid JSON")


def test_jsonl_missing_field(capsys, tmp_path):
    (tmp_path / "corpus.txt").write_text('{"body": "no text field"}\n')
    text = SMALL.replace("source: text", "source: jsonl")
    expect_rejected(capsys, tmp_path, text, "corpus.txt:1", "no string field 'text'")


# ----------------------------------------------------------------------------------------------
# output directory
# ----------------------------------------------------------------------------------------------
def _mini(tmp_path: Path) -> Path:
    protocol = tmp_path / "p.yaml"
    protocol.write_text(MINI_PROTOCOL)
    return protocol


def test_out_parent_is_a_file(capsys, tmp_path):
    protocol = _mini(tmp_path)
    (tmp_path / "file").write_text("mine")
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "file" / "bundle")
    assert_one_line(code, err, "--out", "is not a directory")
    assert (tmp_path / "file").read_text() == "mine"


def test_out_is_a_file(capsys, tmp_path):
    protocol = _mini(tmp_path)
    (tmp_path / "out").write_text("mine")
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "out")
    assert_one_line(code, err, "exists and is not a directory")
    assert (tmp_path / "out").read_text() == "mine"


def test_out_is_someone_elses_directory(capsys, tmp_path):
    protocol = _mini(tmp_path)
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "chapter1.tex").write_text("precious")
    before = snapshot(tmp_path)
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "thesis")
    assert_one_line(code, err, "not an anistat bundle")
    assert snapshot(tmp_path) == before and (tmp_path / "thesis" / "chapter1.tex").read_text() == "precious"


@pytest.mark.parametrize("out", [".", ".."])
def test_out_must_name_a_directory(capsys, tmp_path, monkeypatch, out):
    protocol = _mini(tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    code, _, err = run_cli(capsys, "run", protocol, "--out", out)
    assert_one_line(code, err, "--out")


def test_out_unwritable(capsys, tmp_path, monkeypatch):
    protocol = _mini(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() != 0:
        locked.chmod(0o555)
    else:  # root ignores mode bits: simulate what os.access reports for an ordinary user
        import anistat.bundle

        real_access = os.access
        monkeypatch.setattr(
            anistat.bundle.os, "access", lambda path, mode: False if Path(path) == locked else real_access(path, mode)
        )
    try:
        code, _, err = run_cli(capsys, "run", protocol, "--out", locked / "new" / "bundle")
        assert_one_line(code, err, "--out", "is not writable", str(locked))
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_unknown_device_option(capsys, tmp_path):
    protocol = _mini(tmp_path)
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "out", "--device", "tpu")
    assert_one_line(code, err, "--device", "tpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


def test_unknown_command_and_option(capsys, tmp_path):
    code, _, err = run_cli(capsys, "frobnicate")
    assert_one_line(code, err, "frobnicate")
    code, _, err = run_cli(capsys, "run", tmp_path / "p.yaml", "--no-such-option")
    assert_one_line(code, err, "--no-such-option")


# ----------------------------------------------------------------------------------------------
# other commands given hostile bundles
# ----------------------------------------------------------------------------------------------
def test_report_on_a_non_bundle(capsys, tmp_path):
    code, _, err = run_cli(capsys, "report", tmp_path)
    assert_one_line(code, err, "not an anistat bundle")
    code, _, err = run_cli(capsys, "report", tmp_path / "missing")
    assert_one_line(code, err, "bundle directory not found")


def test_report_on_a_corrupt_bundle(capsys, tmp_path):
    (tmp_path / "manifest.json").write_text("{ not json")
    code, _, err = run_cli(capsys, "report", tmp_path, "--no-pdf")
    assert_one_line(code, err, "manifest.json", "not valid JSON")
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "results.csv").write_bytes(b"\xff\xfe\x00garbage")
    _seal(tmp_path)  # the damage is the run's own (recorded digests): `report` reaches the reader
    code, _, err = run_cli(capsys, "report", tmp_path, "--no-pdf")
    assert_one_line(code, err, "results.csv")


def _seal(bundle: Path) -> None:
    """Record the sha256 of every file in the manifest, as a run does (integrity then passes)."""
    import json

    from anistat.bundle import file_digests

    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"] = file_digests(bundle)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def _fake_bundle(directory: Path) -> Path:
    """The least a bundle needs for `verify`/`report` to get past their first checks."""
    import json

    directory.mkdir()
    manifest = {"protocol": {"name": "x", "models": [{"name": "m", "architecture": "gpt2"}]}, "files": {}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / "results.csv").write_text("model,metric,estimate,status\nm,energy_ratio,1.5,ok\n")
    return directory


@pytest.mark.parametrize(
    "damage, needles",
    [
        ({"manifest.json": "[1, 2]"}, ["manifest.json", "must be a JSON object"]),
        ({"manifest.json": "{" * 100_000}, ["manifest.json", "not valid JSON"]),
        ({"frequency.csv": b"\xff\xfe\x00"}, ["frequency.csv", "cannot be read as CSV"]),
        ({"claims.json": "{bad"}, ["claims.json", "not valid JSON"]),
        ({"claims.json": "[1, 2]"}, ["claims.json", "list of claim records"]),
        ({"results.csv": "just,some\ncolumns,here\n"}, ["results.csv", "missing column"]),
    ],
    ids=["manifest-list", "manifest-deep", "frequency-binary", "claims-json", "claims-shape", "results-columns"],
)
def test_verify_damaged_bundle(capsys, tmp_path, damage, needles):
    bundle = _fake_bundle(tmp_path / "b")
    for name, content in damage.items():
        (bundle / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = run_cli(capsys, "verify", bundle)
    assert_one_line(code, err, *needles)


def test_report_damaged_frequency(capsys, tmp_path):
    bundle = _fake_bundle(tmp_path / "b")
    (bundle / "frequency.csv").write_bytes(b"\xff\xfe\x00")
    _seal(bundle)
    before = snapshot(tmp_path)
    code, _, err = run_cli(capsys, "report", bundle, "--no-pdf")
    assert_one_line(code, err, "frequency.csv")
    assert snapshot(tmp_path) == before


def test_verify_against_a_non_bundle_fails_before_rerunning(capsys, tmp_path, monkeypatch):
    protocol = _mini(tmp_path)
    (tmp_path / "not-a-bundle").mkdir()
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "verify", protocol, "--against", tmp_path / "not-a-bundle")
    assert_one_line(code, err, "not-a-bundle", "not an anistat bundle")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-bundle", "p.yaml"]  # nothing was run


# ----------------------------------------------------------------------------------------------
# problems that show only once a model is loaded (tiny local checkpoints, ~1 s to build)
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    (root / "corpus.txt").write_text(corpus_text())
    return {
        "corpus": root / "corpus.txt",
        "ok": build_tiny_gpt2(root / "ok"),
        "nan_weights": build_tiny_gpt2(root / "nan", corrupt="nan_weights"),
        "inf_logits": build_tiny_gpt2(root / "inf", corrupt="inf_logits"),
    }


# The preflight (anistat/preflight.py) reads each model's config without weights, so `validate`
# rejects all of these, and `run` rejects them before any model is loaded (nothing written).
BOTH = pytest.mark.parametrize("command", ["validate", "run"])


@BOTH
def test_rank_not_below_loaded_hidden_size(capsys, tmp_path, local_models, command):
    text = local_protocol("r", local_models["ok"], local_models["corpus"], ranks="[8]")
    expect_rejected(capsys, tmp_path, text, "models.m", "rank 8", "hidden size 8", command=command)


@BOTH
def test_normal_controls_impossible_for_loaded_model(capsys, tmp_path, local_models, command):
    """Normal controls' 2k ≤ d, checked against the config's d: one line naming the model and fields."""
    text = local_protocol("r", local_models["ok"], local_models["corpus"], ranks="[5]")
    expect_rejected(capsys, tmp_path, text, "models.m", "controls.kinds 'normal'", "proxies.ranks", command=command)


@BOTH
def test_pca_span_impossible_for_loaded_model(capsys, tmp_path, local_models, command):
    text = local_protocol("r", local_models["ok"], local_models["corpus"], kinds="[pca_span]", extra="").replace(
        "controls: {kinds: [pca_span], n: 5}", "controls: {kinds: [pca_span], n: 5, pca_span_dim: 12}"
    )
    expect_rejected(capsys, tmp_path, text, "models.m", "pca_span_dim", "controls.pca_span_dim", command=command)


@BOTH
def test_layer_missing_in_loaded_model(capsys, tmp_path, local_models, command):
    text = local_protocol("r", local_models["ok"], local_models["corpus"], extra="sites: {layers: [5]}\n")
    expect_rejected(capsys, tmp_path, text, "sites.layers", "layer 5", "2 layers", command=command)


@BOTH
def test_local_model_directory_missing(capsys, tmp_path, local_models, command):
    text = local_protocol("r", tmp_path / "nowhere", local_models["corpus"])
    expect_rejected(capsys, tmp_path, text, "models.m", "model directory not found", command=command)


@BOTH
def test_local_model_directory_without_weights(capsys, tmp_path, local_models, command):
    (tmp_path / "empty-model").mkdir()
    text = local_protocol("r", tmp_path / "empty-model", local_models["corpus"])
    expect_rejected(capsys, tmp_path, text, "models.m", "cannot be loaded", command=command)


@BOTH
def test_unknown_hub_model_offline(capsys, tmp_path, local_models, monkeypatch, command):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = local_protocol("r", local_models["ok"], local_models["corpus"]).replace(
        f"source: local, path: '{local_models['ok']}'", "source: hub, hub_id: no-such-org/no-such-model-anistat"
    )
    expect_rejected(capsys, tmp_path, text, "models.m", "no-such-org/no-such-model-anistat", command=command)


@BOTH
def test_unknown_hub_revision_offline(capsys, tmp_path, local_models, monkeypatch, command):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = local_protocol("r", local_models["ok"], local_models["corpus"]).replace(
        f"source: local, path: '{local_models['ok']}'", "source: hub, hub_id: no-such-org/tiny, revisions: [step999999]"
    )
    expect_rejected(capsys, tmp_path, text, "models.m", "revision 'step999999'", command=command)


def test_nan_weights_rejected_in_one_line(capsys, tmp_path, local_models):
    """NaN everywhere: no proxy can even be fitted, so the run stops (exit 2) and writes nothing."""
    text = local_protocol("r", local_models["nan_weights"], local_models["corpus"])
    expect_rejected(capsys, tmp_path, text, "models.m", "non-finite (NaN/Inf) activations")


def test_nan_gradients_fail_the_unit_not_the_run(capsys, tmp_path, local_models):
    """Finite activations but NaN/Inf gradients: detected at the collector; the bundle is written
    (it is the user's data), the units are marked failed with the reason in results.csv, the
    manifest and the report, never averaged in; exit code 3 and one line."""
    import json

    import pandas as pd

    protocol = tmp_path / "p.yaml"
    protocol.write_text(local_protocol("r", local_models["inf_logits"], local_models["corpus"]))
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "out")
    line = assert_one_line(code, err, "2 unit(s) failed", "status=failed", "non-finite gradients", exit_code=4)
    assert "m--inf--residual.0" in line
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert set(results.status) == {"failed"}
    assert results.estimate.isna().all() and results.p_value.isna().all()
    assert results.note.str.contains("non-finite gradients").all()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["failed_units"] == 2
    assert all(u["status"] == "failed" and "non-finite" in u["note"] for u in manifest["units"])
    report = (tmp_path / "out" / "report.html").read_text()
    assert 'id="failed"' in report and "non-finite gradients" in report
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


# ----------------------------------------------------------------------------------------------
# interruptions: SIGINT / SIGTERM during a run (delivered for real, to this process)
# ----------------------------------------------------------------------------------------------
INTERRUPTIBLE = MINI_PROTOCOL.replace("name: mini", "name: intr")


@pytest.fixture(autouse=True)
def _sigint_delivered():
    """A process started in the background by a non-interactive shell (as CI runners may do)
    inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler. These tests
    deliver SIGINT for real, so they restore Python's default handler for their duration."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _interrupt_after(monkeypatch, target: str, signum: int, after: int = 1):
    """Send `signum` to this process right after the `after`-th call of `target` (module:attr)."""
    import importlib

    module_name, attribute = target.rsplit(":", 1)
    owner_name, _, method = attribute.partition(".")
    module = importlib.import_module(module_name)
    owner = getattr(module, owner_name)
    original = getattr(owner, method) if method else owner
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == after:
            os.kill(os.getpid(), signum)
        return result

    if method:
        monkeypatch.setattr(owner, method, wrapper)
    else:
        monkeypatch.setattr(module, owner_name, wrapper)
    return calls


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_collection(capsys, tmp_path, monkeypatch, signum):
    protocol = tmp_path / "p.yaml"
    protocol.write_text(INTERRUPTIBLE)
    handler_before = signal.getsignal(signal.SIGTERM)
    # the first finished unit lands in the cache, then the signal arrives mid-collection
    _interrupt_after(monkeypatch, "anistat.collect.artifact:UnitArtifact.save", signum, after=1)
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "out")
    assert_one_line(code, err, "interrupted", "rerun resumes")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".partial", ".old"))]
    cached = list(tmp_path.glob(".anistat-cache/out-*/units/*.json"))
    assert len(cached) >= 1, "finished units must survive an interruption"
    assert signal.getsignal(signal.SIGTERM) == handler_before  # main() restores what it found


@pytest.mark.slow
def test_sigint_while_writing_the_bundle_then_resume(capsys, tmp_path, monkeypatch):
    """Interrupted while the bundle is being rendered: no bundle, no staging directory; the cache
    is complete, so the rerun measures nothing again and writes the bundle."""
    protocol = tmp_path / "p.yaml"
    protocol.write_text(INTERRUPTIBLE)
    _interrupt_after(monkeypatch, "anistat.bundle:write_results", signal.SIGINT)
    no_figures(monkeypatch)
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "out")
    assert_one_line(code, err, "interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".anistat-cache", "p.yaml"]
    monkeypatch.undo()
    no_figures(monkeypatch)
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "out")
    assert code == 0, err
    assert err.count("resumed from cache") == 5 and ": measured " not in err, err
    assert (tmp_path / "out" / "results.csv").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "p.yaml"]  # cache removed on success


def test_disk_full_while_caching_units(capsys, tmp_path, monkeypatch):
    """ENOSPC (or EROFS, EDQUOT, …) deep inside a run: one line naming the file, exit 2, no bundle."""
    from anistat.collect import artifact

    def full(self, directory):
        target = Path(directory) / f"{self.key.id}.npz"
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))

    monkeypatch.setattr(artifact.UnitArtifact, "save", full)
    protocol = tmp_path / "p.yaml"
    protocol.write_text(INTERRUPTIBLE)
    code, _, err = run_cli(capsys, "run", protocol, "--out", tmp_path / "out")
    assert_one_line(code, err, "cannot write", ".npz", "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]
