"""The installed package's console scripts resolve to the modules' `main` (pyproject.toml)."""
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = {"prorsa-report": "harness.report:main", "prorsa-fidelity": "harness.fidelity:main",
           "prorsa-calibrate": "harness.perf.calibrate:main"}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_installed(name):
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert name in eps, f"{name} not installed: reinstall with pip install -e ."
    assert eps[name].value == SCRIPTS[name]
    assert callable(eps[name].load())
    path = Path(sys.executable).parent / name     # installed beside the interpreter
    assert path.exists(), path
    out = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()
