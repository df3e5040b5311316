"""Protocol validation: strict, one-line errors naming the field, stable hashing."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import MINI_PROTOCOL

from anistat.errors import AnistatInputError
from anistat.protocol import STARTER_PROTOCOL, load_protocol, parse_protocol, protocol_schema


def _data(**changes):
    data = yaml.safe_load(MINI_PROTOCOL)
    data.update(changes)
    return data


def test_mini_protocol_validates_and_fills_defaults(mini_protocol_path):
    protocol = load_protocol(mini_protocol_path)
    assert protocol.name == "mini"
    assert protocol.models[0].resolved_objective == "clm"
    assert protocol.models[1].resolved_objective == "mlm"
    assert protocol.stats.alpha == 0.05  # default filled in
    assert len(protocol.sha256()) == 64


def test_hash_ignores_formatting_but_not_values():
    a = parse_protocol(_data())
    reordered = dict(reversed(list(_data().items())))
    assert parse_protocol(reordered).sha256() == a.sha256()
    assert parse_protocol(_data(seed=8)).sha256() != a.sha256()
    # explicit defaults hash the same as omitted ones (the protocol is normalised first)
    assert parse_protocol(_data(device="cpu")).sha256() == a.sha256()


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"sead": 1}, "unknown key 'sead'"),
        ({"seed": "abc"}, "seed:"),
        ({"seed": -1}, "seed:"),
        ({"controls": {"n": 0}}, "controls.n"),
        ({"controls": {"kinds": ["gaussian"]}}, "controls.kinds[0]"),
        ({"proxies": {"ranks": [16]}}, "must be smaller than models[0].hidden_size 16"),
        ({"proxies": {"ranks": [2, 2]}}, "proxies.ranks"),
        ({"sites": {"layers": [5]}}, "out of range"),
        ({"models": []}, "models"),
        ({"name": "bad name!"}, "name:"),
        ({"stats": {"alpha": 1.5}}, "stats.alpha"),
    ],
)
def test_invalid_protocols_name_the_field(change, expected):
    with pytest.raises(AnistatInputError) as info:
        parse_protocol(_data(**change), "p.yaml")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert message.startswith("p.yaml")


def test_nested_unknown_key_has_full_path():
    data = _data()
    data["models"][1]["train"]["stepz"] = 3
    with pytest.raises(AnistatInputError, match=r"unknown key 'models\[1\]\.train\.stepz'"):
        parse_protocol(data, "p.yaml")


def test_yaml_errors_and_non_mappings(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(AnistatInputError, match="YAML error at line"):
        load_protocol(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(AnistatInputError, match="must be a YAML mapping, got list"):
        load_protocol(bad)
    bad.write_text("")
    with pytest.raises(AnistatInputError, match="got empty"):
        load_protocol(bad)
    with pytest.raises(AnistatInputError, match="not found"):
        load_protocol(tmp_path / "missing.yaml")


def test_alias_bomb_is_rejected_before_expansion(tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(AnistatInputError, match="aliases"):
        load_protocol(bomb)


def test_python_tags_are_not_constructed(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(AnistatInputError, match="YAML error"):
        load_protocol(evil)


def test_starter_protocol_is_valid(tmp_path):
    path = tmp_path / "starter.yaml"
    path.write_text(STARTER_PROTOCOL)
    protocol = load_protocol(path)
    assert [m.name for m in protocol.models] == ["tiny-decoder", "tiny-encoder"]


def test_schema_is_json_schema_with_descriptions():
    schema = protocol_schema()
    json.dumps(schema)
    assert schema["type"] == "object"
    assert "models" in schema["required"]
    assert schema["additionalProperties"] is False
    assert "description" in schema["$defs"]["DataSpec"]["properties"]["source"]
