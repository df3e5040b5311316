"""The light commands import nothing heavy (lazy imports), and hub-cache hints for `sites`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import anistat
from anistat.cli import main

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "matplotlib", "pandas", "seaborn", "scipy")


def heavy_modules_after(code: str) -> list[str]:
    """Run `code` in a fresh interpreter; the heavy modules it left in sys.modules."""
    probe = f"{code}\nimport sys\nprint('HEAVY:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    line = [x for x in result.stdout.splitlines() if x.startswith("HEAVY:")][-1]
    return [m for m in line[len("HEAVY:") :].split(",") if m]


def test_importing_the_package_and_the_cli_imports_nothing_heavy():
    assert heavy_modules_after("import anistat, anistat.cli") == []


@pytest.mark.parametrize(
    "args",
    [["--help"], ["validate", "protocols/quickstart.yaml"], ["schema"], ["init", "{tmp}/p.yaml"], ["runs", "reports"]],
)
def test_light_commands_import_nothing_heavy(tmp_path, args):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code = f"from anistat.cli import main\ncode = main({args!r})\nassert code == 0, code"
    assert heavy_modules_after(code) == []


def test_lazy_public_api():
    assert callable(anistat.fit_proxy) and anistat.load == anistat.Bundle.load
    assert anistat.TrainingMeter.__name__ == "TrainingMeter" and anistat.RunResult.__name__ == "RunResult"
    assert {"run", "load_protocol", "AnistatCallback", "energy_fraction"} <= set(dir(anistat))
    assert set(anistat.__all__) <= set(dir(anistat))
    with pytest.raises(AttributeError, match="no attribute 'fit_proxies'"):
        anistat.fit_proxies  # noqa: B018


def test_the_protocols_list_of_builtin_proxy_methods_matches_the_registry():
    """protocol.py validates the shipped methods without importing torch; the list must be the
    registry's (a method registered by the user's code is looked up in the registry)."""
    from anistat.geometry import PROXY_METHODS
    from anistat.protocol import BUILTIN_PROXY_METHODS

    assert BUILTIN_PROXY_METHODS == set(PROXY_METHODS)


@pytest.fixture
def step_only_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding org/series only at revisions step1000 and step2000 (no main)."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--org--series"
    for revision, commit in (("step1000", "a" * 40), ("step2000", "b" * 40)):
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / revision).write_text(commit)
        (repo / "snapshots" / commit).mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_sites_on_a_cache_of_step_revisions_suggests_revision(capsys, step_only_cache):
    code = main(["sites", "org/series"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "anistat: error: model 'org/series' has no revision 'main' in the local cache (and the hub was not "
        "reached); cached revisions: step1000, step2000 — pass --revision step1000"
    ]


def test_protocol_hub_model_without_revisions_names_the_cached_ones(capsys, step_only_cache, tmp_path):
    protocol = tmp_path / "p.yaml"
    protocol.write_text("name: h\nmodels: [{name: pythia, source: hub, hub_id: org/series}]\n")
    code = main(["validate", str(protocol)])
    err = capsys.readouterr().err
    assert code == 2 and "models.pythia: 'org/series' has no revision 'main'" in err
    assert "pass revisions: [step1000, …]" in err and len(err.strip().splitlines()) == 1
