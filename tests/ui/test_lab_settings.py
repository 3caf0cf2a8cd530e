"""``./wb lab`` starts JupyterLab without its news pop-up: the overrides file it installs is
where this JupyterLab reads overrides from, and its values are ones the lab's schema allows."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = REPO / "assets" / "jupyterlab" / "overrides.json"


def test_the_lab_starts_with_the_news_off():
    commands = pytest.importorskip("jupyterlab.commands")
    settings_utils = pytest.importorskip("jupyterlab_server.settings_utils")
    # wb copies the file into the environment's app settings folder ...
    assert 'cp assets/jupyterlab/overrides.json "$VENV/share/jupyter/lab/settings/overrides.json"' \
        in (REPO / "wb").read_text()
    # ... which is where this JupyterLab looks for overrides in an environment (sys.prefix)
    app_dir = Path(commands.get_app_dir())
    assert app_dir == Path(sys.prefix) / "share" / "jupyter" / "lab"
    read, error = settings_utils._get_overrides(str(OVERRIDES.parent))
    assert not error and read == json.loads(OVERRIDES.read_text())
    plugin = "@jupyterlab/apputils-extension:notification"
    schema = json.loads((app_dir / "schemas" / "@jupyterlab" / "apputils-extension" /
                         "notification.json").read_text())["properties"]
    assert read[plugin]["fetchNews"] in [c["const"] for c in schema["fetchNews"]["oneOf"]]
    assert read[plugin]["fetchNews"] == "false"  # "none" (the default) asks in a pop-up
    assert schema["checkForUpdates"]["type"] == "boolean"
    assert read[plugin]["checkForUpdates"] is False
