"""Each error class of issue 2 item 6 is a one-line SimError naming the file and field.

Tested at the loader level (``load_profile_file`` on files written to a temporary folder),
which is what ``sim profiles validate`` and every name/path lookup go through.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.errors import SimError
from sim.profiles.device import BUNDLED_DIR as DEVICE_DIR
from sim.profiles.model import BUNDLED_DIR as MODEL_DIR
from sim.profiles.registry import load_profile_file
from sim.profiles.yamlio import MAX_ALIASES, MAX_DEPTH

DEVICE = (DEVICE_DIR / "oneplus-12.yaml").read_text()
MODEL = (MODEL_DIR / "opt-6.7b.yaml").read_text()


def _replace(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _load_error(tmp_path: Path, text: str | bytes, kind: str = "device") -> SimError:
    path = tmp_path / "profile.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(SimError) as info:
        load_profile_file(kind, path)
    err = info.value
    message = str(err)
    assert "\n" not in message and "\r" not in message
    assert message.startswith(f"{path}: "), message  # names the file first
    assert "Traceback" not in message
    return err


# (id, kind, text, expected field or None, fragment of the message)
SCHEMA_CASES = [
    ("unknown-key", "device", _replace(DEVICE, "soc: Snapdragon 8 Gen 3", "soc: x\nsocc: y"),
     "socc", "unknown field"),
    ("unknown-nested-key", "device", _replace(DEVICE, "  queue_depth: 32", "  queue_dept: 32"),
     "storage.queue_dept", "unknown field"),
    ("wrong-type-int", "device", _replace(DEVICE, "cores: 1            #", "cores: many  #"),
     "cpu.clusters.0.cores", "must be an integer"),
    ("wrong-type-bool-for-int", "device",
     _replace(DEVICE, "cores: 1            #", "cores: true  #"), "cpu.clusters.0.cores",
     "must be an integer"),
    ("wrong-type-quoted-number", "model", _replace(MODEL, "n_layers: 32", "n_layers: '32'"),
     "n_layers", "must be an integer"),
    ("wrong-type-section-is-list", "device", DEVICE[:DEVICE.index("power:\n")] + "power: [1, 2]\n",
     "power", "must be a mapping"),
    ("negative-rate", "device", _replace(DEVICE, "peak_gbps: 76.8", "peak_gbps: -76.8"),
     "dram.peak_gbps", "must be >= 1e-06"),
    ("zero-kernel-speed", "device",
     _replace(DEVICE, "kernel_speed: {dense_gemv: 1.254}  # [PI2 §2.3] 43.9 GB/s CPU decode, see above\n"
                      "      io_4k_gbps: 1.076",
              "kernel_speed: {dense_gemv: 1.254, sparse_gemv: 0}\n      io_4k_gbps: 1.076"),
     "cpu.clusters.0.kernel_speed.sparse_gemv", "must be >= 1e-06"),
    ("denormal-rate", "device", _replace(DEVICE, "peak_gbps: 76.8", "peak_gbps: 1e-320"),
     "dram.peak_gbps", "must be >= 1e-06, got 1e-320"),
    ("zero-size", "device", _replace(DEVICE, "total_bytes: 24GB", "total_bytes: 0GB"),
     "dram.total_bytes", "must be at least 1 byte"),
    ("negative-size", "device", _replace(DEVICE, "total_bytes: 24GB", "total_bytes: -24GB"),
     "dram.total_bytes", "cannot parse"),
    ("zero-count", "model", _replace(MODEL, "n_layers: 32", "n_layers: 0"), "n_layers", ">= 1"),
    ("infinite-rate", "device", _replace(DEVICE, "peak_gbps: 76.8", "peak_gbps: .inf"),
     "dram.peak_gbps", "finite"),
    ("nan-rate", "device", _replace(DEVICE, "peak_gbps: 76.8", "peak_gbps: .nan"),
     "dram.peak_gbps", "nan"),
    ("misspelt-section", "device", _replace(DEVICE, "storage:\n", "storagex:\n"),
     "storagex", "unknown field (typo?)"),
    ("missing-section", "device", DEVICE[:DEVICE.index("storage:\n")] + DEVICE[DEVICE.index("power:\n"):],
     "storage", "required field is missing"),
    ("missing-field", "model", _replace(MODEL, "hidden: 4096", "# hidden: 4096"),
     "hidden", "required field is missing"),
    ("unit-typo", "device", _replace(DEVICE, "total_bytes: 24GB", "total_bytes: 24GiBB"),
     "dram.total_bytes", "unknown unit 'GiBB'"),
    ("unit-typo-in-list", "device", _replace(DEVICE, "{block: 4KiB, gbps: 0.45}",
                                             "{block: 4KIBB, gbps: 0.45}"),
     "storage.seq_read.0.block", "unknown unit"),
    ("out-of-range-fraction", "model", _replace(MODEL, "mean_active_fraction: 0.033",
                                                "mean_active_fraction: 3.3"),
     "sparsity.mean_active_fraction", "<= 1"),
    ("per-layer-fraction", "model", _replace(MODEL, '  source: "LLM in a Flash arXiv 2312.11514 v3, Table 6"',
                                             '  source: "x y z"\n  per_layer: [' + ", ".join(["-0.1"] * 32) + "]"),
     "sparsity.per_layer.0", "> 0"),
    ("bad-literal", "model", _replace(MODEL, "activation: relu ", "activation: relux "),
     "activation", "must be one of"),
    ("cross-field", "device", _replace(DEVICE, "usable_bytes: 19GB", "usable_bytes: 25GB"),
     "dram", "usable_bytes 25.00 GB must not exceed total_bytes 24.00 GB"),
    ("heads-do-not-divide-hidden", "model", _replace(MODEL, "hidden: 4096", "hidden: 4097"),
     "(top level)", "hidden 4097 must be a multiple of n_heads 32"),
]


@pytest.mark.parametrize(("kind", "text", "field", "fragment"),
                         [c[1:] for c in SCHEMA_CASES], ids=[c[0] for c in SCHEMA_CASES])
def test_schema_errors_name_the_field(tmp_path, kind, text, field, fragment):
    err = _load_error(tmp_path, text, kind)
    assert err.field == field
    assert f": {field}: " in str(err)
    assert fragment in err.detail


# (id, text, fragment): problems found while reading the YAML, before the schema.
YAML_CASES = [
    ("malformed", "name: [oops\ncpu: 1\n", "malformed YAML"),
    ("bad-indentation", "name: a\n  cpu: b\n c: d\n", "malformed YAML"),
    ("tab-indent", "name:\n\tcpu: 1\n", "malformed YAML"),
    ("empty", "", "file is empty"),
    ("whitespace-only", "  \n\n", "file is empty"),
    ("comments-only", "# nothing here\n", "no YAML document"),
    ("two-documents", "name: a\n---\nname: b\n", "more than one YAML document"),
    ("top-level-list", "- name: a\n- name: b\n", "top level is a list"),
    ("top-level-scalar", "just a string\n", "top level is a str"),
    ("top-level-number", "42\n", "top level is a int"),
    ("python-tag", "name: !!python/object/apply:os.system ['echo hi']\n", "YAML tag"),
    ("python-tag-top", "!!python/object:builtins.dict {}\n", "YAML tag"),
    ("local-tag", "name: !custom value\n", "YAML tag"),
    ("merge-key", "base: &b {x: 1}\nother:\n  <<: *b\n", "merge keys"),
    ("unhashable-key", "? [a, b]\n: 1\n", "mapping key must be a plain value"),
    ("deep-nesting", "name: " + "[" * 5000 + "]" * 5000 + "\n", f"deeper than {MAX_DEPTH}"),
    ("not-utf8", b"name: \xff\xfe\n", "not UTF-8"),
]


@pytest.mark.parametrize(("text", "fragment"), [c[1:] for c in YAML_CASES],
                         ids=[c[0] for c in YAML_CASES])
def test_yaml_errors_are_clean(tmp_path, text, fragment):
    err = _load_error(tmp_path, text)
    assert fragment in err.detail


def test_duplicate_key_names_field_and_both_lines(tmp_path):
    text = _replace(DEVICE, "  queue_depth: 32 ", "  queue_depth: 32\n  queue_depth: 16 ")
    err = _load_error(tmp_path, text)
    assert err.field == "queue_depth"
    first = next(i for i, line in enumerate(DEVICE.splitlines()) if "queue_depth" in line)
    assert f"line {first + 2}: duplicate key 'queue_depth' (first at line {first + 1})" in err.detail


def test_duplicate_top_level_key(tmp_path):
    err = _load_error(tmp_path, DEVICE + "name: again\n")
    assert err.field == "name" and "duplicate key" in err.detail


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(SimError, match="no such file"):
        load_profile_file("device", tmp_path / "absent.yaml")
    with pytest.raises(SimError, match="is a folder; expected a YAML file"):
        load_profile_file("device", tmp_path)  # a folder is not a profile


@pytest.mark.parametrize(("written", "value"), [("1e-4", 1e-4), ("2.5e3", 2500.0), ("-3E+2", -300.0), ("7", 7)])
def test_exponent_floats_are_numbers(written, value):
    """YAML 1.1 reads `1e-4` as text; profiles are hand-written, so it must be the float it looks like."""
    from sim.profiles.yamlio import load_yaml_text

    parsed = load_yaml_text(f"x: {written}\ny: v{written}\n", "t.yaml")
    assert parsed["x"] == value and type(parsed["x"]) is type(value)
    assert parsed["y"] == f"v{written}"  # only whole scalars are numbers


def _billion_laughs(levels: int, fanout: int) -> str:
    """The classic alias bomb: level k holds ``fanout`` references to level k-1."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for k in range(1, levels + 1):
        lines.append(f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * fanout) + "]")
    return "\n".join(lines) + "\n"


def _inline_bomb(levels: int, fanout: int) -> str:
    """The same bomb as one flow value, so it can sit in a single field."""
    parts = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for k in range(1, levels + 1):
        parts.append(f"&l{k} [" + ", ".join([f"*l{k - 1}"] * fanout) + "]")
    return "[" + ", ".join(parts) + "]"


def test_alias_bomb_is_rejected_before_expansion(tmp_path):
    # 10 levels of 11: 11^10 leaves if expanded; the loader stops at the 101st alias.
    err = _load_error(tmp_path, _billion_laughs(10, 11) + DEVICE)
    assert f"more than {MAX_ALIASES} YAML aliases" in err.detail


@pytest.mark.parametrize("where", ["extra-keys", "in-a-field", "as-a-section"])
def test_alias_bomb_under_the_limit_stays_a_dag(tmp_path, where):
    """81 aliases (9^9 leaves if expanded) pass the alias limit; the schema must reject the
    shared structure without walking it, so this returns at once with a schema error."""
    bomb = _inline_bomb(9, 9)
    if where == "extra-keys":
        text, field = DEVICE + _billion_laughs(9, 9), "l0"
    elif where == "in-a-field":
        line = next(x for x in DEVICE.splitlines() if x.startswith("description:"))
        text, field = _replace(DEVICE, line, f"description: {bomb}"), "description"
    else:
        text, field = DEVICE[:DEVICE.index("power:\n")] + f"power: {bomb}\n", "power"
    err = _load_error(tmp_path, text)
    assert err.field == field
    assert len(str(err)) < 400  # the bomb's contents are never printed


def test_a_profile_of_the_other_kind_is_named_as_such():
    """A device profile given as --model failed with a screen of 'unknown field' errors."""
    from sim.profiles.registry import load_device, load_model, resolve_path

    device_file, model_file = resolve_path("device", "oneplus-12"), resolve_path("model", "turbosparse-mistral-7b")
    with pytest.raises(SimError, match=r"--model: is a device profile, not a model profile; pass it as --device$"):
        load_model(device_file)
    with pytest.raises(SimError, match=r"--device: is a model profile, not a device profile; pass it as --model$"):
        load_device(model_file)


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs a FIFO")
def test_a_path_that_is_not_a_regular_file_is_not_called_missing(tmp_path):
    import os

    from sim.profiles.registry import load_device

    fifo = tmp_path / "phone.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SimError, match="is not a regular file; expected a YAML file"):
        load_device(fifo)
