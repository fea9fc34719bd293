"""The codebase's own rules: one module reads the environment, modules stay small, every import
goes down the declared floors (FLOORS), the coordinator and the workers import across no process
boundary, no import circle, no private attribute of rlt.control used outside it; the docs' sizes;
and the tests' own: tests/ mirrors rlt/, no test module imports another. Imports are read with
ast: every import statement, lazy ones too."""

import ast
import pathlib
import re

RLT = pathlib.Path(__file__).resolve().parent.parent / "rlt"
LONG_LINES = 406  # lines past 100 columns (strings, docstrings): lower it as they are wrapped


def test_only_envs_reads_the_environment():
    readers = [
        str(p.relative_to(RLT))
        for p in RLT.rglob("*.py")
        if p.name != "envs.py" and re.search(r"os\.environ|os\.getenv|getenv\(", p.read_text())
    ]
    assert readers == []


def test_no_module_over_350_lines():
    big = {
        str(p.relative_to(RLT)): n
        for p in RLT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 350
    }
    assert big == {}


def test_lines_past_100_columns_do_not_grow():
    """ruff formats code at 100 columns; what it cannot split (a string, a docstring's line) may
    run to 120 (E501), but their count only shrinks: new code stays within 100."""
    root = RLT.parent
    files = [p for d in ("rlt", "tests", "dev", "scripts") for p in (root / d).rglob("*.py")]
    long = sum(len(line) > 100 for p in files for line in p.read_text().splitlines())
    assert long <= LONG_LINES, (
        f"{long} lines past 100 columns (at most {LONG_LINES}): wrap the new ones"
    )


def test_docs_sized_for_reading():
    """docs/architecture.md stays the big picture (each package's docstring carries its own
    detail) and the README an introduction."""
    limits = {"docs/architecture.md": 250, "README.md": 150}
    sizes = {name: len((RLT.parent / name).read_text().splitlines()) for name in limits}
    assert {name: n for name, n in sizes.items() if n > limits[name]} == {}


def test_no_coordinator_module_over_300_lines():
    big = {
        str(p.relative_to(RLT)): n
        for p in (RLT / "control").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 300
    }
    assert big == {}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in RLT.rglob("*.py"):
        parts = p.relative_to(RLT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The rlt modules `name` imports (a package's name where no module of that name exists)."""

    def known(n: str) -> str:
        while n not in MODULES:
            n = n.rpartition(".")[0]
        return n

    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {known(a.name) for a in node.names if a.name.split(".")[0] == "rlt"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] == "rlt":
                out |= {
                    f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else known(base)
                    for a in node.names
                }
    return out - {name}


IMPORTS = {name: _imports(name) for name in MODULES}


# The house from the top floor down, as the processes meet: the front ends (the `rlt` command,
# rlt.bench, rlt.dynamo, the public API, rlt.serve), what they share (rlt.frontends), the
# coordinator (rlt.control) and the workers (rlt.workers), what those two agree on (rlt.contract),
# the model families and their kernels, and the ground every floor stands on. A module imports
# modules of its own place or of a place below it, never above: no arrow runs back up. A new
# package or top-level module takes its place here.
FLOORS = (
    "rlt.__main__",
    "rlt.cli",
    "rlt.bench",
    "rlt.dynamo",
    "rlt",  # rlt/__init__.py: the public API (Engine, SamplingParams, RequestOutput, errors)
    "rlt.serve",
    "rlt.frontends",
    "rlt.control",
    "rlt.workers",
    "rlt.contract",
    "rlt.models",
    "rlt.kernels",
    "rlt.errors",
    "rlt.envs",
)


def _place(name: str) -> str | None:
    """The entry of FLOORS that holds module `name` ("rlt" holds rlt/__init__.py alone)."""
    held = [p for p in FLOORS if name == p or (p != "rlt" and name.startswith(p + "."))]
    return max(held, key=len, default=None)


def test_every_module_has_a_floor():
    assert sorted(name for name in MODULES if _place(name) is None) == []


def test_every_import_goes_down_the_floors():
    """No module imports one of a place above its own (lazy imports too): the places' graph runs
    one way, so no circle can form between packages either."""
    floor = {p: i for i, p in enumerate(FLOORS)}
    up = sorted(
        f"{name} -> {dep}"
        for name, deps in IMPORTS.items()
        for dep in deps
        if _place(name) and _place(dep) and floor[_place(dep)] < floor[_place(name)]
    )
    assert up == []


def test_coordinator_and_workers_import_across_no_process_boundary():
    """The coordinator (rlt.control, and rlt.serve on it) never imports the workers' package, nor a
    worker module the coordinator's: what both need lives outside both (rlt.contract, rlt.models,
    rlt.errors, rlt.envs)."""
    crossing = sorted(
        f"{name} -> {dep}"
        for name, deps in IMPORTS.items()
        for dep in deps
        if (name.startswith(("rlt.control", "rlt.serve")) and dep.startswith("rlt.workers"))
        or (name.startswith("rlt.workers") and dep.startswith("rlt.control"))
    )
    assert crossing == []


def test_no_import_circle():
    """No two rlt modules import each other, directly or through others (Tarjan's strongly
    connected components of the import graph)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in IMPORTS[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
                on_stack.discard(part[-1])
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(IMPORTS):
        if v not in index:
            visit(v)
    assert circles == []


def test_no_private_attribute_of_control_outside_it():
    """Outside rlt.control, no module reaches into it: no `x._name` where rlt.control defines
    `_name` (an attribute or a method), no private name imported from it."""
    control = [p for name, p in MODULES.items() if name.startswith("rlt.control")]
    private = set()
    for p in control:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "_"
            ):
                private.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and isinstance(node.ctx, ast.Store)
            ):
                private.add(node.attr)
    private = {n for n in private if not (n.startswith("__") and n.endswith("__"))}
    uses = []
    for name, p in MODULES.items():
        if name.startswith("rlt.control"):
            continue
        tree = ast.parse(p.read_text())
        modules = {
            (a.asname or a.name)
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for a in n.names
        }
        own = {"self", "cls"} | modules
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                # (its own objects' and modules' such as os._exit are not rlt.control's)
                if owner not in own:
                    uses.append(f"{name}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlt.control"):
                uses += [
                    f"{name}:{node.lineno} {a.name}" for a in node.names if a.name.startswith("_")
                ]
    assert uses == []


def test_no_module_level_kernel_switch():
    """A worker's kernels are chosen once, by its backend (rlt/workers/backend.py), and handed to
    its model: no module holds a kernel switch (the old rlt/kernels/mode.py), and no kernel, model
    or worker module rebinds a module global."""
    assert not (RLT / "kernels" / "mode.py").exists()
    rebinding = []
    for name, p in MODULES.items():
        if not name.startswith(("rlt.kernels", "rlt.models", "rlt.workers")):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Global):
                rebinding.append(f"{name}:{node.lineno} global {', '.join(node.names)}")
    assert rebinding == []


TESTS = pathlib.Path(__file__).resolve().parent


def test_no_test_module_imports_another():
    """What test modules share lives in conftest.py fixtures and helper modules (tests/helpers.py,
    tests/<folder>/helpers.py, ...): no module of tests/ imports a test_*.py module."""
    found = []
    for p in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if any(part.startswith("test_") for n in names for part in n.split(".")):
                found.append(f"{p.relative_to(TESTS)}:{node.lineno}")
    assert found == []


def test_test_folders_mirror_the_package():
    """tests/<folder>/ holds the tests of rlt/<folder>/ (the top: rlt's own modules and the
    whole)."""
    folders = {p.parent.name for p in TESTS.rglob("test_*.py") if p.parent != TESTS}
    assert sorted(f for f in folders if not (RLT / f).is_dir()) == []
