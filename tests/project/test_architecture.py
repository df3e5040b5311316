"""The import graph of anistat has no upward edge (ARCHITECTURE.md, "Layers").

Every `import` / `from … import` in every module of the package — module-level and the lazy ones
inside functions alike — is read with `ast`, mapped to the stage it targets (the first name after
`anistat.`), and checked against the layer table below: a stage may import only stages of a
strictly lower layer (and itself). The package facade `anistat/__init__.py` and `__main__` sit on
top: nothing below imports it (the version comes from the layer-0 `anistat._version`).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "anistat"

#: Layer of every stage (top-level module or subpackage of anistat); lower layers never import
#: higher ones. Stages on one layer do not import each other.
LAYERS: dict[str, int] = {
    "errors": 0,
    "atomic": 0,
    "seeding": 0,
    "runtime": 0,
    "timing": 0,
    "_version": 0,
    "_columns": 0,
    "locking": 0,  # one writer per bundle folder and cache (fcntl.flock)
    "vocabulary": 0,
    "geometry": 1,
    "stats": 1,
    "report": 1,  # pure libraries: nothing else from anistat but the constant modules
    "protocol": 2,
    "workers": 2,  # process pools (uses runtime's thread setting)
    "corpus": 3,  # reading the documents (no torch: `validate` counts them)
    "data": 4,
    "objective": 4,
    "collect": 5,
    "models": 6,
    "live": 6,
    "analyze": 7,
    "claims": 7,
    "preflight": 7,
    "staleness": 7,  # preflight: configs, sites and planned rows
    "summary": 7,  # a loaded bundle's compact table (Bundle.summary), from the report's selection
    "explore": 7,  # a loaded bundle's figures and kept bases (Bundle.figure, Bundle.bases)
    "runs": 7,  # `anistat runs`: bundles under a folder, from their manifests
    "bundle": 8,
    "finalize": 9,  # the one analyse-and-publish path (run, meter, finalize_bundle)
    "rerender": 9,
    "verify": 9,
    "comparison": 9,
    "plan": 9,  # study planning: stats formulas over a pilot read through bundle
    "calibration_report": 9,  # `anistat calibrate`'s files: stats.calibrate's study, the report's page
    "pipeline": 10,
    "callbacks": 10,
    "replicate": 11,
    "caches": 11,  # `anistat cache list|clean`: reads the pipeline's cache layout
    "cli": 12,
    "__main__": 13,
    "anistat": 13,  # the package facade
}
PURE = ("geometry", "stats", "report")
#: Layer-0 modules of constants (no code runs, no state): the pure stages may import these, so a
#: column list or the version string is defined once for every stage.
CONSTANT_MODULES = ("_columns", "_version", "vocabulary")


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "anistat"


def import_edges() -> list[tuple[str, str, str, int]]:
    """(importing stage, imported stage, file, line) for every import of anistat inside anistat."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts)
        package = module[: -len(".__init__")] if module.endswith(".__init__") else module.rsplit(".", 1)[0]
        module = package if module.endswith(".__init__") else module
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target == "anistat":  # `from . import x` at the top: x is the stage
                    targets = [f"anistat.{alias.name}" for alias in node.names]
                else:
                    targets = [target]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target.split(".")[0] == "anistat":
                    edges.append((_stage(module), _stage(target), str(path.relative_to(PACKAGE.parent)), node.lineno))
    return edges


def test_the_graph_is_read():
    edges = import_edges()
    assert len(edges) > 50
    assert ("pipeline", "bundle") in {(a, b) for a, b, _f, _l in edges}


def test_every_stage_has_a_layer():
    stages = {
        path.stem if path.is_file() else path.name
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").is_file()) and path.name != "__init__.py"
    }
    assert stages <= set(LAYERS), sorted(stages - set(LAYERS))


def test_no_upward_import():
    upward = [
        f"{file}:{line}: {src} (layer {LAYERS[src]}) imports {dst} (layer {LAYERS.get(dst, '?')})"
        for src, dst, file, line in import_edges()
        if src != dst and not LAYERS.get(dst, 99) < LAYERS[src]
    ]
    assert not upward, "\n".join(upward)


def test_nothing_inside_the_package_imports_its_root():
    """`from . import __version__` (or any name) from the facade would run `anistat/__init__.py`
    from below; the facade is the one stage nothing imports."""
    facade = [
        f"{file}:{line}: {src} imports {dst}"
        for src, dst, file, line in import_edges()
        if src not in ("anistat", "__main__") and (dst == "anistat" or dst not in LAYERS)
    ]
    assert not facade, "\n".join(facade)


def test_pure_stages_import_nothing_else_from_anistat():
    leaks = [
        f"{file}:{line}: {src} imports {dst}"
        for src, dst, file, line in import_edges()
        if src in PURE and dst != src and dst not in CONSTANT_MODULES
    ]
    assert not leaks, "\n".join(leaks)


def _architecture_tree() -> dict[str, str]:
    """ARCHITECTURE.md's module tree: each top-level entry (``name.py`` or ``package/``) → its text."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = text.split("```\nanistat/\n", 1)[1].split("```", 1)[0]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        head = line[2:].split(" ", 1)[0] if line.startswith("  ") and not line.startswith("   ") else ""
        if head:
            current = head
            entries[current] = line
        elif current:
            entries[current] += "\n" + line
    return entries


def test_the_architecture_tree_names_every_module_and_nothing_else():
    """Every module of the package is in ARCHITECTURE.md's tree — a top-level module as an entry of
    its own, a subpackage's module by name in its package's entry — and every entry exists."""
    import re

    entries = _architecture_tree()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) == 1:
            if rel.name not in ("__init__.py", "__main__.py") and rel.name not in entries:
                missing.append(str(rel))
            continue
        package = rel.parts[0] + "/"
        if package not in entries:
            missing.append(str(rel))
        elif rel.name != "__init__.py" and not re.search(rf"\b{re.escape(rel.stem)}\b", entries[package]):
            missing.append(str(rel))
    assert not missing, f"modules missing from ARCHITECTURE.md's tree: {missing}"
    stale = [name for name in entries if not (PACKAGE / name.rstrip("/")).exists()]
    assert not stale, f"ARCHITECTURE.md's tree names what the package does not have: {stale}"
