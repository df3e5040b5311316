"""Property-based fuzzing of protocol parsing (hypothesis).

Whatever bytes or data a protocol holds, loading it either yields a valid, hashable, frozen
Protocol or raises AnistatInputError with one short line naming the file — never any other
exception (no traceback reaches the user), and never a hang or an allocation explosion.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import tempfile
from pathlib import Path

import yaml
from conftest import MINI_PROTOCOL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anistat.cli import main
from anistat.errors import AnistatInputError
from anistat.protocol import Protocol, load_protocol, parse_protocol, read_yaml

BASE = yaml.safe_load(MINI_PROTOCOL)
FUZZ = settings(
    max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "pca",
            "normal",
            "haar",
            "gpt2",
            "bert",
            "clm",
            "all",
            "builtin",
            "text",
            "<script>",
            "../x",
            "",
            "1e-3",
            0,
            1,
            2,
            4,
            16,
            -1,
            2**63,
            10**40,
        ]
    )
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=8) | st.sampled_from(list(BASE) + ["ranks", "kinds", "n", "layers", "train", "name"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


def _paths(data, prefix=()):
    """Every location in the protocol tree (mapping keys and list indices)."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _paths(value, prefix + (index,))


ALL_PATHS = [p for p in _paths(BASE) if p]


def _check_outcome(data, source="p.yaml"):
    try:
        protocol = parse_protocol(data, source)
    except AnistatInputError as error:
        _check_message(str(error), source)
        return None
    assert isinstance(protocol, Protocol)
    # a valid protocol is normalised and hashed stably: its normal form parses to the same hash
    again = parse_protocol(protocol.normalised(), "normalised")
    assert again.sha256() == protocol.sha256()
    return protocol


def _check_message(message: str, source: str):
    assert "\n" not in message and message.strip() == message
    assert message.startswith(source), message
    assert len(message) < 1200, len(message)
    assert "Traceback" not in message


@FUZZ
@given(data=st.data())
def test_mutated_protocols_fail_cleanly(data):
    """Replace, delete or add one value anywhere in a valid protocol."""
    protocol = copy.deepcopy(BASE)
    path = data.draw(st.sampled_from(ALL_PATHS), label="path")
    action = data.draw(st.sampled_from(["replace", "delete", "add"]), label="action")
    parent = protocol
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "replace":
        parent[last] = data.draw(values, label="value")
    elif action == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=10), label="key")] = data.draw(values, label="value")
    else:
        parent.append(data.draw(values, label="value"))
    _check_outcome(protocol)


@FUZZ
@given(value=values)
def test_any_document_fails_cleanly(value):
    """Arbitrary YAML-representable documents, including non-mappings."""
    _check_outcome(value)


YAML_PIECES = [
    ":",
    ": ",
    "-",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a ",
    "*a",
    "!!",
    "!!python/object:os.system ",
    "!!binary ",
    "!!int ",
    "!!map ",
    "!!set ",
    "!!timestamp ",
    "\n",
    "  ",
    "\t",
    "'",
    '"',
    "#",
    "? ",
    "|",
    ">",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "name",
    "models",
    "seed",
    "1e3",
    "0x1F",
    "0o7",
    ".nan",
    ".inf",
    "~",
    "2020-13-45",
    "1:2:3",
    "<<: ",
    "x",
    "9" * 30,
    "\x00",
    "\x07",
    "\ufeff",
    "é",
]


@FUZZ
@given(text=st.lists(st.sampled_from(YAML_PIECES), max_size=30).map("".join) | st.text(max_size=200))
def test_arbitrary_yaml_text_fails_cleanly(text):
    try:
        data = read_yaml(text, "p.yaml")
    except AnistatInputError as error:
        _check_message(str(error), "p.yaml")
        return
    _check_outcome(data)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_through_the_file_loader(raw):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "p.yaml"
        path.write_bytes(raw)
        try:
            load_protocol(path)
        except AnistatInputError as error:
            _check_message(str(error), str(path))


@settings(max_examples=40, deadline=None, database=None, derandomize=True)
@given(data=st.data())
def test_cli_validate_exit_codes(data):
    """Through the command line: exit 0 (valid) or 2 with exactly one stderr line."""
    protocol = copy.deepcopy(BASE)
    path = data.draw(st.sampled_from(ALL_PATHS))
    parent = protocol
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = data.draw(values)
    with tempfile.TemporaryDirectory() as directory:
        file = Path(directory) / "p.yaml"
        file.write_text(yaml.safe_dump(protocol, allow_unicode=True))
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["validate", str(file)])
    assert code in (0, 2)
    if code == 0:
        assert err.getvalue() == "" and "valid protocol" in out.getvalue()
    else:
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"anistat: error: {file}"), err.getvalue()


@FUZZ
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    alpha=st.floats(0.001, 0.5),
    ranks=st.lists(st.integers(1, 7), min_size=1, max_size=3, unique=True),
    n=st.integers(1, 50),
)
def test_valid_variations_validate_and_hash_stably(seed, alpha, ranks, n):
    """Valid protocols stay valid; the hash changes with every value that matters."""
    protocol = copy.deepcopy(BASE)
    protocol.update(seed=seed)
    protocol["stats"]["alpha"] = alpha
    protocol["proxies"]["ranks"] = ranks
    protocol["controls"]["n"] = n
    parsed = _check_outcome(protocol)
    assert parsed is not None and math.isclose(parsed.stats.alpha, alpha)
    protocol["seed"] = (seed + 1) % 2**32
    assert parse_protocol(protocol).sha256() != parsed.sha256()
