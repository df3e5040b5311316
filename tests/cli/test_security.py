"""Hostile files: protocols, checkpoints and corpora from someone else are treated with care.

* YAML only through the safe, alias-free loader; weights through safetensors / weights_only;
  remote code only with an explicit flag; no shell; no pickle.
* Every user string is HTML-escaped in the report (and LaTeX-escaped in the tables).
* Outputs stay inside the output directory, even when a bundle holds symbolic links.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import yaml
from test_bad_input_helpers import (
    build_tiny_gpt2,
    corpus_text,
    local_protocol,
    no_figures,
)

from anistat.cli import main

PACKAGE = Path(__file__).resolve().parents[2] / "anistat"
PAYLOAD = "<script>alert('xss')</script>"
IMG = "<img src=x onerror=alert(1)>"
TEX = r"\input{/etc/passwd}"


def _sources() -> list[tuple[Path, ast.AST, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        out.append((path, ast.parse(text), text))
    return out


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            yield node, owner, name


def _keyword(node: ast.Call, name: str):
    for keyword in node.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def test_source_uses_only_safe_loaders_and_no_shell():
    problems = []
    for path, tree, _ in _sources():
        where = path.relative_to(PACKAGE.parent)
        for node, owner, name in _calls(tree):
            line = f"{where}:{node.lineno}"
            if owner == "yaml" and name in ("unsafe_load", "full_load", "load_all", "unsafe_load_all", "full_load_all"):
                problems.append(f"{line}: yaml.{name}")
            if owner == "yaml" and name == "load":
                loader = _keyword(node, "Loader")
                if not (isinstance(loader, ast.Name) and loader.id == "_NoAliasSafeLoader"):
                    problems.append(f"{line}: yaml.load without the safe alias-free loader")
            if owner == "torch" and name == "load":
                weights_only = _keyword(node, "weights_only")
                if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                    problems.append(f"{line}: torch.load without weights_only=True")
            if owner in ("np", "numpy") and name == "load":
                allow = _keyword(node, "allow_pickle")
                if not (isinstance(allow, ast.Constant) and allow.value is False):
                    problems.append(f"{line}: np.load without allow_pickle=False")
            if owner in ("pickle", "dill", "cloudpickle", "marshal") and name in ("load", "loads"):
                problems.append(f"{line}: {owner}.{name}")
            if owner == "os" and name in ("system", "popen", "execv", "execvp", "spawnl"):
                problems.append(f"{line}: os.{name}")
            if isinstance(node.func, ast.Name) and name in ("eval", "exec", "__import__"):
                problems.append(f"{line}: {name}()")
            if owner == "subprocess":
                shell = _keyword(node, "shell")
                if shell is not None and not (isinstance(shell, ast.Constant) and shell.value is False):
                    problems.append(f"{line}: subprocess with shell")
                if node.args and not isinstance(node.args[0], (ast.List, ast.Tuple, ast.Name)):
                    problems.append(f"{line}: subprocess command is not an argument list")
            if name == "from_pretrained":
                trust = _keyword(node, "trust_remote_code")
                if isinstance(trust, ast.Constant) and trust.value is True:
                    problems.append(f"{line}: trust_remote_code=True hard-coded")
    assert problems == []


def test_remote_code_is_off_unless_asked():
    from anistat.protocol import ModelSpec

    assert ModelSpec(name="m", source="local", path="x").trust_remote_code is False


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny") / "model")


def test_checkpoint_with_custom_code_is_refused_without_the_flag(tiny_model, tmp_path, capsys):
    import shutil

    evil = tmp_path / "evil-model"
    shutil.copytree(tiny_model, evil)
    config = json.loads((evil / "config.json").read_text())
    config.update(
        model_type="anistat-evil",
        auto_map={"AutoConfig": "evil_code.EvilConfig", "AutoModelForCausalLM": "evil_code.EvilModel"},
    )
    (evil / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "PWNED"
    (evil / "evil_code.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('pwned')\n"
        "from transformers import GPT2Config as EvilConfig, GPT2LMHeadModel as EvilModel\n"
    )
    (tmp_path / "corpus.txt").write_text(corpus_text())
    protocol = tmp_path / "p.yaml"
    protocol.write_text(local_protocol("evil", evil, tmp_path / "corpus.txt"))
    code = main(["run", str(protocol), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "custom code" in err
    assert not marker.exists(), "checkpoint code ran without trust_remote_code"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_user_strings_are_escaped_and_outputs_confined(tiny_model, tmp_path, capsys):
    """`<script>` and friends through the title, description, claim texts, a checkpoint label
    (a directory name) and the corpus itself (concept cards): all escaped in report.html, no
    raw LaTeX commands in the .tex files, nothing written outside --out."""
    import shutil

    series = tmp_path / "models"
    series.mkdir()
    hostile_label = f"{IMG}$x^$"
    shutil.copytree(tiny_model, series / hostile_label)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((f"{PAYLOAD} {IMG} {TEX} " * 3 + "\n" + corpus_text(600) + "\n") * 6)
    data = yaml.safe_load(local_protocol("hostile", series / hostile_label, corpus))
    del data["models"][0]["path"]
    data["models"][0]["checkpoints"] = [str(series / hostile_label)]
    data["report"]["title"] = f"{PAYLOAD} {TEX}"
    data["description"] = f"{PAYLOAD} {IMG}"
    data["claims"] = [
        {"id": "c1", "statement": f"{PAYLOAD} {TEX}", "metric": "energy_ratio", "where": {"checkpoint": hostile_label}}
    ]
    text = yaml.safe_dump(data, allow_unicode=True)
    protocol = tmp_path / "p.yaml"
    protocol.write_text(text)
    before = {p for p in tmp_path.rglob("*")}
    code = main(["run", str(protocol), "--out", str(tmp_path / "out"), "--quiet"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err  # 1: the claim may fail; either way a bundle
    report = (tmp_path / "out" / "report.html").read_text()
    for raw in ("<script>alert", "<img src=x", "onerror=alert(1)>"):
        assert raw not in report, raw
    assert "&lt;script&gt;alert(" in report  # the title is there, escaped
    assert "&lt;img src=x onerror=alert(1)&gt;" in report  # so is the checkpoint label
    for name in ("tables.tex", "report.tex"):
        path = tmp_path / "out" / name
        if path.is_file():
            assert TEX not in path.read_text(), name
    created = {p for p in tmp_path.rglob("*")} - before
    outside = [p for p in created if tmp_path / "out" not in p.parents and p != tmp_path / "out"]
    assert outside == []


def test_rerender_does_not_follow_links_out_of_the_bundle(tiny_model, tmp_path, capsys, monkeypatch):
    """A shared bundle whose report.html / figures are symlinks to files elsewhere: `anistat
    report` replaces the links, never writes through them."""
    no_figures(monkeypatch)
    (tmp_path / "corpus.txt").write_text(corpus_text())
    protocol = tmp_path / "p.yaml"
    protocol.write_text(local_protocol("links", tiny_model, tmp_path / "corpus.txt"))
    assert main(["run", str(protocol), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "keep.txt").write_text("untouched")
    bundle = tmp_path / "out"
    (bundle / "report.html").unlink()
    (bundle / "report.html").symlink_to(victim)
    if (bundle / "figures").exists():
        shutil_rmtree(bundle / "figures")
    (bundle / "figures").symlink_to(victim_dir, target_is_directory=True)
    code = main(["report", str(bundle), "--no-pdf"])
    capsys.readouterr()
    assert code == 0
    assert victim.read_text() == "untouched"
    assert sorted(p.name for p in victim_dir.iterdir()) == ["keep.txt"]
    assert (victim_dir / "keep.txt").read_text() == "untouched"
    assert not (bundle / "report.html").is_symlink() and (bundle / "report.html").is_file()


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def test_bundle_names_are_fixed(tmp_path, capsys):
    """The protocol name picks the default folder: it can never climb out of reports/."""
    protocol = tmp_path / "p.yaml"
    for name in ("..", "../up", "a/../../b", "/abs", "~user", "$HOME", "name\nx"):
        protocol.write_text(json.dumps({"name": name, "models": [{"name": "m", "architecture": "gpt2"}]}))
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            code = main(["run", str(protocol)])
        finally:
            os.chdir(cwd)
        err = capsys.readouterr().err
        assert code == 2 and "name:" in err and len(err.strip().splitlines()) == 1, (name, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]
