"""Strict YAML reading for user-editable profiles.

PyYAML's ``safe_load`` accepts duplicate keys silently (the last wins), expands aliases
without limit (a "billion laughs" document takes minutes and gigabytes) and reports
errors as multi-line tracebacks. Profiles are hand-edited, so each of those becomes a
one-line :class:`~sim.errors.SimError` naming the file and the place instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from sim.errors import SimError

MAX_ALIASES = 100
MAX_DEPTH = 64  # PyYAML's scanner is quadratic in flow nesting: stop early, not at RecursionError
MAX_FILE_BYTES = 4 * 2**20


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, explicit tags and alias bombs."""

    def __init__(self, stream: str, source: str):
        super().__init__(stream)
        self.source = source
        self.alias_count = 0
        self.depth = 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            self.alias_count += 1
            if self.alias_count > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise SimError(f"line {mark.line + 1}: more than {MAX_ALIASES} YAML aliases "
                               "(alias expansion bomb?); write values out", source=self.source)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise SimError(f"line {mark.line + 1}: YAML nesting deeper than {MAX_DEPTH} levels",
                               source=self.source)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise SimError(f"line {key_node.start_mark.line + 1}: a mapping key must be a plain value",
                               source=self.source) from None
            if key in seen:
                raise SimError(f"line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                               f"(first at line {seen[key]}); each key may appear once", source=self.source,
                               field=str(key))
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _reject_tag(loader: _StrictLoader, suffix: str, node: yaml.Node) -> Any:
    if node.tag == "tag:yaml.org,2002:merge":
        raise SimError(f"line {node.start_mark.line + 1}: YAML merge keys (<<) are not allowed; "
                       "write the fields out", source=loader.source)
    raise SimError(f"line {node.start_mark.line + 1}: YAML tag {node.tag!r} is not allowed; "
                   "profiles hold plain values only", source=loader.source)


_StrictLoader.add_multi_constructor("!", _reject_tag)
_StrictLoader.add_multi_constructor("tag:", _reject_tag)
# Timestamps would turn `date: 2024-06-01` into datetime objects pydantic cannot check.
_StrictLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# YAML 1.1 (PyYAML) reads `1e-12` and `1.5e3` as strings: a float needs a dot and a signed
# exponent there, not in YAML 1.2 or Python. Hand-written figures such as `latency_s: 1e-4` are floats.
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def load_yaml_text(text: str, source: str) -> dict[str, Any]:
    """Parse one YAML document that must be a non-empty mapping."""
    if not text.strip():
        raise SimError("file is empty; expected a YAML mapping", source=source)
    data = load_yaml_value(text, source, expected="a mapping")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
        raise SimError(f"top level is {kind}; expected a mapping of fields", source=source)
    return data


def load_yaml_value(text: str, source: str, expected: str = "a value") -> Any:
    """Parse one YAML document of any shape (a command-line value such as ``1e-4`` or
    ``[big, mid]``) with the same strict rules as a profile file."""
    try:
        loader = _StrictLoader(text, source)
    except yaml.reader.ReaderError as exc:  # the reader checks every character before parsing
        raise _unprintable(text, exc, source) from None
    try:
        if not loader.check_node():
            raise SimError(f"holds no YAML document; expected {expected}", source=source)
        node = loader.get_node()
        if loader.check_node():
            raise SimError("holds more than one YAML document; expected exactly one", source=source)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SimError(f"{where}malformed YAML: {exc.problem or exc.context}", source=source) from None
    except yaml.YAMLError as exc:
        raise SimError(f"malformed YAML: {' '.join(str(exc).split())}", source=source) from None
    except RecursionError:
        raise SimError("YAML nesting too deep", source=source) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise SimError(f"unreadable value: {' '.join(str(exc).split())}", source=source) from None
    finally:
        loader.dispose()


def _unprintable(text: str, exc: yaml.reader.ReaderError, source: str) -> SimError:
    """A control character (NUL, BEL, ESC ...) that YAML forbids, located by line and column."""
    before = text[: exc.position]
    line = before.count("\n") + 1
    column = exc.position - (before.rfind("\n") + 1) + 1
    code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
    return SimError(f"line {line}, column {column}: control character U+{code:04X} is not allowed in YAML; "
                    "use printable characters, tab or newline", source=source)


def load_yaml_file(path: Path) -> dict[str, Any]:
    """Read and parse a YAML profile, with size and encoding checks."""
    source = str(path)
    if path.is_dir():
        raise SimError("is a folder; expected a YAML file", source=source)
    if not path.is_file():
        raise SimError("no such file", source=source)
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise SimError(f"file is {size} bytes; profiles must be under {MAX_FILE_BYTES} bytes", source=source)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SimError("file is not UTF-8 text", source=source) from None
    except OSError as exc:
        raise SimError(f"cannot read file: {exc.strerror or exc}", source=source) from None
    return load_yaml_text(text, source)
