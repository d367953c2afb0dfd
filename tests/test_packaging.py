"""Every tool has a console script (pyproject.toml) whose target is its module's `main`, answering `--help`;
an installed package has them on the path beside the interpreter."""
import importlib
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"prorsa-run": "run:main", "prorsa-report": "harness.report:main",
           "prorsa-fidelity": "harness.fidelity:main", "prorsa-calibrate": "harness.calibrate:main",
           "prorsa-card": "workloads.card:main"}
DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_tool_has_a_console_script():
    assert DECLARED == SCRIPTS


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_target_answers_help(name):
    module, _, func = SCRIPTS[name].partition(":")
    assert callable(getattr(importlib.import_module(module), func))
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; {func}()"
    out = subprocess.run([sys.executable, "-c", code, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower(), out.stdout


def installed_here() -> bool:
    """The package is installed from this checkout (pip install -e .): its entry points are this pyproject's."""
    try:
        url = json.loads(importlib.metadata.distribution("prorsa-harness").read_text("direct_url.json") or "{}")
    except importlib.metadata.PackageNotFoundError:
        return False
    return Path(url.get("url", "").removeprefix("file://")).resolve() == ROOT


@pytest.mark.skipif(not installed_here(), reason="the package is installed from another checkout, or not at all")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_installed(name):
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert name in eps, f"{name} not installed: reinstall with pip install -e ."
    assert eps[name].value == SCRIPTS[name]
    path = Path(sys.executable).parent / name     # installed beside the interpreter
    assert path.exists(), path
    out = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()


def test_no_tracked_file_is_ignored():
    """.gitignore names build outputs and results, never a file the repository keeps (configs/config.yaml)."""
    res = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("not a git checkout")
    assert res.stdout.split() == []
