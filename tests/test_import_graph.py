"""The import graph of the workbench, read from the source (issue 41, item 1).

Every `import` and `from ... import` statement is read from the AST of every module, including the
ones inside functions (a function-level import hides a cycle from Python's import machinery, not
from the design), plus `importlib.import_module("literal")`. Dynamic imports whose name is computed
(the family and probe registries' `import_module(f"...{name}")`) are late binding by design and
are not edges. `if TYPE_CHECKING:` imports are edges too: a type-only dependency is still a
dependency of the design.

Three checks:

(a) no cycle between modules of workbench/, probes/, app/ (and the scripts of experiments/ and
    benchmarks/). Importing `a.b.c` runs `a/__init__.py` first, but that implicit edge to the
    parent package is not counted: a package's `__init__` that imports its own submodules (the
    families registry, `workbench.objectives`) is the ordinary way to build a package, not a
    cycle. An explicit `from a import name` is an edge to `a`.
(b) no upward import by the layer order `LAYERS` below (a module may import its own layer and the
    layers below it, never one above).
(c) no private name (one leading underscore, not a dunder) taken from another module: neither
    `from m import _name` nor `m._name` on a module bound by an import, in workbench/, probes/, app/,
    experiments/ and benchmarks/; tests may use their own helpers under tests/ by public names only
    (tests reaching into a library module's private name to test it is allowed).

A failure lists every offence, one per line, with the file and line that makes it.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workbench", "probes", "app", "bertology")
SCRIPT_DIRS = ("experiments", "benchmarks")

# The layer order, lowest first. A module belongs to the layer of the longest prefix that matches
# it (a prefix "m" matches "m" and "m.*"), so "workbench.drivers.finetune" is a driver, "workbench.running.models"
# the library. What an AST scan found (issue 41) and the direction kept:
# - the library (`workbench.*` but the drivers: model loading and running, checkpoints and their
#   identity, the results store, data, tokenization, families, objectives, compression primitives,
#   the cost records every checkpoint carries) imports no driver, no probe, nothing of app/;
# - the drivers train or transform models (pretraining, fine-tuning, distillation, the prune
#   sweep with its head-pruning curves and pretraining tickets, the PEFT sweep, shadow sets). None imports a
#   probe (the PEFT sweep's CKA is `workbench.geometry`, maths the probes share);
# - probes/ read what the library loads and the drivers wrote: the membership probe needs the
#   fine-tuning task's members and the shadow sets (`workbench.drivers.finetune`, `workbench.drivers.shadows`).
#   So the drivers sit BELOW the probes; a driver that wants to run a probe must go through app/ (or the
#   probes move below it and membership's driver reads move to the library);
# - app/ (the CLI and the Streamlit pages) drives everything; bertology/ (the Python API for
#   notebooks, issue 52) is the same layer: a facade over the drivers, probes and store that the CLI
#   could call, reading the figures of app/ (`app.figures.draw`), which never imports it back;
# - experiments/ and benchmarks/ are scripts at the top: nothing imports them but other scripts.
DRIVERS = ("workbench.drivers",)  # the package: spec, executor, train, finetune, distill, ... (its docstring)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("library", ("workbench",)),
    ("drivers", DRIVERS),
    ("probes", ("probes",)),
    ("app", ("app", "bertology")),
    ("scripts", ("experiments", "benchmarks")),
)

# Coordinator-owned files (issue 42) this slice may not edit. An offence in them is still reported
# (never silently allowed); the failure message names them so the owner can fix them.
COORDINATOR_OWNED = (
    "benchmarks/bench_real_probe.py",
    "probes/core/fitting.py",
    "probes/syntax/structural.py",
    "probes/syntax/tasks.py",
    "probes/syntax/settings.py",
    "workbench/activations.py",
)


@dataclass(frozen=True)
class Module:
    name: str  # dotted name: "workbench.running.models", "benchmarks.bench_train", "experiments.prune.x"
    path: Path
    is_package: bool  # an __init__.py
    script: bool  # under experiments/ or benchmarks/ (imported by bare name from its own folder)

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def discover() -> dict[str, Module]:
    """Every module of the project by dotted name (tests included, for check (c))."""
    modules: dict[str, Module] = {}
    for top in (*PACKAGES, "tests", *SCRIPT_DIRS):
        for path in sorted((ROOT / top).rglob("*.py")):
            if any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(ROOT).parts):
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join(parts)
            modules[name] = Module(name, path, is_package, top in SCRIPT_DIRS)
    return modules


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


@dataclass(frozen=True)
class PrivateUse:
    source: str
    target: str  # the module the private name belongs to
    name: str
    line: int


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Reader:
    """The edges and private-name uses of one module."""

    def __init__(self, module: Module, modules: dict[str, Module]):
        self.module, self.modules = module, modules
        self.edges: list[Edge] = []
        self.private: list[PrivateUse] = []
        self.bound: dict[str, str] = {}  # local name -> internal module it is bound to
        self.unreadable: str | None = None

    def resolve(self, dotted: str, level: int = 0) -> str | None:
        """The internal module an import names, or None for a third-party/stdlib one."""
        if level:
            package = self.module.name.split(".")
            if not self.module.is_package:
                package = package[:-1]
            package = package[: len(package) - (level - 1)] if level > 1 else package
            dotted = ".".join([*package, dotted] if dotted else package)
        if self.module.script or self.module.name.startswith("tests"):
            # Scripts import the scripts beside them by bare name (their folder is on sys.path);
            # tests put benchmarks/ on sys.path to import a benchmark.
            folders = [self.module.name.rsplit(".", 1)[0]]
            if self.module.name.startswith("tests"):
                folders.append("benchmarks")
            for folder in folders:
                candidate = f"{folder}.{dotted}"
                if candidate in self.modules and dotted.split(".")[0] not in (*PACKAGES, "tests"):
                    dotted = candidate
                    break
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):  # the deepest known module
            if ".".join(parts[:n]) in self.modules:
                return ".".join(parts[:n])
        return None

    def add_edge(self, target: str | None, line: int) -> None:
        if target is not None and target != self.module.name:
            self.edges.append(Edge(self.module.name, target, line))

    def add_private(self, target: str, name: str, line: int) -> None:
        if target != self.module.name and _is_private(name):
            self.private.append(PrivateUse(self.module.name, target, name, line))

    def read(self) -> None:
        try:
            tree = ast.parse(self.module.path.read_text(encoding="utf-8"), filename=str(self.module.path))
        except SyntaxError as e:  # reported by every check, never skipped silently
            self.unreadable = f"{self.module.rel}:{e.lineno}: cannot parse ({e.msg})"
            return
        nodes = list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self.resolve(alias.name)
                    if target is None:
                        continue
                    self.add_edge(target, node.lineno)
                    if alias.asname:
                        self.bound[alias.asname] = target
                    else:  # `import a.b.c` binds `a`
                        top = self.resolve(alias.name.split(".")[0])
                        if top is not None:
                            self.bound[alias.name.split(".")[0]] = top
            elif isinstance(node, ast.ImportFrom):
                base = self.resolve(node.module or "", node.level)
                if base is None:
                    continue
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in self.modules:
                        self.add_edge(submodule, node.lineno)
                        self.bound[alias.asname or alias.name] = submodule
                    else:
                        self.add_edge(base, node.lineno)
                        self.add_private(base, alias.name, node.lineno)
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str) and _call_name(node.func) == "import_module"):
                self.add_edge(self.resolve(node.args[0].value), node.lineno)
        for node in nodes:  # `module._name` on a module bound by an import
            if isinstance(node, ast.Attribute):
                chain = _attribute_chain(node)
                if chain is None or chain[0] not in self.bound:
                    continue
                target = self.bound[chain[0]]
                for attr in chain[1:]:
                    if f"{target}.{attr}" in self.modules:
                        target = f"{target}.{attr}"
                        continue
                    self.add_private(target, attr, node.lineno)
                    break


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    """["a", "b", "c"] for `a.b.c`; None when the chain does not start at a name (`f().x`). The inner
    chains of `a.b.c` (`a.b`) are read too; a private name found twice on a line is reported once."""
    chain = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        chain.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    chain.append(current.id)
    return chain[::-1]


@dataclass
class Graph:
    edges: list[Edge]
    private: list[PrivateUse]
    modules: dict[str, Module]
    unreadable: list[str]  # files that do not parse: every check fails on them


def read_all(modules: dict[str, Module] | None = None) -> Graph:
    modules = modules or discover()
    graph = Graph([], [], modules, [])
    for module in modules.values():
        reader = _Reader(module, modules)
        reader.read()
        graph.edges += reader.edges
        graph.private += {(p.target, p.name, p.line): p for p in reader.private}.values()
        if reader.unreadable:
            graph.unreadable.append(reader.unreadable)
    return graph


@functools.lru_cache(maxsize=1)
def project() -> Graph:
    """The project's graph, read once per test session."""
    return read_all()


def _graph_modules(modules: dict[str, Module]) -> set[str]:
    """The modules the cycle and layer checks cover (tests are not part of the design)."""
    return {name for name in modules if name.split(".")[0] in (*PACKAGES, *SCRIPT_DIRS)}


def cycles(edges: list[Edge], nodes: set[str]) -> list[list[str]]:
    """One shortest cycle through each strongly connected component with more than one module
    (Tarjan 1972), as a list of modules [a, b, ..., a]."""
    graph: dict[str, set[str]] = {n: set() for n in nodes}
    for e in edges:
        if e.source in nodes and e.target in nodes:
            graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0

    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    out = []
    for component in sorted(components, key=min):
        start = min(component)
        # breadth-first search inside the component for the shortest way from `start` back to it
        parents: dict[str, str] = {start: start}
        frontier, last = [start], None
        while last is None:
            following = []
            for node in frontier:
                if start in graph[node]:
                    last = node
                    break
                for succ in sorted(graph[node] & component):
                    if succ not in parents:
                        parents[succ] = node
                        following.append(succ)
            frontier = following
        path = [last]
        while path[-1] != start:
            path.append(parents[path[-1]])
        cycle = [*path[::-1], start]
        if len(component) > len(cycle) - 1:
            cycle.append(f"(one cycle of a component of {len(component)}: {', '.join(sorted(component))})")
        out.append(cycle)
    return out


def layer_of(name: str) -> int:
    """The rank in `LAYERS` of the longest prefix that matches `name` ("workbench.drivers.finetune" is a
    driver although "workbench" is the library)."""
    matches = [(len(p), rank) for rank, (_, prefixes) in enumerate(LAYERS) for p in prefixes
               if name == p or name.startswith(p + ".")]
    assert matches, f"{name} is in no layer"
    return max(matches)[1]


def upward_imports(edges: list[Edge], nodes: set[str]) -> list[Edge]:
    return [e for e in edges if e.source in nodes and e.target in nodes
            and layer_of(e.source) < layer_of(e.target)]


def _where(modules: dict[str, Module], name: str, line: int) -> str:
    rel = modules[name].rel
    owned = " [coordinator-owned file]" if rel in COORDINATOR_OWNED else ""
    return f"{rel}:{line}{owned}"


def _edge_lines(edges: list[Edge], source: str, target: str, modules) -> str:
    lines = sorted({e.line for e in edges if e.source == source and e.target == target})
    return f"{modules[source].rel}:{','.join(map(str, lines))}"


# --- the checks ------------------------------------------------------------------------------------


def test_no_import_cycle():
    g = project()
    report = list(g.unreadable)
    for cycle in cycles(g.edges, _graph_modules(g.modules)):
        hops = [m for m in cycle if not m.startswith("(")]
        where = "; ".join(_edge_lines(g.edges, a, b, g.modules) for a, b in zip(hops, hops[1:]))
        report.append(" -> ".join(cycle) + f"\n    at {where}")
    assert not report, "import cycles (imports inside functions count):\n" + "\n".join(report)


def test_no_upward_import():
    g = project()
    bad = upward_imports(g.edges, _graph_modules(g.modules))
    report = g.unreadable + sorted({
        f"{_where(g.modules, e.source, e.line)}: {e.source} ({LAYERS[layer_of(e.source)][0]}) imports "
        f"{e.target} ({LAYERS[layer_of(e.target)][0]})" for e in bad})
    assert not report, ("upward imports (layers, lowest first: "
                        + " < ".join(n for n, _ in LAYERS) + "):\n" + "\n".join(report))


def test_no_private_name_crosses_a_module():
    g = project()
    report = []
    for p in g.private:
        if p.source.split(".")[0] == "tests" and not p.target.startswith("tests"):
            continue  # a test may test a library module's private function
        defined = g.modules[p.target].rel
        owned = " [defined in a coordinator-owned file]" if defined in COORDINATOR_OWNED else ""
        report.append(f"{_where(g.modules, p.source, p.line)}: {p.target}.{p.name}{owned}")
    report = g.unreadable + sorted(report)
    assert not report, "private names imported from another module:\n" + "\n".join(report)


def test_every_declared_layer_prefix_names_a_module():
    """A module renamed or moved must take its layer entry along (a stale entry would silently put
    the new module in its package's layer)."""
    g = project()
    stale = [p for _, prefixes in LAYERS for p in prefixes
             if not any(m == p or m.startswith(p + ".") for m in g.modules)]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


# --- the checker checks itself, on planted modules -------------------------------------------------


def _planted(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    modules = {}
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        parts = list(Path(rel).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = Module(name, path, is_package, parts[0] in SCRIPT_DIRS)
    return modules


def test_checker_finds_a_cycle_behind_a_function_level_import(tmp_path):
    modules = _planted(tmp_path, {
        "workbench/__init__.py": "",
        "workbench/a.py": "from workbench.b import f\n",
        "workbench/b.py": "def f():\n    from workbench import c\n",
        "workbench/c.py": "def g():\n    import workbench.a as a\n    return a._hidden\n",
        "workbench/d.py": "from . import a\nfrom .b import f\n",
    })
    g = read_all(modules)
    edges, private = g.edges, g.private
    assert cycles(edges, set(modules)) == [["workbench.a", "workbench.b", "workbench.c", "workbench.a"]]
    assert [(p.source, p.target, p.name) for p in private] == [("workbench.c", "workbench.a", "_hidden")]
    assert {(e.source, e.target) for e in edges if e.source == "workbench.d"} == {
        ("workbench.d", "workbench.a"), ("workbench.d", "workbench.b")}


def test_checker_finds_upward_and_private_imports(tmp_path):
    modules = _planted(tmp_path, {
        "workbench/__init__.py": "",
        "workbench/running/models.py": "def f():\n    from probes.core import runner\n",
        "workbench/drivers/finetune.py": "from probes.core.statistics import t_interval\n",
        "workbench/drivers/train.py": "from workbench.running.models import load\n",
        "probes/__init__.py": "",
        "probes/core/__init__.py": "",
        "probes/core/runner.py": "from workbench.running.models import _quiet\n",
        "probes/core/statistics.py": "from workbench.drivers.finetune import members\n",
        "benchmarks/bench_a.py": "from bench_b import _helper\n",
        "benchmarks/bench_b.py": "",
    })
    g = read_all(modules)
    edges, private = g.edges, g.private
    up = {(e.source, e.target) for e in upward_imports(edges, set(modules))}
    # finetune is a driver: above the library, below the probes
    assert up == {("workbench.running.models", "probes.core.runner"), ("workbench.drivers.finetune", "probes.core.statistics")}
    assert {(p.source, p.target, p.name) for p in private} == {
        ("probes.core.runner", "workbench.running.models", "_quiet"), ("benchmarks.bench_a", "benchmarks.bench_b", "_helper")}
