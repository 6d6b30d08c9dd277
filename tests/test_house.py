"""The house's shape, read from the source: imports go one way, and no module reaches into another
object's private (underscore) state. Parsed with ast, so nothing is imported or run."""
import ast

from conftest import ROOT

MODULES = {p.stem: p for p in sorted(ROOT.glob("*.py"))}

# Underscore names that are public by convention of the standard library or a dependency, not
# another object's private state: namedtuple's API is underscored so it cannot clash with a field;
# os._exit is the documented exit without clean-up; docker-py's exec_start(socket=True) hands back
# a SocketIO whose raw socket, `_sock`, is the documented way to write to the exec and select on it.
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit", "_sock"}


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


def private_reads(path) -> list[str]:
    """`x._name` in `path` where x is not self or cls: another object's private state. A module's
    own underscore names are used bare, so any attribute access to one crosses a boundary."""
    out = []
    for node in ast.walk(_tree(path)):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__") or node.attr in PUBLIC_UNDERSCORE:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        out.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_private_reads_are_found():
    src = "class A:\n    def f(self, o):\n        return self._a, o._b, o.__class__, t._replace(x=1)\n"
    tmp = ROOT / "tests" / "fixtures"
    path = tmp / "_house_probe.py"
    path.write_text(src)
    try:
        assert private_reads(path) == ["_house_probe.py:3: o._b"]
    finally:
        path.unlink()


def test_no_module_reads_another_objects_private_state():
    reads = [r for p in MODULES.values() for r in private_reads(p)]
    assert not reads, "private state read from outside its class:\n" + "\n".join(reads)


def oversized(path) -> list[str]:
    """What in `path` is over the house's sizes: the file 800 lines, a class 300, a function 100."""
    src = path.read_text()
    out = [f"{path.name}: {n} lines" for n in [len(src.splitlines())] if n > 800]
    for node in ast.walk(ast.parse(src)):
        size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
        limit = 300 if isinstance(node, ast.ClassDef) else 100
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and size > limit:
            out.append(f"{path.name}:{node.lineno}: {node.name} is {size} lines (at most {limit})")
    return out


def test_files_classes_and_functions_keep_their_sizes():
    big = [o for p in MODULES.values() for o in oversized(p)]
    assert not big, "split by responsibility:\n" + "\n".join(big)
