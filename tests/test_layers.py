"""Imports go one way: config -> engine (models, data, engine) -> telemetry -> recipes -> ui,
with the CLI on top. Checked on the source, so a lazy import inside a function counts too."""
import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "workbench"
LAYER = {"config": 0, "presets": 0, "models": 1, "data": 1, "plan": 1, "engine": 1, "distributed": 1,
         "calibrate": 2, "telemetry": 2, "recipes": 3, "ui": 4, "cli": 5, "cli_sweep": 5,
         "__main__": 5, "__init__": 0}


def _layer(module: str) -> int:
    return LAYER[module.split(".")[1] if "." in module else "__init__"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_imports_go_one_way():
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        here = _layer(".".join(rel.parts))
        for mod in _imports(path):
            if mod.startswith("workbench.") and _layer(mod) > here:
                bad.append(f"{rel} (layer {here}) imports {mod} (layer {_layer(mod)})")
    assert not bad, "\n".join(bad)


def test_engine_and_telemetry_never_touch_ui_packages():
    for sub in ("engine", "models", "data", "telemetry", "recipes"):
        for path in (PKG / sub).rglob("*.py"):
            mods = _imports(path)
            assert not {m for m in mods if m.split(".")[0] in ("ipywidgets", "plotly", "anywidget")}, path


def _module_graph() -> dict[str, set[str]]:
    """workbench module -> the workbench modules it imports (anywhere in the file)."""
    def name(path: Path) -> str:
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    mods = {name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for mod, path in mods.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module in mods:
                # "from workbench.engine import philox" imports the submodule
                out.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods
                           else node.module for a in node.names)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in mods)
        graph[mod] = out - {mod}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(part) > 1:
                found.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _circles(_module_graph()) == []


def test_circle_check_sees_a_circle():
    graph = _module_graph()
    graph["workbench.plan.planner"] = graph["workbench.plan.planner"] | {"workbench.plan.fit"}
    assert ["workbench.plan.fit", "workbench.plan.planner"] in _circles(graph)


NVML_PROBE = """
import pynvml
calls = []
pynvml.nvmlInit = lambda *a, **k: calls.append("nvmlInit")  # recorded, never run
import workbench.cli, workbench.recipes.train, workbench.engine.zo.offload, workbench.plan.planner
import workbench.telemetry.sampler as sampler
bad = [m for m in ("ipywidgets", "plotly", "anywidget") if m in __import__("sys").modules]
print(bad, len(calls))
sampler.Sampler(hz=0.0).static_info()  # a sampler is what opens NVML: the probe sees it
print(len(calls))
"""


def test_importing_the_engine_loads_no_ui_and_no_nvml():
    r = subprocess.run([sys.executable, "-c", NVML_PROBE], capture_output=True, text=True,
                       timeout=120, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr
    imported, started = r.stdout.strip().splitlines()
    assert imported == "[] 0"  # no UI package, and NVML not initialised by any import
    assert int(started) >= 1  # ... while the probe does see a sampler initialise it
