"""The README's fresh-process table is the one the committed results generate (issue 16)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_holds_the_table_generated_from_the_results():
    spec = importlib.util.spec_from_file_location("readme_table",
                                                  ROOT / "benchmarks" / "readme_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = mod.markdown("H100")
    assert table.count("\n") >= 4  # header, rule and rows: the results are committed
    assert table in (ROOT / "README.md").read_text(encoding="utf-8")
