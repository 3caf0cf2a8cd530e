import sys
from pathlib import Path

# export_helpers.py sits beside the tests (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).parent))
