"""The documentation: the site builds strictly, the generated protocol reference names every field
of the schema, every code block marked runnable runs, and the README stays a landing page whose
quickstart leaves a clone's `git status` clean.

A code block is marked runnable by an HTML comment on the line before its fence:

    <!-- runnable -->
    ```bash
    anistat validate protocols/quickstart.yaml
    ```

Each such block runs with bash (`set -euo pipefail`) in a temporary directory holding a copy of
`protocols/` and of the shipped bundle `reports/quickstart/`, with `anistat` meaning this
checkout's code. A page's runnable ```` ```python ```` blocks run there too, in order, as one
script (the cells of a notebook).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
RUNNABLE = re.compile(r"<!-- runnable -->[ \t]*\n```(?:bash|sh|console)?[ \t]*\n(.*?)```", re.DOTALL)
#: A runnable Python block: the runnable Python blocks of one page run in order in one interpreter,
#: like the cells of a notebook.
RUNNABLE_PYTHON = re.compile(r"<!-- runnable -->[ \t]*\n```python[ \t]*\n(.*?)```", re.DOTALL)
README_MAX_LINES = 150


def _hooks():
    spec = importlib.util.spec_from_file_location("anistat_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


# ---------------------------------------------------------------------------------------------
# The strict build
# ---------------------------------------------------------------------------------------------


def _missing_docs_tools() -> list[str]:
    return [
        name
        for name in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
        if importlib.util.find_spec(name.split(".")[0]) is None
        or (name == "mkdocstrings_handlers.python" and importlib.util.find_spec(name) is None)
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    missing = _missing_docs_tools()
    if missing:
        pytest.skip(f"the docs tools are not installed ({', '.join(missing)}): pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        check=False,
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.mark.slow
def test_the_site_builds_strictly_with_every_page_of_the_nav(site):
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from pages(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from pages(value)

    listed = list(pages(config["nav"]))
    assert len(listed) >= 15
    for page in listed:
        built = site / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert built.is_file(), f"{page} was not built"
    # the generated blocks were filled in, not left as markers
    for page in ("protocol-reference", "cli", "troubleshooting", "results-columns"):
        assert "<!-- generated: " not in (site / page / "index.html").read_text(encoding="utf-8")
    assert "<code>withheld_few_units</code>" in (site / "results-columns" / "index.html").read_text(encoding="utf-8")
    # the headline figure from the shipped bundle is served, not copied into docs/
    assert (site / "assets" / "energy_ratio_trajectory.png").is_file()
    assert not list(DOCS.rglob("*.png"))


def test_the_api_reference_renders_docstrings(site):
    text = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("TrainingMeter", "AnistatCallback", "load_protocol", "AnistatInputError"):
        assert name in text


# ---------------------------------------------------------------------------------------------
# The generated references
# ---------------------------------------------------------------------------------------------


def _schema_objects(schema: dict) -> dict[str, dict]:
    """Every object definition in the schema with properties: the root as `Protocol`, then `$defs`."""
    objects = {"Protocol": schema}
    for name, node in schema.get("$defs", {}).items():
        if node.get("properties"):
            objects[name] = node
    return objects


def _sections(markdown: str) -> dict[str, str]:
    """The reference's sections by the schema model they document (the heading's anchor)."""
    parts = re.split(r"^### .*\{#(\w+)\}\s*$", markdown, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_the_protocol_reference_names_every_field_of_the_schema():
    from anistat.protocol import protocol_schema

    schema = protocol_schema()
    sections = _sections(_hooks().protocol_reference_markdown())
    objects = _schema_objects(schema)
    assert {name.lower() for name in objects} == set(sections), "every model of the schema has its own section"
    count = 0
    for name, node in objects.items():
        section = sections[name.lower()]
        keys = re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE)
        for field, spec in node["properties"].items():
            count += 1
            assert any(key == field or key.endswith(("." + field, "]." + field)) for key in keys), (
                f"{name}.{field} is missing from the protocol reference"
            )
            described = spec.get("description")
            if described:
                assert " ".join(described.split())[:40].replace("|", "\\|") in section
    assert count >= 60
    for path in ("models[].train.steps", "claims[].meta.dependence", "stats.alpha", "data.seq_len"):
        assert f"`{path}`" in "".join(sections.values())


def test_the_protocol_reference_fails_on_a_field_it_does_not_list():
    """The check above can fail: a schema with one more field is not covered by today's page."""
    from anistat.protocol import protocol_schema

    schema = json.loads(json.dumps(protocol_schema()))
    schema["$defs"]["StatsSpec"]["properties"]["an_unlisted_field"] = {"type": "integer"}
    hooks = _hooks()
    listed = {path for path, *_ in hooks.schema_fields()}
    assert "stats.an_unlisted_field" not in listed
    assert "stats.an_unlisted_field" in {path for path, *_ in hooks.schema_fields(schema)}


def test_the_cli_reference_names_every_command_and_option():
    import typer

    from anistat.cli import app

    text = _hooks().cli_reference_markdown()
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        assert f"### `anistat {name}`" in text
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-"):
                    assert f"`{opt}" in text or f", {opt}" in text, f"anistat {name} {opt} is not documented"


def test_the_error_index_lists_the_messages_raised_in_the_source():
    hooks = _hooks()
    messages = hooks.error_messages()
    texts = [text for *_, text in messages]
    assert len(messages) >= 100
    assert any("a bundle already exists there; pass --overwrite" in t for t in texts)
    assert any(t.startswith("--device must be auto, cpu, cuda or mps") for t in texts)
    modules = {module for module, *_ in messages}
    assert {"anistat.preflight", "anistat.cli", "anistat.protocol", "anistat.bundle"} <= modules


# ---------------------------------------------------------------------------------------------
# Runnable blocks
# ---------------------------------------------------------------------------------------------


def _runnable_blocks() -> list[tuple[str, int, str]]:
    found = []
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        for index, match in enumerate(RUNNABLE.finditer(path.read_text(encoding="utf-8"))):
            found.append((path.relative_to(ROOT).as_posix(), index, match.group(1)))
    return found


def test_there_are_runnable_blocks():
    assert len(_runnable_blocks()) >= 4


def _work_copy(tmp_path: Path) -> Path:
    """What a runnable block sees: protocols/ and the shipped quickstart bundle."""
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "protocols", work / "protocols")
    shutil.copytree(ROOT / "reports" / "quickstart", work / "reports" / "quickstart")
    return work


@pytest.mark.parametrize("source,index,code", _runnable_blocks(), ids=[f"{p}#{i}" for p, i, _ in _runnable_blocks()])
def test_a_runnable_block_runs(source, index, code, tmp_path):
    work = _work_copy(tmp_path)
    shim = tmp_path / "bin"
    shim.mkdir()
    launcher = shim / "anistat"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m anistat "$@"\n', encoding="utf-8")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    env = _env()
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        check=False,
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{source} block {index} failed:\n{code}\n{proc.stdout}\n{proc.stderr}"


def _python_pages() -> list[tuple[str, str]]:
    pages = []
    for path in sorted(DOCS.glob("*.md")):
        blocks = RUNNABLE_PYTHON.findall(path.read_text(encoding="utf-8"))
        if blocks:
            pages.append((path.relative_to(ROOT).as_posix(), "\n".join(blocks)))
    return pages


def test_there_are_runnable_python_pages():
    assert "docs/notebook.md" in dict(_python_pages())


@pytest.mark.parametrize("source,code", _python_pages(), ids=[p for p, _ in _python_pages()])
def test_a_pages_python_blocks_run_in_order(source, code, tmp_path):
    work = _work_copy(tmp_path)
    env = {**_env(), "MPLBACKEND": "Agg"}
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{source}'s python blocks failed:\n{code}\n{proc.stdout}\n{proc.stderr}"


# ---------------------------------------------------------------------------------------------
# The README
# ---------------------------------------------------------------------------------------------


def test_the_readme_is_a_landing_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    text = "\n".join(lines)
    for link in ("docs/getting-started.md", "docs/concepts.md", "docs/statistics.md", "CONTRIBUTING.md"):
        assert f"({link})" in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def _quickstart_out() -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"anistat run protocols/quickstart\.yaml --out (\S+)", text)
    assert match, "the README's quickstart command names its --out"
    assert "--overwrite" not in match.group(0)
    return match.group(1)


def test_the_readme_quickstart_writes_outside_the_tracked_tree():
    out = _quickstart_out()
    assert not out.startswith("reports/"), "the quickstart must not write over the shipped bundle"
    if (
        shutil.which("git") is None
        or subprocess.run(["git", "rev-parse", "--git-dir"], check=False, cwd=ROOT, capture_output=True).returncode != 0
    ):
        pytest.skip("not a git checkout")
    # the bundle, and the unit cache `anistat run` keeps beside it (pipeline: OUT/../.anistat-cache/)
    written = [
        f"{out}/{name}"
        for name in ("report.html", "results.csv", "figures/energy_ratio_trajectory.png", "manifest.json")
    ]
    written.append(f"{Path(out).parent.as_posix()}/.anistat-cache/{Path(out).name}-0123456789abcdef-a5/unit.pt")
    written.append(f"{Path(out).parent.as_posix()}/.{Path(out).name}.anistat-lock")  # a killed run's lock file
    for path in written:
        proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], check=False, cwd=ROOT)
        assert proc.returncode == 0, f"{path} is not ignored by git: a newcomer's quickstart would dirty the clone"
    tracked = subprocess.run(["git", "ls-files", out], check=False, cwd=ROOT, capture_output=True, text=True).stdout
    assert not tracked.strip()


def test_the_readme_test_command_is_the_one_ci_runs():
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = re.findall(
        r"^python -m pip install torch==\S+ -e \"[^\"]+\" && python -m pytest.*$", readme, re.MULTILINE
    )
    assert len(commands) == 1, "the README has one test command"
    assert commands[0] in ci.splitlines(), f"{commands[0]!r} is not what .ci/run runs"
