"""The fast tier (`python -m pytest -m "not slow"`) still reaches every module of anistat.

A test file belongs to the fast tier unless its module-level ``pytestmark`` marks it slow. The
modules a fast-tier file imports (``import anistat.x`` / ``from anistat.x import …``, at any
depth of the file; ``python -m anistat`` in a subprocess reaches ``anistat.__main__``), closed over the imports inside anistat itself, must cover the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "anistat"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(tree: ast.AST, package: str) -> set[str]:
    """Every anistat module ``tree`` imports; ``package`` resolves relative imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            # the module itself and every package above it run on import
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in MODULES)
    return found


def _closure(start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = MODULES[module]
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        todo.extend(_imports(ast.parse(path.read_text(encoding="utf-8")), package) - seen)
    return seen


def _is_slow_file(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return "slow" in ast.unparse(node.value)
    return False


def fast_tier_files() -> list[Path]:
    return [
        path
        for path in sorted(TESTS.rglob("test_*.py"))
        if not _is_slow_file(ast.parse(path.read_text(encoding="utf-8")))
    ]


def test_the_fast_tier_imports_every_module():
    reached: set[str] = set()
    for path in fast_tier_files():
        text = path.read_text(encoding="utf-8")
        reached |= _imports(ast.parse(text), "tests")
        if '"-m", "anistat"' in text:  # runs the command line as a user does: `python -m anistat`
            reached.add("anistat.__main__")
    missing = sorted(set(MODULES) - _closure(reached))
    assert not missing, f"no fast-tier test file reaches: {missing}"


def test_the_closure_is_real():
    assert "anistat.geometry.moments" in _closure({"anistat.geometry"})
    assert _closure({"anistat._version"}) == {"anistat._version"}
    assert len(fast_tier_files()) > 10
