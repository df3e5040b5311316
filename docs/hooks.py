"""mkdocs hooks: the pages that are generated from the code at build time, so they cannot drift.

A page asks for a generated block with an HTML comment on a line of its own:

* ``<!-- generated: protocol-reference -->`` — every key of the protocol, from the pydantic
  model's JSON schema (`anistat.protocol.protocol_schema`);
* ``<!-- generated: cli-reference -->`` — every command, argument and option of the typer app;
* ``<!-- generated: error-index -->`` — every one-line error message anistat raises with literal
  text (`AnistatInputError`, `AnistatError`, `IncompleteRun`), found by reading the source;
* ``<!-- generated: fallback-codes -->`` — every code of the results' ``fallback`` column with its
  meaning, from `anistat.stats.FALLBACK_CODES`.

The functions are importable (``tests/project/test_docs.py`` uses `schema_fields`) and need only the
repository on ``sys.path``.
"""

from __future__ import annotations

import ast
import html
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = "<!-- generated: {} -->"
ERROR_CLASSES = frozenset({"AnistatInputError", "AnistatError", "IncompleteRun"})


# ---------------------------------------------------------------------------------------------
# Protocol reference
# ---------------------------------------------------------------------------------------------


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _child_defs(node: dict) -> Iterator[tuple[str, str]]:
    """The object definitions a field's value can hold, with how the path continues into them:
    ``.`` for an object, ``[].`` for list items, ``.<key>.`` for mapping values."""
    if "$ref" in node:
        yield _ref_name(node["$ref"]), "."
    for key in ("anyOf", "oneOf", "allOf"):
        for member in node.get(key, []):
            yield from _child_defs(member)
    if isinstance(node.get("items"), dict):
        for name, sep in _child_defs(node["items"]):
            yield name, "[]" + sep
    if isinstance(node.get("additionalProperties"), dict):
        for name, sep in _child_defs(node["additionalProperties"]):
            yield name, ".<key>" + sep


def schema_fields(schema: dict | None = None) -> list[tuple[str, str, dict, bool]]:
    """Every field of the protocol schema, recursively: ``(path, section, node, required)``.

    ``path`` is the dotted key a protocol file uses (``models[].train.steps``), ``section`` the
    pydantic model that declares it (``Protocol``, ``TrainSpec``, …)."""
    if schema is None:
        from anistat.protocol import protocol_schema

        schema = protocol_schema()
    defs = schema.get("$defs", {})
    found: list[tuple[str, str, dict, bool]] = []

    def walk(node: dict, section: str, prefix: str, seen: tuple[str, ...]) -> None:
        required = set(node.get("required", []))
        for key, child in node.get("properties", {}).items():
            path = prefix + key
            found.append((path, section, child, key in required))
            for name, sep in _child_defs(child):
                if name in seen or name not in defs:
                    continue
                walk(defs[name], name, path + sep, seen + (name,))

    walk(schema, "Protocol", "", ("Protocol",))
    return found


def _type_text(node: dict) -> str:
    if "$ref" in node:
        return _ref_name(node["$ref"])
    if "enum" in node:
        return " | ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " | ".join(_type_text(m) for m in node[key])
    kind = node.get("type")
    if kind == "array":
        items = node.get("items")
        return f"list of {_type_text(items)}" if isinstance(items, dict) else "list"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"mapping of {_type_text(node['additionalProperties'])}"
    if isinstance(kind, list):
        return " | ".join(kind)
    return kind or "any"


def _constraints(node: dict) -> str:
    names = {
        "minimum": "≥ {}",
        "maximum": "≤ {}",
        "exclusiveMinimum": "> {}",
        "exclusiveMaximum": "< {}",
        "minLength": "length ≥ {}",
        "maxLength": "length ≤ {}",
        "minItems": "≥ {} items",
        "maxItems": "≤ {} items",
        "pattern": "matches `{}`",
    }
    parts = [fmt.format(node[key]) for key, fmt in names.items() if key in node]
    for key in ("anyOf", "oneOf"):
        for member in node.get(key, []):
            inner = _constraints(member)
            if inner:
                parts.append(inner)
    if isinstance(node.get("items"), dict):
        inner = _constraints(node["items"])
        if inner:
            parts.append(f"each {inner}")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def protocol_reference_markdown() -> str:
    """One section per pydantic model of the protocol, headed by the YAML path where it sits
    (`models[].train`) with the model's name as the anchor (`#trainspec`)."""
    from anistat.protocol import protocol_schema

    schema = protocol_schema()
    defs = schema.get("$defs", {})
    sections: dict[str, list[tuple[str, dict, bool]]] = {}
    where: dict[str, str] = {"Protocol": "Top level"}
    for path, section, node, required in schema_fields(schema):
        sections.setdefault(section, []).append((path, node, required))
        for name, sep in _child_defs(node):
            where.setdefault(name, path + sep.rstrip("."))
    lines = []
    for section, rows in sections.items():
        doc = schema.get("description", "") if section == "Protocol" else defs[section].get("description", "")
        heading = where[section] if section == "Protocol" else f"`{where[section]}`"
        lines += [
            f"### {heading} {{#{section.lower()}}}",
            "",
            f"*{section}.* {_cell(doc)}",
            "",
            "| key | type | default | meaning |",
            "|---|---|---|---|",
        ]
        for path, node, required in rows:
            default = "required" if required else (f"`{json.dumps(node['default'])}`" if "default" in node else "—")
            kind = _type_text(node)
            if defs:
                kind = re.sub(
                    r"\b(" + "|".join(map(re.escape, defs)) + r")\b", lambda m: f"[{m[1]}](#{m[1].lower()})", kind
                )
            constraints = _constraints(node)
            kind = f"{kind}; {constraints}" if constraints else kind
            lines.append(f"| `{path}` | {_cell(kind)} | {_cell(default)} | {_cell(node.get('description', ''))} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line reference
# ---------------------------------------------------------------------------------------------


def cli_reference_markdown() -> str:
    import click
    import typer

    from anistat.cli import app

    group = typer.main.get_command(app)
    lines = []
    ctx = click.Context(group, info_name="anistat")
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        sub = click.Context(command, info_name=f"anistat {name}", parent=None)
        usage = " ".join(command.collect_usage_pieces(sub))
        lines += [f"### `anistat {name}`", "", "```text", f"anistat {name} {usage}".rstrip(), "```", ""]
        help_text = (command.help or "").strip()
        if help_text:
            lines += [help_text, ""]
        params = [p for p in command.params if p.name != "help"]
        if params:
            lines += ["| argument / option | default | meaning |", "|---|---|---|"]
            for param in params:
                if getattr(param, "param_type_name", "") == "option":
                    names = ", ".join(list(param.opts) + list(param.secondary_opts))
                else:
                    names = (param.name or "").upper()
                default = param.default
                shown = (
                    "required"
                    if param.required
                    else ("—" if default is None or default is False or default == () else f"`{default}`")
                )
                lines.append(f"| `{_cell(names)}` | {_cell(shown)} | {_cell(getattr(param, 'help', '') or '')} |")
            lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Error index
# ---------------------------------------------------------------------------------------------


def _message_text(node: ast.AST) -> str | None:
    """The literal text of an error message, with each interpolated value shown as ``{…}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _message_text(node.left), _message_text(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else "{…}") + (right if right is not None else "{…}")
    return None


def error_messages(package: Path | None = None) -> list[tuple[str, int, str, str]]:
    """``(module, line, class, message)`` for every error raised with literal text."""
    package = package or ROOT / "anistat"
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in ERROR_CLASSES or not node.exc.args:
                continue
            text = _message_text(node.exc.args[0])
            if text is None or not text.strip("{}… ").strip():
                continue
            if all(part.startswith("{") for part in text.replace("}", "}\0").split("\0") if part):
                continue  # only interpolated values: the text lives elsewhere
            found.append((module, node.lineno, name, " ".join(text.split())))
    return sorted(found)


def error_index_markdown() -> str:
    messages = error_messages()
    summary = (
        f"{len(messages)} messages in {len({m[0] for m in messages})} modules. `{{…}}` stands for a value "
        "filled in at run time (a path, a field, a number)."
    )
    lines = [summary, ""]
    current = None
    for module, _line, name, text in messages:
        if module != current:
            lines += ["", f"#### `{module}`", ""]
            current = module
        exit_code = " (exit 3)" if name == "IncompleteRun" else ""
        lines.append(f"- <code>{html.escape(text)}</code>{exit_code}")
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Fallback codes
# ---------------------------------------------------------------------------------------------


def fallback_codes_markdown() -> str:
    """A table of every fallback code and its one-line meaning."""
    from anistat.stats.fallbacks import FALLBACK_CODES

    lines = ["| code | meaning |", "| --- | --- |"]
    lines += [f"| `{code}` | {_cell(meaning)} |" for code, meaning in FALLBACK_CODES.items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# mkdocs entry point
# ---------------------------------------------------------------------------------------------

GENERATORS = {
    "protocol-reference": protocol_reference_markdown,
    "cli-reference": cli_reference_markdown,
    "error-index": error_index_markdown,
    "fallback-codes": fallback_codes_markdown,
}


#: Files outside docs/ that pages show, served under the given path (the quickstart's figures are
#: generated outputs of the shipped bundle: referenced, never copied into docs/).
EXTERNAL_FILES = {
    "assets/energy_ratio_trajectory.png": ROOT / "reports" / "quickstart" / "figures" / "energy_ratio_trajectory.png",
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, source in EXTERNAL_FILES.items():
        if source.is_file():
            files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name, generate in GENERATORS.items():
        marker = MARKER.format(name)
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown
