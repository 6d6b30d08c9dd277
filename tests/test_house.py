"""The house's shape, read from the source: imports go one way. Parsed with ast, so nothing is imported
or run."""
import ast

from conftest import ROOT

MODULES = {p.stem: p for p in sorted(ROOT.glob("*.py"))}


def _tree(path):
    return ast.parse(path.read_text(), filename=str(path))


def imported_modules(path) -> set[str]:
    """The top-level modules of this repository that `path` imports anywhere: at module level or
    inside a function, by `import x` or `from x import y`."""
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        out |= {n.split(".")[0] for n in names if n.split(".")[0] in MODULES}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_find_cycle_names_the_modules_of_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"x"}}) == ["x", "x"]


def test_imports_go_one_way():
    graph = {m: imported_modules(p) - {m} for m, p in MODULES.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    assert not [m for m, deps in graph.items() if "train" in deps], "train.py is the top: nothing imports it"
