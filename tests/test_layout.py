"""The package layout's dependency rules, read from the source with `ast` (every import, function-local ones too).

predictor imports only predictor; calibrate, sim and microbench import predictor; validate imports predictor,
sim and calibrate; cli imports everything. The top-level package `kernelsight` (folder api/, the Python API)
imports predictor, sim and calibrate, and only inside functions, so `import kernelsight.predictor` stays
light. Only cli imports hydra or omegaconf. No two modules import each other, directly or through others.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = "kernelsight"
ALLOWED = {
    "predictor": {"predictor"},
    "calibrate": {"predictor", "calibrate"},
    "sim": {"predictor", "sim"},
    "microbench": {"predictor", "microbench"},
    "validate": {"predictor", "sim", "calibrate", "validate"},
    "cli": {"predictor", "calibrate", "sim", "microbench", "validate", "cli"},
    "api": {"predictor", "sim", "calibrate", "api"},
}
TOP = "api"  # the folder installed as `kernelsight` itself (setup.py)
CONFIG_FRAMEWORKS = {"hydra", "omegaconf"}


def module_files() -> dict[str, Path]:
    """kernelsight.<package>.<module> -> its file, for every package in ALLOWED."""
    out = {}
    for package in ALLOWED:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if package == TOP:
                parts = parts[1:]
            if parts[-1:] == ("__init__",):
                parts = parts[:-1]
            out[".".join((ROOT, *parts))] = path
    return out


MODULES = module_files()


def imports(module: str, source: str, is_package: bool) -> set[str]:
    """Absolute names of everything `source` imports, anywhere in the file; `from X import Y` names X.Y when
    that is a module of ours, else X."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return found


def graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules of ours (and third-party top-level names) it imports."""
    return {m: imports(m, text, MODULES[m].name == "__init__.py") for m, text in sources.items()}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != ROOT:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED and parts[1] != TOP else TOP


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Forbidden arrows between packages and config-framework imports outside cli."""
    out = []
    for module, targets in edges.items():
        source = package_of(module)
        for target in sorted(targets):
            top = target.split(".")[0]
            if top in CONFIG_FRAMEWORKS and source != "cli":
                out.append(f"{module} imports {target}: only cli/ may use the config framework")
            dest = package_of(target)
            if top == ROOT and dest is not None and dest not in ALLOWED[source]:
                out.append(f"{module} imports {target}: {source} may import only {sorted(ALLOWED[source])}")
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles among our modules (each reported once, by its strongly connected component)."""
    ours = {m: sorted(t for t in targets if t in edges and t != m) for m, targets in edges.items()}
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in ours[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(ours):
        if node not in index:
            visit(node)
    return out


@pytest.fixture(scope="module")
def edges():
    return graph({m: p.read_text(encoding="utf-8") for m, p in MODULES.items()})


def test_every_package_is_found():
    assert {package_of(m) for m in MODULES} == set(ALLOWED)
    assert "kernelsight.cli" in MODULES and "kernelsight.validate.score" in MODULES
    assert MODULES["kernelsight"] == REPO / TOP / "__init__.py"


def test_dependencies_point_one_way_and_only_cli_knows_the_config_framework(edges):
    assert violations(edges) == []


def test_no_import_cycles(edges):
    assert cycles(edges) == []


@pytest.mark.parametrize("module, line, problem", [
    ("kernelsight.predictor.roofline", "from kernelsight.sim.graph import KernelCall", "predictor may import only"),
    ("kernelsight.sim.engine", "def f():\n    from kernelsight.calibrate import models", "sim may import only"),
    ("kernelsight.microbench.serving", "from kernelsight.sim.workload import Workload", "microbench may import only"),
    ("kernelsight.validate.score", "from kernelsight.microbench import planning", "validate may import only"),
    ("kernelsight.calibrate.rows", "import omegaconf", "only cli/ may use"),
    ("kernelsight.sim.run", "def f():\n    from hydra.core.hydra_config import HydraConfig", "only cli/ may use"),
    ("kernelsight", "def f():\n    from kernelsight.validate import score", "api may import only"),
    ("kernelsight", "def f():\n    from kernelsight.cli import main", "api may import only"),
])
def test_a_forbidden_import_is_caught(edges, module, line, problem):
    changed = dict(edges)
    changed[module] = edges[module] | imports(module, line, False)
    assert any(problem in v for v in violations(changed))


def test_the_top_level_package_imports_the_library_only_inside_functions():
    """`import kernelsight` (which every `import kernelsight.x` runs first) must import nothing of ours."""
    for module, path in MODULES.items():
        if package_of(module) != TOP:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module != "__future__" or isinstance(node, ast.Import):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n and n.split(".")[0] == ROOT for n in names) and not getattr(node, "level", 0), \
                    f"{module}: module-level import of {names}"


def test_a_cycle_is_caught(edges):
    changed = dict(edges)
    back = imports("kernelsight.microbench.collectives", "def f():\n    from .planning import build_plan", False)
    changed["kernelsight.microbench.collectives"] = edges["kernelsight.microbench.collectives"] | back
    assert ["kernelsight.microbench.collectives", "kernelsight.microbench.planning"] in cycles(changed)
    relative = imports("kernelsight.validate", "from .score import score", True)
    assert relative == {"kernelsight.validate.score"}
