"""Every module of the package imports, at top level, only the standard library and the
runtime dependencies pyproject.toml declares: `pip install -e . && sim run` must work
without the dev/reference/distributed extras (an undeclared `import click` broke it once)."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Distribution name -> import name where they differ.
IMPORT_NAME = {"pyyaml": "yaml"}


def _declared() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = set()
    for dep in deps:
        name = dep.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            name = name.split(sep)[0]
        names.add(IMPORT_NAME.get(name.lower(), name.lower().replace("-", "_")))
    return names


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported at module level (imports inside functions may be optional extras)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in tree.body:  # `if TYPE_CHECKING:` and try/except import blocks are not unconditional
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_package_imports_only_declared_runtime_dependencies():
    allowed = _declared() | set(sys.stdlib_module_names) | {"sim", "__future__"}
    bad = {}
    for path in sorted((ROOT / "sim").rglob("*.py")):
        extra = _top_level_imports(path) - allowed
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad, f"undeclared top-level imports: {bad}"


def test_the_checker_sees_an_undeclared_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import click\nimport numpy\n\ndef f():\n    import dask\n")
    assert _top_level_imports(module) == {"click", "numpy"}
