"""The package's import graph, read from the source with `ast` (nothing is imported): no
circle among tibnlp modules, and the layering rules of the developers' guide.

Imports inside functions count (a local import that dodges a circle is still a circle). Within
`tibnlp.models` imports under `if TYPE_CHECKING:` count too: a circle hidden from the
interpreter is still two layers that need each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tibnlp"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str, typing: bool) -> set[str]:
    """Modules named by the imports of one file (relative imports resolved); those under
    `if TYPE_CHECKING:` only with `typing`."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    """tibnlp module -> the tibnlp modules it imports (at run time; `typing`: also for the
    type checker)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[name] = {m for m in _imports(tree, package, typing) if m in files and m != name}
    return graph


def _cycle(graph: dict[str, set[str]], scope: str) -> list[str] | None:
    """One import circle among modules under `scope`, or None."""
    nodes = {n for n in graph if n == scope or n.startswith(scope + ".")}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n] & nodes):
            if state.get(m) == 1:
                return [*path[path.index(m) :], m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_graph_sees_real_imports() -> None:
    graph = import_graph()
    assert "tibnlp.models.encoder" in graph["tibnlp.models.pretraining"]
    assert "tibnlp.models.long_documents.windows" in graph["tibnlp.models.long_documents.gemformer"]
    # the checker finds a circle when there is one
    fake = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}
    assert _cycle(fake, "a") == ["a.x", "a.y", "a.z", "a.x"]


@pytest.mark.parametrize(("scope", "typing"), [("tibnlp.models", True), ("tibnlp", False)])
def test_no_import_circle(scope: str, typing: bool) -> None:
    circle = _cycle(import_graph(typing), scope)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_models_sit_below_the_stages() -> None:
    """`models/` is usable from a notebook: it never imports the stages that use it."""
    banned = ("tibnlp.training", "tibnlp.tracking", "tibnlp.pipeline", "tibnlp.cli")
    graph = import_graph()
    bad = {
        (n, m)
        for n, deps in graph.items()
        if n.startswith("tibnlp.models")
        for m in deps
        if m.startswith(banned)
    }
    assert not bad


def test_the_encoder_needs_nothing_above_it() -> None:
    """The pieces the encoder needs sit below it; the long-document readers above it."""
    graph = import_graph()

    def reach(n: str, seen: set[str]) -> set[str]:
        for m in graph[n] - seen:
            seen.add(m)
            reach(m, seen)
        return seen

    below = reach("tibnlp.models.encoder", set())
    assert not {m for m in below if m.startswith("tibnlp.models.long_documents")}
    assert "tibnlp.models.pretraining" not in below
