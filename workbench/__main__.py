"""``python -m workbench``: the CLI, or one line saying where it runs when this Python lacks the
workbench's packages (``python3 -m workbench`` outside the environment ``./wb`` sets up)."""
import importlib.util
import sys


def _outside(missing: str) -> int:
    print(f"error: {missing} is not installed in this Python ({sys.executable}): run the "
          "workbench through ./wb (it sets up its environment the first time), e.g. ./wb demo",
          file=sys.stderr)
    return 2


if importlib.util.find_spec("torch") is None:
    raise SystemExit(_outside("torch"))
try:
    from workbench.cli import main
except ModuleNotFoundError as e:  # another package of the environment (not one of ours)
    if (e.name or "workbench").split(".")[0] == "workbench":
        raise
    raise SystemExit(_outside(e.name)) from None

raise SystemExit(main())
