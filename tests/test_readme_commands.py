"""Every `python run.py ...` command the README and the docs show composes as written: its overrides name
keys and groups that exist (a `policy.num_prefill=3` without `policy=fixed_pd`, or `experiment=` where
`+experiment=` is needed, fails here). A sweep (`-m a=x,y`) composes once per listed value. Placeholders
(`<exp>`) and `...` are left out. Running them is the other tests' job; composing all takes seconds."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "REPRODUCE.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands() -> list[tuple[str, str]]:
    """(file, command) for each `run.py` command in an inline code span or a fenced block line."""
    out = []
    for path in DOCS:
        text = path.read_text()
        fenced = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
        lines = [ln for block in fenced for ln in block.replace("\\\n", " ").splitlines()]
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        spans = [s.replace("\n", " ") for s in re.findall(r"`([^`]+)`", prose)]   # a span may wrap a line
        for cmd in [*lines, *spans]:
            m = re.search(r"\brun\.py(\s.*)?$", cmd.split("#")[0].strip())
            if m and "python" in cmd:
                out.append((path.name, "run.py" + (m.group(1) or "")))
    return out


def sweeps(args: list[str]) -> list[list[str]]:
    """The override lists a command composes: the first value of every sweep, then each other value
    of each sweep in turn."""
    args = [a for a in args if a not in ("-m", "--multirun", "--help", "-h", "...") and not a.startswith("hydra.")]
    firsts = [a.split("=", 1)[0] + "=" + a.split("=", 1)[1].split(",")[0] if "," in a.split("=", 1)[-1]
              and not a.split("=", 1)[-1].startswith("[") else a for a in args]
    out = [firsts]
    for i, a in enumerate(args):
        key, _, value = a.partition("=")
        if "," in value and not value.startswith("["):
            out += [firsts[:i] + [f"{key}={v}"] + firsts[i + 1:] for v in value.split(",")[1:]]
    return out


CMDS = commands()


def test_the_docs_show_run_commands():
    assert len(CMDS) >= 8, CMDS


@pytest.mark.parametrize("where,cmd", CMDS, ids=[f"{w}:{c}" for w, c in CMDS])
def test_documented_run_command_composes(where, cmd):
    args = shlex.split(cmd)[1:]
    if any("<" in a for a in args):
        pytest.skip("placeholder")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        for overrides in sweeps(args):
            compose(config_name="config", overrides=overrides)
