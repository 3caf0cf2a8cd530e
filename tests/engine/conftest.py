import sys
from pathlib import Path

# zo_helpers.py sits beside the tests, and some tests reuse another's helpers (``from test_lora
# import ...``): pytest runs with --import-mode=importlib, so the folders go on the path.
HERE = Path(__file__).parent
for folder in (HERE, *(p for p in sorted(HERE.iterdir()) if (p / "conftest.py").exists()
                        or any(p.glob("test_*.py")))):
    sys.path.insert(0, str(folder))
