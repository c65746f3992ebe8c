"""No import circle among the project's own modules, and no import from a lower layer into a higher
one, read from the source with `ast`.

Every import counts, at module level and inside functions: an import inside a function
still runs, and a circle through one still trips whoever moves it to the top. Only the
body of an `if TYPE_CHECKING:` block is left out (lossspike/backtest/labels.py names the backtest's
type there), since it never runs. Importing lossspike.a.b also runs lossspike/a/__init__.py;
that edge is not drawn, so a package's __init__ may import its own submodules.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

PACKAGE = "lossspike"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def _module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` loads: itself, or the nearest enclosing one (a name inside it)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, dict[str, int]]:
    """Each project module -> the project modules it imports, with the line of the first such import."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from a import b` loads a.b when b is a module, else a (b is a name inside it).
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != module:
                    edges.setdefault(resolved, node.lineno)
        graph[module] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan), each starting where it closes."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, {})):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_circle_in(group, graph) for group in groups]


def _circle_in(group: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """A shortest circle from the group's first module back to it, inside the group (breadth first)."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target not in members:
                    continue
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle in the strongly connected group {group}")


def _describe(circle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [
        f"{a} -> {b} (line {graph[a][b]} of {_modules()[a].relative_to(ROOT.parent)})"
        for a, b in itertools.pairwise(circle)
    ]
    return "\n  ".join(steps)


def test_the_projects_own_modules_import_no_circle():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import circle(s):\n  " + "\n\n  ".join(_describe(circle, graph) for circle in cycles)


def test_the_graph_sees_imports_at_module_level_and_inside_functions():
    graph = import_graph()
    # Module level: `from lossspike.stores.store import ...` in the DuckDB store.
    assert "lossspike.stores.store" in graph["lossspike.stores.duckdb"]
    # Inside a function: the factory imports each store where it opens it.
    assert {"lossspike.stores.duckdb", "lossspike.stores.bigquery"} <= set(graph["lossspike.stores.open"])
    # `from lossspike.judge import minutes` names a module, not the package.
    assert "lossspike.judge.minutes" in graph["lossspike.evaluation.evaluate"]
    # The type-only import in labels' `if TYPE_CHECKING:` block never runs.
    assert "lossspike.backtest.run" not in graph["lossspike.backtest.labels"]


def test_a_planted_circle_is_found_and_printed_in_order():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}, "e": {"e": 5}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]


# The package's layers, lowest first (docs/architecture.md): a module may import its own layer and
# any below it, never one above. Each is a folder of lossspike/, but for the Levanter tracker, a
# top-level module because users import it by that name.
LAYERS = (
    "base",  # schemas, times, deadlines, errors: imports nothing of lossspike
    "rules",  # the rule, the checks, the phase, in plain Python
    "sql",  # the statements, dialects as data
    "publish",  # the training side: needs only the row's schema and the dialects
    "judge",  # the minute layer, the detectors, the seed verdicts
    "config",  # settings and overrides
    "stores",  # DuckDB and BigQuery behind one interface
    "evaluation",  # one tick
    "backtest",  # ticks replayed over history
    "cost",  # what the statements bill
    "ingest",  # loading history
    "cloud",  # the Cloud Function and Cloud Monitoring
    "cli",  # the command line, the demo, the plot
    "levanter_tracker",  # Levanter's tracker, on top of publish
)


def layer_of(module: str) -> int | None:
    """The layer's rank of a project module; None for the package's own __init__."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    assert parts[1] in LAYERS, f"{module} is in no layer: add its folder to LAYERS and docs/architecture.md"
    return LAYERS.index(parts[1])


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import from a lower layer into a higher one, as `a -> b (line N)`."""
    found = []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            low, high = layer_of(module), layer_of(target)
            if low is not None and high is not None and high > low:
                found.append(f"{module} ({LAYERS[low]}) -> {target} ({LAYERS[high]}), line {line}")
    return found


def test_no_module_imports_a_layer_above_its_own():
    upward = upward_imports(import_graph())
    assert not upward, "imports into a higher layer:\n  " + "\n  ".join(upward)


def test_a_planted_upward_import_is_found():
    graph = {"lossspike.base.times": {"lossspike.config.settings": 7}, "lossspike.config.settings": {}}
    assert upward_imports(graph) == ["lossspike.base.times (base) -> lossspike.config.settings (config), line 7"]


def test_the_top_level_holds_the_layers_as_folders():
    top = {p.name for p in ROOT.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert top == {"__init__.py", "levanter_tracker.py", *(name for name in LAYERS if name != "levanter_tracker")}
