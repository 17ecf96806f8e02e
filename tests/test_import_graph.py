"""The project's packages import one way: no module reaches, through any chain of imports,
back to itself. Read from the source with ast, so imports inside functions and under
``TYPE_CHECKING`` count too: a cycle for the type checker is a cycle for the reader."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("tectonic_emu", "clients", "fuse_mount", "bench")


def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports: for ``from a.b import c``, ``a.b.c`` when that
    is a module, else ``a.b`` (a package's ``__init__``). A module's own parent packages are
    left out: importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first anyway."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(_parsed(path)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                out.add(target)
    return out


def _parsed(path: Path) -> ast.Module:
    """``path``'s AST. Once more after a SystemError "AST constructor recursion depth
    mismatch": CPython 3.11 keeps that depth in state the threads share, so a thread
    compiling at the same moment (a test's leftover worker importing a module) can trip a
    sound parse (python/cpython#106905, seen once in this suite's CI)."""
    source = path.read_text()
    try:
        return ast.parse(source, str(path))
    except SystemError:
        return ast.parse(source, str(path))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def project_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_itself_back() -> None:
    graph = project_graph()
    assert len(graph) > 100  # every package was read
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_coding_layer_imports_nothing_above_it() -> None:
    """Codecs are pure functions at the bottom: coding/ may import only the bottom modules."""
    allowed = {"tectonic_emu.buffers", "tectonic_emu.errors"}
    graph = project_graph()
    for name, targets in graph.items():
        if name.startswith("tectonic_emu.coding"):
            above = {t for t in targets if not t.startswith("tectonic_emu.coding")} - allowed
            assert not above, (name, above)
