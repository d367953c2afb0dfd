"""The compiled simulator (harness/native.py): the same lifecycle bytes as the sources, and a build that
no longer matches its sources is never used."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import native

ROOT = Path(__file__).resolve().parents[1]
needs_build = pytest.mark.skipif(native.current_build() is None, reason="no current compiled build (`make native`)")


def run_python(args: list[str], compiled: bool) -> str:
    env = dict(os.environ, HARNESS_NATIVE="1" if compiled else "0")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout


@needs_build
def test_the_compiled_modules_are_loaded_and_off_by_switch():
    code = ("import harness.native as n, harness.sim.scheduler as s, harness.perf.roofline as r; "
            "print(n.active(), s.__file__, r.__file__)")
    active, *files = run_python(["-c", code], compiled=True).split()
    assert active == "True" and all(f.startswith(str(native.BUILD)) for f in files)
    active, *files = run_python(["-c", code], compiled=False).split()
    assert active == "False" and all(f.endswith(".py") for f in files)


@needs_build
def test_compiled_and_source_simulators_give_the_same_lifecycle_bytes():
    """The fourteen configurations of scripts/lifecycle_hashes.py (every policy family, both modes, four
    clusters, role switches and Prorsa's what-if runs) hash the same either way."""
    script = ["scripts/lifecycle_hashes.py", "--print"]
    compiled = json.loads(run_python(script, compiled=True))
    sources = json.loads(run_python(script, compiled=False))
    assert len(compiled) == 14 and compiled == sources


def fake_build(tmp_path, monkeypatch, sources: dict[str, str], python: str | None = None) -> None:
    build = tmp_path / "native"
    build.mkdir()
    files = {m: f"{m}.so" for m in native.MODULES}
    for rel in files.values():
        (build / rel).write_bytes(b"")
    (build / "manifest.json").write_text(json.dumps({"python": python or native._python(), "sources": sources,
                                                     "files": files}))
    monkeypatch.setattr(native, "BUILD", build)
    monkeypatch.setattr(native, "MANIFEST", build / "manifest.json")
    monkeypatch.delenv("HARNESS_NATIVE", raising=False)


def test_a_build_matching_its_sources_is_used(tmp_path, monkeypatch):
    fake_build(tmp_path, monkeypatch, {m: native._digest(native._source(m)) for m in native.MODULES})
    files = native.current_build()
    assert files is not None and set(native.MODULES) <= set(files)
    monkeypatch.setenv("HARNESS_NATIVE", "0")
    assert native.current_build() is None


def test_a_build_of_an_edited_source_is_not_used(tmp_path, monkeypatch, caplog):
    sources = {m: native._digest(native._source(m)) for m in native.MODULES}
    sources["harness.sim.scheduler"] = "0" * 64   # built from another scheduler.py
    fake_build(tmp_path, monkeypatch, sources)
    assert native.current_build() is None
    assert "stale (harness.sim.scheduler)" in caplog.text


def test_a_build_for_another_python_is_not_used(tmp_path, monkeypatch, caplog):
    fake_build(tmp_path, monkeypatch, {m: native._digest(native._source(m)) for m in native.MODULES},
               python="cpython-312-linux")
    assert native.current_build() is None
    assert "built for cpython-312-linux" in caplog.text
