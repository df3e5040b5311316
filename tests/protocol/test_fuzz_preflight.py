"""Property test (hypothesis): no protocol or claims file makes the preflight or a loader crash.

Issue #20: `where: {objective: []}` in a claim gave a Python traceback from
`preflight.check_claim` and exit 1 — the code that means "claims failed" — on `validate` and
`run`. Here a valid study (built-in models, a local checkpoint series, claims of every shape:
scalar and list `where` values, a frequency claim, a meta claim) is mutated one to three times —
a value swapped for another type, emptied (`[]`, `{}`), set to None, to a huge or negative
number, a key deleted or added (misspelt or unknown), a value wrapped in a list or a mapping or
unwrapped from one — and run through the real command line:

* `anistat validate`: exit 0, or exit 2 with exactly one line on stderr (`anistat: error: …`);
  never a traceback, never 1 or 3;
* `anistat run` on every protocol `validate` rejects: the same — and nothing written (no
  bundle, no cache, no staging folder), since the preflight runs before any model is trained;
* `anistat verify BUNDLE --claims FILE` (claims loaded from a file and checked against a real
  bundle's tables): exit 0 or 1 (the claims were evaluated), or 2 with one line.
"""

from __future__ import annotations

import contextlib
import copy
import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import MINI_PROTOCOL
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_bad_input_helpers import build_tiny_gpt2

from anistat.cli import main

CLAIMS = [
    {
        "id": "dec-early",
        "metric": "energy_ratio",
        "where": {"objective": "clm", "rank": 2, "control": "normal", "phase": "early"},
        "compare": ">",
        "threshold": 1.0,
        "alpha": 0.05,
    },
    {
        "id": "layers",
        "metric": "z",
        "where": {"model": ["dec", "loc"], "layer": [0, 1], "checkpoint": ["step0", "a"]},
        "column": "effect_size",
        "compare": ">=",
        "threshold": 0.0,
        "aggregate": "any",
    },
    {
        "id": "freq",
        "metric": "spearman_logfreq_distance",
        "where": {"model": "dec", "bucket": "all"},
        "compare": "between",
        "threshold": [-1.0, 1.0],
    },
    {
        "id": "pooled",
        "metric": "log2_energy_ratio",
        "where": {"control": "haar", "step": [0, 3, 6]},
        "aggregate": "meta",
        "meta": {
            "method": "reml",
            "interval": "hksj",
            "dependence": "aggregate",
            "cluster": ["model"],
            "within_correlation": 1.0,
        },
    },
]

FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(
        [
            "",
            "all",
            "pca",
            "PCA",
            "normal",
            "clm",
            "mlm",
            "early",
            "late",
            "step0",
            "a",
            "dec",
            "loc",
            "energy_ratio",
            "z",
            "meta",
            "between",
            ">",
            "reml",
            "hksj",
            "model",
            "../x",
            "/nonexistent",
            0,
            1,
            2,
            -1,
            10**12,
            2**63,
            1e308,
            -0.0,
        ]
    )
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["objective", "rank", "layer", "model", "bucket", "metric", "where", "x", "", "n_bootsrap"])
            | st.text(max_size=6),
            inner,
            max_size=3,
        )
    ),
    max_leaves=8,
)


def _locations(data, prefix=()):
    """Every location in the tree (mapping keys and list indices), the root excluded."""
    if prefix:
        yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _locations(value, prefix + (key,))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _locations(value, prefix + (index,))


def mutate(data, draw, focus: str | None = None) -> None:
    """One mutation of `data` in place, at a location drawn from the current tree (half the time
    from the locations under a key named `focus`, e.g. the claims' `where`)."""
    locations = list(_locations(data))
    focused = [p for p in locations if focus in p[:-1]] if focus else []
    if focused and draw(st.booleans(), label="focused"):
        locations = focused
    path = draw(st.sampled_from(locations), label="path")
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    current = parent[last]
    action = draw(
        st.sampled_from(["replace", "empty", "none", "number", "delete", "add", "wrap", "unwrap"]), label="action"
    )
    if action == "replace":
        parent[last] = draw(values, label="value")
    elif action == "empty":
        parent[last] = draw(st.sampled_from([[], {}, ""]), label="empty")
    elif action == "none":
        parent[last] = None
    elif action == "number":
        parent[last] = draw(
            st.sampled_from([-1, 0, -(10**9), 10**18, 2**64, 1e300, -1e-300, float("inf")]), label="number"
        )
    elif action == "delete":
        del parent[last]
    elif action == "add":
        target = current if isinstance(current, (dict, list)) else parent
        if isinstance(target, dict):
            near = [k[:-1] for k in target if isinstance(k, str) and len(k) > 1]  # a misspelt key
            key = draw(
                st.sampled_from(near) if near and draw(st.booleans()) else st.text(min_size=1, max_size=8), label="key"
            )
            target[key] = draw(values, label="value")
        else:
            target.append(draw(values, label="value"))
    elif action == "wrap":
        parent[last] = [current] if draw(st.booleans(), label="as_list") else {"x": current}
    elif isinstance(current, list) and current:  # unwrap
        parent[last] = current[0]
    elif isinstance(current, dict) and current:
        parent[last] = next(iter(current.values()))


def call(*args) -> tuple[int, str, str]:
    """`anistat ARGS` in this process, its stdout and stderr captured."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def assert_clean_rejection(code: int, err: str, source) -> None:
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("anistat: error: "), err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    """The valid starting point: MINI_PROTOCOL + a local checkpoint series + the claims above."""
    root = tmp_path_factory.mktemp("fuzz-study")
    for name in ("a", "b"):
        build_tiny_gpt2(root / "ckpt" / name, hidden=8, layers=2)
    protocol = yaml.safe_load(MINI_PROTOCOL)
    protocol["data"]["seq_len"] = 16
    protocol["models"].append(
        {
            "name": "loc",
            "source": "local",
            "checkpoints": [str(root / "ckpt" / "a"), str(root / "ckpt" / "b")],
            "steps": [10, 20],
        }
    )
    protocol["claims"] = copy.deepcopy(CLAIMS)
    path = root / "valid.yaml"
    path.write_text(yaml.safe_dump(protocol, sort_keys=False))
    code, _, err = call("validate", path)
    assert code == 0, err  # the unmutated study is valid: the mutations below are what breaks it
    return protocol


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_mutated_protocols_never_crash_validate_or_run(study, tmp_path_factory, data):
    protocol = copy.deepcopy(study)
    for _ in range(data.draw(st.integers(1, 3), label="n_mutations")):
        mutate(protocol, data.draw)
    folder = tmp_path_factory.mktemp("case")
    file = folder / "p.yaml"
    file.write_text(yaml.safe_dump(protocol, allow_unicode=True, sort_keys=False))
    code, out, err = call("validate", file)
    assert code in (0, 2), (code, err)
    event(f"validate exit {code}")
    if code == 0:
        assert err == "" and "valid protocol" in out
        return
    assert_clean_rejection(code, err, file)
    code, _, err = call("run", file, "--out", folder / "bundle", "--quiet")
    assert_clean_rejection(code, err, file)
    assert sorted(p.name for p in folder.iterdir()) == ["p.yaml"], "a rejected run must write nothing"


@FUZZ
@given(data=st.data())
def test_mutated_claims_never_crash_validate(study, tmp_path_factory, data):
    """The same, aimed at the claims (the preflight's `check_claim`)."""
    protocol = copy.deepcopy(study)
    claims = protocol["claims"]
    for _ in range(data.draw(st.integers(1, 3), label="n_mutations")):
        if isinstance(claims, list) and claims:
            mutate(claims, data.draw, focus="where")
    file = tmp_path_factory.mktemp("claims") / "p.yaml"
    file.write_text(yaml.safe_dump(protocol, allow_unicode=True, sort_keys=False))
    code, out, err = call("validate", file)
    assert code in (0, 2), (code, err)
    event(f"validate exit {code}")
    if code == 2:
        assert_clean_rejection(code, err, file)


@pytest.fixture
def bundle(mini_bundle) -> Path:
    """A real bundle of MINI_PROTOCOL for `verify --claims` (the session's, read only)."""
    return mini_bundle


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_mutated_claims_files_never_crash_verify(bundle, tmp_path_factory, data):
    """`verify BUNDLE --claims FILE`: the claims loader and the check against the bundle's table."""
    claims = [c for c in copy.deepcopy(CLAIMS) if c["id"] != "layers"]  # the bundle has no model 'loc'
    claims[0]["where"]["rank"] = 2
    for _ in range(data.draw(st.integers(1, 3), label="n_mutations")):
        if claims:
            mutate(claims, data.draw, focus="where")
    file = tmp_path_factory.mktemp("claims-file") / "claims.yaml"
    file.write_text(yaml.safe_dump(claims, allow_unicode=True, sort_keys=False))
    code, _, err = call("verify", bundle, "--claims", file)
    assert code in (0, 1, 2), (code, err)
    event(f"verify exit {code}")
    if code == 2:
        assert_clean_rejection(code, err, file)
    else:
        assert err == ""


@pytest.mark.slow
@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_empty_where_list_is_one_line_in_a_real_process(tmp_path, command):
    """The issue's own example, through a real `anistat` process (nothing captured in-process:
    a traceback or a library's log line on stderr would show here)."""
    protocol = yaml.safe_load(MINI_PROTOCOL)
    protocol["claims"] = [{"id": "c", "metric": "energy_ratio", "where": {"objective": []}}]
    file = tmp_path / "p.yaml"
    file.write_text(yaml.safe_dump(protocol, sort_keys=False))
    args = [sys.executable, "-m", "anistat", command, str(file)] + (
        ["--out", str(tmp_path / "b")] if command == "run" else []
    )
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"anistat: error: {file}: claims[0].where: objective is an empty list, which selects no row; list at least "
        "one value or leave the key out"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]
