"""The package layout is the architecture: no import loop, and no package imports from one after it.

The import graph is read from the source with `ast`: every `import` and `from ... import` of an
mmdata module, at module level and inside functions alike (imports under `if TYPE_CHECKING:` are
left out: they never run). A module that imports `a.b.c` depends on `a.b.c`, or on the nearest
module above it when `c` is a name rather than a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "mmdata"

# Packages in dependency order: each may import only from itself and the ones listed before it.
# `docs/architecture.md` draws the same list.
STAGES = (
    ("core", ("mmdata.errors", "mmdata.checks", "mmdata.schema", "mmdata.lifetime", "mmdata.moments",
              "mmdata.version", "mmdata.synthetic")),
    ("codecs", ("mmdata.codecs",)),
    ("store", ("mmdata.store",)),
    ("planning", ("mmdata.planning",)),
    ("loading", ("mmdata.loading",)),
    ("lerobot", ("mmdata.lerobot",)),
    ("importers", ("mmdata.importers",)),
    ("conversion", ("mmdata.conversion",)),
    ("editing", ("mmdata.editing",)),
    ("exporters", ("mmdata.exporters",)),
    ("measure", ("mmdata.measure",)),
    ("viewer", ("mmdata.viewer",)),
    ("tools", ("mmdata.tools", "mmdata.__main__")),
    ("public names", ("mmdata",)),
)  # fmt: skip


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _runs(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """False for an import inside `if TYPE_CHECKING:`."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return False
    return True


def import_graph() -> dict[str, set[str]]:
    known = modules()

    def nearest(name: str) -> str:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or not _runs(node, parents):
                continue
            if isinstance(node, ast.Import):
                targets |= {nearest(alias.name) for alias in node.names if alias.name.startswith("mmdata")}
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base == "mmdata" or base.startswith("mmdata."):
                targets |= {nearest(f"{base}.{alias.name}") for alias in node.names}
        graph[module] = targets - {module, ""}
    return graph


def stage_of(module: str) -> int:
    best, best_length = None, -1
    for position, (_, prefixes) in enumerate(STAGES):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = position, len(prefix)
    if best is None:
        raise AssertionError(f"{module} belongs to no stage: add its package to STAGES and docs/architecture.md")
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.slow
def test_no_module_imports_itself_back_through_others():
    assert cycles(import_graph()) == []


@pytest.mark.slow
def test_no_package_imports_from_a_stage_after_it():
    upward = [
        f"{module} ({STAGES[stage_of(module)][0]}) imports {target} ({STAGES[stage_of(target)][0]})"
        for module, targets in import_graph().items()
        for target in sorted(targets)
        if stage_of(target) > stage_of(module)
    ]
    assert upward == []


@pytest.mark.slow
def test_every_exception_class_is_defined_in_errors():
    elsewhere = []
    for module, path in modules().items():
        if module == "mmdata.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(base, ast.Name)
                and (base.id.endswith(("Error", "Exception")))
                or isinstance(base, ast.Attribute)
                and base.attr.endswith(("Error", "Exception"))
                for base in node.bases
            ):
                elsewhere.append(f"{module}.{node.name}")
    assert elsewhere == []


def test_every_error_is_a_mmdata_error_exported_by_mmdata_and_by_no_other_package():
    import inspect

    import mmdata
    import mmdata.errors
    import mmdata.loading

    errors = {
        name for name, value in vars(mmdata.errors).items() if inspect.isclass(value) and issubclass(value, Exception)
    }
    assert {name for name in errors if not issubclass(getattr(mmdata.errors, name), mmdata.MmdataError)} == set()
    assert errors - set(mmdata.__all__) == set(), "every error is importable from mmdata"
    assert errors & set(mmdata.loading.__all__) == set(), "and from mmdata.errors, not from a package besides"


def test_every_module_name_is_distinct():
    """Modules and packages alike: no two called `stats`, no module named like a package."""
    names: dict[str, list[str]] = {}
    for module in modules():
        if module != "mmdata" and not module.endswith("__main__"):
            names.setdefault(module.rpartition(".")[2], []).append(module)
    assert {name: found for name, found in names.items() if len(found) > 1} == {}


@pytest.mark.parametrize("cycle", [["a", "b"], ["a", "b", "c"]])
def test_the_cycle_finder_finds_a_loop(cycle):
    graph = {name: {cycle[(position + 1) % len(cycle)]} for position, name in enumerate(cycle)}
    graph["d"] = {"a"}
    assert cycles(graph) == [sorted(cycle)]


# Packages that sit side by side: each may import the stages before them, neither the other.
SIBLINGS = (("mmdata.conversion", "mmdata.editing"),)


@pytest.mark.parametrize(("one", "other"), SIBLINGS)
def test_conversion_and_editing_publish_through_the_stores_version_room_and_never_import_each_other(one, other):
    graph = import_graph()
    crossing = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        for mine, theirs in ((one, other), (other, one))
        if (module == mine or module.startswith(mine + ".")) and (target == theirs or target.startswith(theirs + "."))
    )
    assert not crossing, "; ".join(crossing)
