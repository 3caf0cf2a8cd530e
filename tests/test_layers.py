"""Imports go one way: config -> engine (models, data, engine) -> telemetry -> recipes -> ui,
with the CLI on top. Checked on the source, so a lazy import inside a function counts too."""
import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "workbench"
LAYER = {"config": 0, "presets": 0, "models": 1, "data": 1, "engine": 1, "distributed": 1, "planner": 1,
         "calibration": 1, "telemetry": 2, "recipes": 3, "ui": 4, "cli": 5, "cli_sweep": 5,
         "__main__": 5,
         "__init__": 0}


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


def test_importing_the_engine_loads_no_ui_and_no_nvml():
    code = ("import sys, workbench.recipes.train, workbench.engine.offload; "
            "bad = [m for m in ('ipywidgets', 'plotly', 'anywidget') if m in sys.modules]; "
            "import pynvml; print(bad, pynvml.nvmlDeviceGetCount if False else 'ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("[]")
    # NVML is initialised only when a sampler starts: no module calls nvmlInit at import.
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, ast.Expr) and "nvmlInit" in ast.dump(n)]
        assert not top, path
