"""The simulator's hot modules compiled with mypyc: 1.6-1.9x faster, the same results.

`python scripts/build_native.py` (`make native`, part of `make run` and `make test`) compiles MODULES
into build/native/ and records the sha256 of each source and the Python version there (manifest.json). Importing `harness` calls
`install()`, which puts a finder first on `sys.meta_path` that loads those modules from the build
while the manifest matches the sources byte for byte; otherwise (no build, a source edited since the
build, another Python, or HARNESS_NATIVE=0) the sources run as they are, a stale build with a warning.
So an edited simulator never runs old code, and results never depend on the build: the compiled and
interpreted simulators give the same lifecycle bytes (tests/test_native.py).

Why compiled: a step of the simulator is a few hundred small Python operations per turn, spread evenly
over the scheduler, KV cache, engine and backend (no hot spot left to rewrite), and the allocator's
what-if runs the simulator tens to hundreds of times per run. mypyc compiles the same typed source to C
(the mypy project compiles itself this way), so there is one simulator, not two. Which modules, on
numbers (docs/decisions/2026-12-07-compiled-build.md): each one whose calls the others make natively;
not perf/cost_model.py, whose numpy calls ran 5-9% faster interpreted.

What compiling asks of those modules: their annotations are enforced at run time (a float where `int`
is declared raises), and each class says how mypyc builds it: `@mypyc_attr(serializable=True,
allow_interpreted_subclasses=True)` on the simulation's classes (SimBackend.fork pickles the
simulation; mypyc restores a pickled object's attributes only with both), `native_class=False` on the
frozen config dataclasses (pickle restores them through setattr). One trap: `==` / `!=` between two
instances of a `native_class=False` dataclass compiles to an identity test (mypyc does not see the
generated `__eq__`); compare them through `operator.eq` / `operator.ne`.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MODULES = ("harness.sim.kv_cache", "harness.sim.scheduler", "harness.sim.engine", "harness.sim.clock",
           "harness.sim.view", "harness.sim.links", "harness.sim.backend", "harness.perf.roofline")
ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "native"
MANIFEST = BUILD / "manifest.json"


def _source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _python() -> str:
    return f"{sys.implementation.cache_tag}-{sys.platform}"


class _Finder:
    """Loads the compiled modules (and mypyc's shared runtime module) from the build directory."""

    def __init__(self, files: dict[str, Path]):
        self.files = files

    def find_spec(self, name, path=None, target=None):
        file = self.files.get(name)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(name, str(file))
        return importlib.util.spec_from_file_location(name, file, loader=loader)


def current_build() -> dict[str, Path] | None:
    """Module name -> compiled file, if the build matches the sources and this Python (else None)."""
    if os.environ.get("HARNESS_NATIVE", "1") == "0" or not MANIFEST.exists():
        return None
    manifest = json.loads(MANIFEST.read_text())
    stale = [m for m in MODULES if manifest.get("sources", {}).get(m) != _digest(_source(m))]
    if manifest.get("python") != _python() or stale:
        log.warning("the compiled simulator in %s is stale (%s); running the Python sources. Rebuild it "
                    "with `make native`", BUILD, ", ".join(stale) or f"built for {manifest.get('python')}")
        return None
    files = {name: BUILD / rel for name, rel in manifest["files"].items()}
    return files if all(f.exists() for f in files.values()) else None


def install() -> bool:
    """Serve the compiled modules when the build is current; True if it is."""
    if active():
        return True
    files = current_build()
    if files is None:
        return False
    loaded = [m for m in MODULES if m in sys.modules]
    if loaded:   # imported before `harness` itself: leave them as they are
        log.warning("not using the compiled simulator: %s already imported", ", ".join(loaded))
        return False
    sys.meta_path.insert(0, _Finder(files))
    return True


def active() -> bool:
    """Whether the simulator modules imported so far are the compiled ones."""
    return any(isinstance(f, _Finder) for f in sys.meta_path)


def build() -> None:
    """Compile MODULES with mypyc into build/native/ and write the manifest."""
    import shutil

    from mypyc.build import mypycify
    from setuptools import setup

    sources = {m: _digest(_source(m)) for m in MODULES}
    if BUILD.exists():
        shutil.rmtree(BUILD)
    temp = ROOT / "build" / "native-temp"
    cwd = os.getcwd()
    os.chdir(ROOT)   # mypycify takes paths relative to the root, so module names come out right
    try:
        ext = mypycify([str(_source(m).relative_to(ROOT)) for m in MODULES]
                       + ["--follow-imports=silent", "--ignore-missing-imports"],
                       opt_level="3", target_dir=str(temp / "c"))
        setup(name="harness-native", ext_modules=ext, script_args=[
            "--quiet", "build_ext", "--build-lib", str(BUILD), "--build-temp", str(temp / "o")])
    finally:
        os.chdir(cwd)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    files = {}
    for f in BUILD.rglob(f"*{suffix}"):
        rel = f.relative_to(BUILD)
        files[".".join(rel.parts)[: -len(suffix)]] = str(rel)
    missing = [m for m in MODULES if m not in files]
    if missing:
        raise SystemExit(f"mypyc built no module for {', '.join(missing)}")
    MANIFEST.write_text(json.dumps({"python": _python(), "sources": sources, "files": files}, indent=1))
    log.info("compiled %d modules into %s", len(MODULES), BUILD)
