"""No unit of anistat outgrows a screen or two: classes ≤ 250 lines, functions ≤ 80 lines.

Lines are counted from the `def`/`class` line (decorators excluded) to the last line of the body,
comments included, as `ast` reports them, less the unit's own docstring: formulas, conventions and
examples are wanted there and do not make the code longer to read. A unit over its limit is split along its
natural seam; the allow-list names the ones not split yet, each with its reason, and fails when
one of them has been split (so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "anistat"
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 80

#: "path::qualified.name" -> why it is still over its limit (empty: every unit is within it; a
#: unit that has to grow past it is split along its seams, or named here with the reason).
ALLOWED: dict[str, str] = {}


def units() -> list[tuple[str, str, int]]:
    """(``path::qualname``, ``class``/``function``, lines) for every class and function in anistat."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, prefix: str, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                body = child.body[0] if child.body else None
                if (
                    isinstance(body, ast.Expr)
                    and isinstance(body.value, ast.Constant)
                    and isinstance(body.value.value, str)
                ):
                    lines -= (body.end_lineno or body.lineno) - body.lineno + 1  # the docstring is not code
                found.append((f"{path}::{name}", kind, lines))
                visit(child, f"{name}.", path)
            else:
                visit(child, prefix, path)

    for file in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(file.read_text(encoding="utf-8")), "", file.relative_to(PACKAGE.parent).as_posix())
    return found


def _over() -> dict[str, str]:
    limits = {"class": MAX_CLASS_LINES, "function": MAX_FUNCTION_LINES}
    return {
        name: f"{kind} of {lines} lines (limit {limits[kind]})" for name, kind, lines in units() if lines > limits[kind]
    }


def test_the_units_are_read():
    names = {name for name, _kind, _lines in units()}
    assert "anistat/stats/bootstrap.py::sequence_bootstrap" in names
    assert any(name.startswith("anistat/geometry/moments.py::GradientMoments.") for name in names)


def test_no_class_or_function_over_its_limit():
    over = {name: size for name, size in _over().items() if name not in ALLOWED}
    assert not over, "split these along their natural seams:\n" + "\n".join(f"{n}: {s}" for n, s in over.items())


def test_the_allow_list_only_names_units_still_over_their_limit():
    stale = sorted(set(ALLOWED) - set(_over()))
    assert not stale, f"split (or gone) — remove from ALLOWED: {stale}"
