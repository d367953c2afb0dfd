"""Compile the simulator's hot modules with mypyc into build/native/ (harness/native.py says why and how
they are loaded). Needs the `native` extra (mypy) and a C compiler; `make native` runs it."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import native  # noqa: E402

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    native.build()
