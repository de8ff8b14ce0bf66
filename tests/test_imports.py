"""The package has no import cycle, counting the imports inside functions too.

A function-level import hides a cycle from Python (it runs after both
modules are loaded) but not from a reader: the two modules still need each
other.  The graph is read from the source with :mod:`ast`, so every
``import`` statement counts, wherever it stands.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

import dgemm

PACKAGE_DIR = Path(dgemm.__file__).resolve().parent


def modules_of(package_dir: Path) -> dict[str, Path]:
    """``{dotted name: path}`` of every module of the package in ``package_dir`` (packages by their ``__init__``)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def ancestors(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imported(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """``(module, line)`` of every module of the package that module ``name`` imports, at any level."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the module's package, up level - 1 more
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:   # ``from pkg import submodule`` imports the submodule
                sub = f"{base}.{alias.name}"
                out.append((sub if sub in modules else base, node.lineno))
    return [(target, line) for target, line in out if target in modules]


def import_graph(package_dir: Path) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` within the package in ``package_dir``.

    Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``: an
    edge goes to each such package too, except those the importing module
    lies in (Python has run them before it).  The root package is no node:
    it is every module's parent, run before any of them.
    """
    modules = modules_of(package_dir)
    root = package_dir.name
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        own = set(ancestors(name))
        edges = graph.setdefault(name, {})
        for target, line in imported(name, path, modules):
            for t in [*(a for a in ancestors(target) if a not in own), target]:
                if t not in (name, root):
                    edges.setdefault(t, line)
    return graph


def knots(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """The strongly connected components of more than one module: each module of one reaches every other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v):   # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle (``[a, b, ..., a]``) per knot (:func:`knots`)."""
    return [_shortest_cycle(graph, c) for c in knots(graph)]


def _shortest_cycle(graph, component: set[str]) -> list[str]:
    best = None
    for start in sorted(component):
        came = {start: None}
        queue = deque([start])
        while queue:
            v = queue.popleft()
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while came[path[-1]] is not None:
                        path.append(came[path[-1]])
                    path = [*reversed(path), start]
                    if best is None or len(path) < len(best):
                        best = path
                    queue.clear()
                    break
                if w in component and w not in came:
                    came[w] = v
                    queue.append(w)
    return best


def describe(graph, cycle: list[str]) -> str:
    """``a -> b (a:12) -> a (b:3)``: each edge with the line of the import."""
    return cycle[0] + "".join(f" -> {b} ({a}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE_DIR)
    assert len(graph) > 30 and "dgemm.names" in graph["dgemm.worker.state"]   # the graph was read
    found = knots(graph)
    assert not found, "import cycles (module -> imported module (importer:line)):\n" + "\n".join(
        f"{describe(graph, _shortest_cycle(graph, k))}\n    (all of {', '.join(sorted(k))} import each other)"
        for k in found)


# -- layers: no arrow runs back up ----------------------------------------------------
# The package's layers, lowest first: a module imports from its own package and from lower layers only,
# never from a sibling package of its layer (storage and opencl know nothing of each other) nor from
# above.  The leaves may import each other (the cycle check still holds them).  README.md's tree names them.
LAYERS = (
    ("leaves", ("errors", "config", "names", "dtypes", "sizes", "busy", "accuracy", "provenance", "metrics")),
    ("storage and devices", ("storage", "opencl")),
    ("the scheduler's plugins", ("scheduler",)),
    ("workers and the tuner", ("worker", "tuning")),
    ("clusters", ("cluster",)),
    ("the client", ("client",)),
    ("the public face, benchmarks and batch systems", ("api", "benchmarks", "deploy")),
    ("the command line", ("cli", "dashboard")),
    ("python -m dgemm", ("__main__",)),
)
OPEN_LAYERS = {"leaves"}


def layer_of(module: str) -> tuple[int, str, str]:
    """``(layer index, layer name, top package)`` of ``dgemm.<top>...``."""
    top = module.split(".")[1]
    for i, (name, tops) in enumerate(LAYERS):
        if top in tops:
            return i, name, top
    raise KeyError(f"{module} is in no layer: add dgemm.{top} to LAYERS (and to README.md's tree)")


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a module from a higher layer, or from a sibling package of its own layer."""
    out = []
    for module, edges in sorted(graph.items()):
        if module.count(".") == 0:
            continue
        mine, layer, top = layer_of(module)
        for target, line in sorted(edges.items()):
            theirs, their_layer, their_top = layer_of(target)
            if theirs > mine or (theirs == mine and their_top != top and layer not in OPEN_LAYERS):
                out.append(f"{module}:{line} ({layer}) imports {target} ({their_layer})")
    return out


def test_no_module_imports_from_a_layer_above_its_own():
    graph = import_graph(PACKAGE_DIR)
    assert {m.split(".")[1] for m in graph if "." in m} <= {t for _, tops in LAYERS for t in tops}
    found = upward_imports(graph)
    assert not found, "imports that run back up (or across) the layers:\n" + "\n".join(found)


def test_the_layer_check_sees_an_import_that_runs_back_up(tmp_path):
    pkg = write(tmp_path, {"dgemm/__init__.py": "",
                           "dgemm/sizes.py": "",
                           "dgemm/storage/__init__.py": "def f():\n    from dgemm.worker import x\n",
                           "dgemm/opencl/__init__.py": "from dgemm import storage\nfrom dgemm import sizes\n",
                           "dgemm/worker/__init__.py": "from dgemm.storage import f\nx = 1\n"})
    assert upward_imports(import_graph(pkg)) == [
        "dgemm.opencl:1 (storage and devices) imports dgemm.storage (storage and devices)",
        "dgemm.storage:2 (storage and devices) imports dgemm.worker (workers and the tuner)"]


def test_no_module_is_over_700_lines():
    long = {str(p.relative_to(PACKAGE_DIR)): n for p in PACKAGE_DIR.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 700}
    assert not long, f"modules over 700 lines (split them by what they hold): {long}"


# -- the checker itself, on tiny packages ------------------------------------------
def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / next(iter(files)).split("/")[0]


def test_a_cycle_through_a_function_level_relative_import_is_found(tmp_path):
    pkg = write(tmp_path, {"fake/__init__.py": "",
                           "fake/a.py": "from fake import b\n",
                           "fake/sub/__init__.py": "",
                           "fake/sub/c.py": "import os\n\ndef f():\n    from .. import a\n",
                           "fake/b.py": "def g():\n    from .sub.c import f\n"})
    graph = import_graph(pkg)
    assert graph["fake.sub.c"] == {"fake.a": 4}
    assert graph["fake.b"] == {"fake.sub": 2, "fake.sub.c": 2}
    [cycle] = cycles(graph)
    assert describe(graph, cycle) == "fake.a -> fake.b (fake.a:1) -> fake.sub.c (fake.b:2) -> fake.a (fake.sub.c:4)"


def test_importing_a_submodule_runs_its_packages(tmp_path):
    """``import fake.sub.d`` runs ``fake/sub/__init__``, which imports the importer: a cycle."""
    pkg = write(tmp_path, {"fake/__init__.py": "from fake import c\n",
                           "fake/c.py": "def f():\n    import fake.sub.d\n",
                           "fake/sub/__init__.py": "from fake.c import f\n",
                           "fake/sub/d.py": "from fake.sub import e\nfrom . import e\n",
                           "fake/sub/e.py": ""})
    graph = import_graph(pkg)
    assert graph["fake.c"] == {"fake.sub": 2, "fake.sub.d": 2}
    # its own package, and the root package, are no edges; the submodule is
    assert graph["fake.sub.d"] == {"fake.sub.e": 1}
    assert graph["fake"] == {"fake.c": 1}
    [cycle] = cycles(graph)
    assert describe(graph, cycle) == "fake.c -> fake.sub (fake.c:2) -> fake.c (fake.sub:1)"


def test_no_cycle_no_report(tmp_path):
    pkg = write(tmp_path, {"fake/__init__.py": "from fake.a import x\n",
                           "fake/a.py": "import fake\nx = 1\n",    # the root package: no node
                           "fake/b.py": "from fake import a\n"})
    assert cycles(import_graph(pkg)) == []


# -- importing the package is cheap ------------------------------------------------
HEAVY = ("distributed", "dask", "zarr", "numcodecs", "pyopencl", "numpy", "xarray")


def fresh_modules(code: str):
    """Run ``code`` in a new interpreter; what it prints last (a JSON value)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_dgemm_imports_none_of_its_dependencies():
    """``import dgemm`` in a fresh process leaves Dask, distributed, Zarr, pyopencl and numpy unimported, and
    ``from dgemm import matmul`` (etc.) imports no distributed, Zarr or pyopencl: a script pays for them when
    it calls, and a local cluster's worker processes, which import the script again, not at all."""
    bare = fresh_modules(f"import json, sys\nimport dgemm\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert bare == [], f"import dgemm imported {bare}"
    # the public names the way scripts import them: still no cluster, store or device library
    named = fresh_modules(
        "import json, sys\nfrom dgemm import matmul, gemm, open_result, OutputBusyError, IncompleteResultError\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert not {"distributed", "zarr", "pyopencl"} & set(named), f"the public names imported {named}"


def test_the_public_names_resolve_as_before():
    """Every name of ``dgemm.__all__`` (and the submodules) is there on first use, the same objects as their
    modules'; ``dir`` lists them; an unknown name is an AttributeError."""
    import dgemm.api
    import dgemm.storage.lease

    for name in dgemm.__all__:
        assert name in dir(dgemm)
        assert getattr(dgemm, name) is not None
    assert dgemm.matmul is dgemm.api.matmul and dgemm.OutputBusyError is dgemm.storage.lease.OutputBusyError
    assert dgemm.config.get("worker-timeout") > 0          # a submodule, imported on first use
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        dgemm.no_such_name
    names = fresh_modules("import json, dgemm\nfrom dgemm import *\n"
                          "print(json.dumps(sorted(n for n in dgemm.__all__ if n in globals())))")
    assert names == sorted(dgemm.__all__)
