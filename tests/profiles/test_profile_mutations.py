"""Property: any mutation of a valid profile either still validates or fails cleanly.

Mutations are the ones users make by hand: a key dropped, a value of the wrong type, a
number or size out of range, anywhere in the nested document. Whatever happens, the only
exception allowed is a one-line SimError naming the file and, for schema problems, the
exact dotted path of the mutated field.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profile_helpers import SCHEMAS, bundled_files, field_is_required

from sim.errors import SimError
from sim.profiles.registry import load_profile_file
from sim.profiles.yamlio import load_yaml_file

PROFILES = [(kind, path.stem, load_yaml_file(path)) for kind, path in bundled_files()]


def _nodes(data: Any, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, value) for every value below the top level, depth first."""
    out = []
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        out.append(((*prefix, key), value))
        out.extend(_nodes(value, (*prefix, key)))
    return out


def _get_parent(data: Any, path: tuple) -> Any:
    for step in path[:-1]:
        data = data[step]
    return data


def _is_size(value: Any) -> bool:
    return isinstance(value, str) and value[:1].isdigit() and value.rstrip()[-1:] == "B"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@st.composite
def mutations(draw):
    kind, name, original = draw(st.sampled_from(PROFILES))
    data = copy.deepcopy(original)
    nodes = _nodes(data)
    op = draw(st.sampled_from(["drop", "wrong_type", "out_of_range"]))
    if op == "drop":
        candidates = [p for p, _ in nodes if isinstance(p[-1], str)]
    elif op == "out_of_range":
        candidates = [p for p, v in nodes if _is_number(v) or _is_size(v)]
    else:
        candidates = [p for p, _ in nodes]
    path = draw(st.sampled_from(candidates))
    parent = _get_parent(data, path)
    value = parent[path[-1]]
    if op == "drop":
        del parent[path[-1]]
        must_fail = field_is_required(SCHEMAS[kind], path)
    elif op == "wrong_type":
        # A mapping is never a valid scalar, and a plain word is never a valid section,
        # list or size, so every wrong-type mutation must be rejected.
        parent[path[-1]] = "oops" if isinstance(value, dict | list) else {"oops": 1}
        must_fail = True
    else:
        if _is_size(value):
            parent[path[-1]] = draw(st.sampled_from(["0B", "0GB", "-4KiB", "4 KIBB", "12XB"]))
        else:  # every number in a profile is a count, size, rate or fraction: none negative
            parent[path[-1]] = draw(st.one_of(st.integers(-10**6, -1),
                                              st.floats(-1e6, -1e-6, allow_nan=False)))
        must_fail = True
    return kind, name, path, op, data, must_fail


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder) / "mutated.yaml"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutations())
def test_mutated_profiles_fail_cleanly(scratch, case):
    kind, name, path, op, data, must_fail = case
    scratch.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        load_profile_file(kind, scratch)
    except SimError as err:  # any other exception type fails the test
        message = str(err)
        assert "\n" not in message
        assert message.startswith(f"{scratch}: ")
        # The mutation is the only problem, so the error must point at it.
        assert err.field == ".".join(str(p) for p in path), (name, op, message)
    else:
        assert not must_fail, f"{name}: {op} at {path} was accepted"


# Characters YAML forbids anywhere in a document (PyYAML's reader: all but tab, newline, CR, NEL).
CONTROL_CHARS = st.sampled_from([chr(c) for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20),
                                                  0x7F, *range(0x80, 0x85), *range(0x86, 0xA0)]])


@st.composite
def control_character_profiles(draw):
    """A bundled profile's text with one forbidden control character put anywhere (a key, a
    value, a comment), as a stray keystroke or a binary paste would."""
    kind, path = draw(st.sampled_from(bundled_files()))
    text = path.read_text(encoding="utf-8")
    at = draw(st.integers(0, len(text)))
    char = draw(CONTROL_CHARS)
    return kind, text[:at] + char + text[at:], at, char


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=control_character_profiles())
def test_a_control_character_anywhere_is_one_line_naming_its_line_and_column(scratch, case):
    kind, text, at, char = case
    scratch.write_text(text, encoding="utf-8")
    with pytest.raises(SimError) as info:
        load_profile_file(kind, scratch)
    line = text[:at].count("\n") + 1
    column = at - (text[:at].rfind("\n") + 1) + 1
    assert str(info.value) == (f"{scratch}: line {line}, column {column}: control character U+{ord(char):04X} "
                               "is not allowed in YAML; use printable characters, tab or newline")
