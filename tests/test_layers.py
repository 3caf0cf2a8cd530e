"""Imports go one way: every package of ``workbench`` on its own floor, lowest first (presets ->
config -> models -> data -> plan -> engine -> distributed -> calibrate -> telemetry -> runs ->
export -> recipes -> ui -> cli), and inside ``engine/`` every sub-room on its own floor too (random
numbers and device primitives at the bottom, the methods at the top). Checked on the source,
every form of import (``import workbench.x``, ``from workbench import x``, ``from workbench.x
import y``, relative ones) wherever it stands, so a lazy import inside a function counts too;
and each form is shown to be caught."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "workbench"
#: The packages, lowest first; a module may import its own package and those below.
ORDER = [("presets", "__init__"), ("config",), ("models",), ("data",), ("plan",), ("engine",),
         ("distributed",), ("calibrate",), ("telemetry",), ("runs",), ("export",), ("recipes",),
         ("ui",), ("cli", "__main__")]
LAYER = {name: level for level, names in enumerate(ORDER) for name in names}
#: The rooms inside ``engine/``, lowest first (a module of the room ``engine.x`` is
#: ``engine/x.py`` or anything in ``engine/x/``); ``engine`` itself (build_engine) is the top.
ENGINE_ORDER = [("rng", "device", "events", "precision", "groups", "kernels"),
                ("timing", "objective", "codecs"), ("storage", "checkpoint"), ("protocol",),
                ("zo",), ("peft", "snapshots", "whole"), ("stream", "warmup"), ("fo",),
                ("methods",), ("",)]
ENGINE_LAYER = {name: level for level, names in enumerate(ENGINE_ORDER) for name in names}


def _module(path: Path) -> str:
    """workbench.x.y for a file (a package's ``__init__`` is the package)."""
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


MODULES = {_module(p) for p in PKG.rglob("*.py")}


def _layer(module: str) -> tuple[int, int]:
    """The floor of a workbench module: its package (the first name under ``workbench``) and,
    inside ``engine/``, its room (the second name)."""
    parts = module.split(".")
    package = LAYER[parts[1] if len(parts) > 1 else "__init__"]
    if parts[1:2] != ["engine"]:
        return package, 0
    return package, ENGINE_LAYER[parts[2] if len(parts) > 2 else ""]


def _imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, anywhere in it: a ``from
    package import name`` counts as the submodule ``package.name`` where one exists, and a
    relative import is resolved against ``module``."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x / from ..y import z
                here = module.split(".")[:len(module.split(".")) - node.level + is_package]
                base = ".".join(here + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in MODULES else base)
    return out


def _upward(module: str, source: str, is_package: bool = False) -> list[str]:
    here = _layer(module)
    return [f"{module} (layer {here}) imports {m} (layer {_layer(m)})"
            for m in sorted(_imports(source, module, is_package))
            if m.split(".")[0] == "workbench" and _layer(m) > here]


def test_imports_go_one_way():
    bad = []
    for path in PKG.rglob("*.py"):
        bad += _upward(_module(path), path.read_text(), path.name == "__init__.py")
    assert not bad, "\n".join(bad)


def test_every_room_has_a_layer():
    rooms = {p.relative_to(PKG).parts[0].removesuffix(".py") for p in PKG.iterdir()
             if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert rooms <= set(LAYER), sorted(rooms - set(LAYER))
    engine = {p.relative_to(PKG / "engine").parts[0].removesuffix(".py")
              for p in (PKG / "engine").iterdir()
              if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    assert engine <= set(ENGINE_LAYER), sorted(engine - set(ENGINE_LAYER))
    assert _layer("workbench.plan.placement") < _layer("workbench.engine.rng.philox") \
        < _layer("workbench.engine.zo.step") < _layer("workbench.engine.methods.fo_offload") \
        < _layer("workbench.calibrate.fo") < _layer("workbench.runs.rundir") \
        < _layer("workbench.export.source") < _layer("workbench.recipes.train")


@pytest.mark.parametrize("line", [
    "import workbench.ui",
    "import workbench.ui.figures as figures",
    "from workbench import ui",
    "from workbench import telemetry, config",
    "from workbench.ui.figures import timeline",
    "from workbench.calibrate import fo",
    "def lazy():\n    from workbench.recipes.train import run\n    return run",
    "class A:\n    def m(self):\n        import workbench.cli",
    "from ... import ui",  # workbench.engine.zo.step -> workbench.ui
    "from ...recipes import train",
    "from workbench.engine.methods import mezo",  # an engine room above zo/
    "from ..stream import scheduler",
    "def lazy():\n    from workbench.engine.methods.replay import replay",
])
def test_each_import_form_is_caught(line):
    """A ZO arithmetic module importing upward, in every form: the check names it."""
    found = _upward("workbench.engine.zo.step", line)
    assert len(found) >= 1 and found[0].startswith("workbench.engine.zo.step (layer (5, 4))")
    assert _upward("workbench.engine.zo.step", "import torch\nfrom workbench.plan import "
                   "placement\nfrom workbench.engine.rng import philox\nfrom . import perturb"
                   "\nfrom ..codecs import wire") == []


def test_the_plan_imports_no_torch():
    """The cost model is arithmetic only: no module of ``plan/`` imports torch, in any form."""
    bad = [f"{_module(p)} imports {m}" for p in (PKG / "plan").rglob("*.py")
           for m in _imports(p.read_text(), _module(p)) if m.split(".")[0] == "torch"]
    assert not bad, bad
    assert _imports("def f():\n    import torch.nn as nn", "workbench.plan.x") == {"torch.nn"}


TORCHLESS = """
import importlib, json, pkgutil, sys
from dataclasses import replace
sys.modules["torch"] = None  # any import of torch, however lazy, now raises ImportError
import workbench.plan as pkg
names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__))
for name in names:
    importlib.import_module(f"workbench.plan.{name}")
from workbench.config import ConfigError, RunConfig
from workbench.plan.fit import check_fits, suggest
from workbench.plan.planner import plan
from workbench.presets import lookup
peaks = {}
for model, method in [("tiny-opt", "mezo"), ("tiny-llama", "zo-offload"), ("opt-13b", "zo-offload"),
                      ("deepseek-v3", "zo-offload"), ("llama-3.1-8b", "fo-offload"),
                      ("qwen1.5-moe-a2.7b", "mezo")]:
    peaks[model] = plan(RunConfig(model=model, method=method, device="cuda", amp="bf16"),
                        gpu="h100").peak_gpu_mem_bytes
check_fits(RunConfig(model="tiny-opt"))
rows = suggest(RunConfig(model="llama-3.1-405b", amp="bf16"), 24 * 2**30, gpu="h100")
counts, uncast = json.loads(sys.argv[1])  # tiny:mixtral's shape, counted by the caller
shape = replace(lookup("tiny:mixtral"), counts=(counts[0], tuple(counts[1]), counts[2]),
                num_layers=len(counts[1]), uncast=uncast)
cfg = RunConfig(model="tiny:mixtral", method="zo-offload", device="cuda", amp="bf16")
peaks["tiny:mixtral"] = plan(cfg, gpu="h100", shape=shape).peak_gpu_mem_bytes
try:
    plan(cfg, gpu="h100")  # no shape: refused in one line, never counted here
    refused = ""
except ConfigError as e:
    refused = str(e)
print(json.dumps({"modules": names, "peaks": peaks, "rows": len(rows), "refused": refused,
                  "blocked": sys.modules["torch"] is None}))
"""


def test_the_plan_runs_with_torch_blocked():
    """Every module of ``plan/`` imports, and plans presets (tiny, OPT, Llama, MoE, every
    method family), a fit check and ``suggest`` run, with torch made unimportable; a layout only
    its built model can count (``tiny:mixtral``) is planned from the shape its caller passes
    (``models/shape.py``), the same figures as in a process with torch."""
    import json

    from workbench.config import RunConfig
    from workbench.models.shape import shape_of
    from workbench.plan.planner import plan

    shape = shape_of("tiny:mixtral")
    r = subprocess.run([sys.executable, "-c", TORCHLESS, json.dumps([shape.counts, shape.uncast])],
                       capture_output=True, text=True, timeout=300, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["blocked"] and out["rows"] >= 1
    assert set(out["modules"]) == {p.stem for p in (PKG / "plan").glob("*.py")} - {"__init__"}
    assert out["refused"].startswith("model: tiny:mixtral: its parts are counted on the built")
    cfg = RunConfig(model="tiny:mixtral", method="zo-offload", device="cuda", amp="bf16")
    assert out["peaks"]["tiny:mixtral"] == plan(cfg, gpu="h100", shape=shape).peak_gpu_mem_bytes
    assert out["peaks"]["opt-13b"] == plan(cfg.replace(model="opt-13b"),
                                           gpu="h100").peak_gpu_mem_bytes


def test_engine_and_telemetry_never_touch_ui_packages():
    for sub in ("plan", "engine", "models", "data", "calibrate", "telemetry", "recipes"):
        for path in (PKG / sub).rglob("*.py"):
            mods = _imports(path.read_text(), _module(path))
            assert not {m for m in mods if m.split(".")[0] in ("ipywidgets", "plotly", "anywidget")}, path


def _module_graph() -> dict[str, set[str]]:
    """workbench module -> the workbench modules it imports (anywhere in the file)."""
    graph = {}
    for path in PKG.rglob("*.py"):
        mod = _module(path)
        graph[mod] = {m for m in _imports(path.read_text(), mod, path.name == "__init__.py")
                      if m in MODULES} - {mod}
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
import workbench.cli, workbench.recipes.train, workbench.engine.methods.zo_offload, workbench.plan.planner
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
