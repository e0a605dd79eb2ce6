"""No two modules of ``sim`` import each other, directly or round a longer circle.

A circle hides in function-level imports (they defer the import, so nothing fails until a
refactor hoists one) and makes a layer depend on the one above it. This reads every
module's imports from its source, function-level ones included, and fails naming a cycle.
An edge goes to the module an import names (``from sim.a import b`` is ``sim.a.b`` when
that is a module, else ``sim.a``); the parent packages Python imports on the way are not
edges, since a package's ``__init__`` re-exporting its children is not a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[1] / "sim"


def module_name(path: Path, root: Path = SIM) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = SIM) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_find_cycle_sees_a_function_level_circle(tmp_path):
    pkg = tmp_path / "sim"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from sim.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    graph = import_graph(pkg)
    assert graph["sim.a"] == {"sim.sub.b"} and graph["sim.sub.b"] == {"sim.a"}
    assert find_cycle(graph) == ["sim.a", "sim.sub.b", "sim.a"]
    (pkg / "sub" / "b.py").write_text("import numpy\n")
    assert find_cycle(import_graph(pkg)) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
