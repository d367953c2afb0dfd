"""The `key=value` command lines of the fidelity and calibration tools: the tool's own keys, the rest
passed on as Hydra overrides of configs/config.yaml; `--help`; bad input ends in one line naming the
key, with no traceback."""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from hydra.errors import HydraException, InstantiationException
from omegaconf.errors import OmegaConfBaseException

log = logging.getLogger("harness.cli")


def split_args(argv: list[str], defaults: dict[str, str], usage: str) -> tuple[dict[str, str], list[str]]:
    """The tool's own keys (over `defaults`) and the remaining arguments (Hydra overrides). `-h` or
    `--help` writes `usage` and exits 0."""
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(usage.rstrip() + "\n")
        raise SystemExit(0)
    own, rest = dict(defaults), []
    for a in argv:
        k, _, v = a.partition("=")
        if k in own:
            own[k] = v
        else:
            rest.append(a)
    return own, rest


# Bad input as the tools meet it: a value (ValueError, naming the key), an override Hydra cannot apply
# (its own message names it), a file that cannot be read (the OSError names it).
BAD_INPUT = (ValueError, HydraException, OmegaConfBaseException, OSError)


def tool_error(exc: BaseException) -> str:
    """One line for a bad input: the cause Hydra wrapped while instantiating a `_target_`, else Hydra's
    first line (the rest is its search path)."""
    if isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if isinstance(exc, HydraException) else text.replace("\n", " ")


def run_tool(main: Callable[[list[str]], None], argv: list[str] | None, prog: str) -> None:
    """Runs `main(argv)`; bad input (BAD_INPUT) becomes one line on stderr and exit status 2."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        main(sys.argv[1:] if argv is None else argv)
    except BAD_INPUT as exc:
        sys.stderr.write(f"{prog}: error: {tool_error(exc)}\n")
        raise SystemExit(2) from None
