"""run.py's `--help`: the groups a user picks with their options, `+experiment=` as it must be typed, and
none of the groups the harness reads itself (the schemas in Hydra's ConfigStore, the catalogue)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ["policy", "workload", "cluster", "mode", "backend", "logger"]


def run_help(*overrides: str) -> str:
    res = subprocess.run([sys.executable, "run.py", "--help", *overrides], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs" / group).glob("*.yaml"))


def test_help_lists_every_group_a_user_picks_and_not_the_internal_ones():
    text = run_help()
    lines = text.splitlines()
    for group in GROUPS:
        start = next(i for i, line in enumerate(lines) if line.startswith(f"  {group} "))
        listed = " ".join(lines[start:start + 3])
        assert all(o in listed for o in options(group)), (group, listed)
    assert "schema" not in text and "catalogue" not in text and "gpus" not in text, text
    assert "[colocate]" in text and "[synthetic]" in text and "[sim]" in text    # the defaults marked


def test_help_says_experiments_need_a_plus():
    text = run_help()
    assert "+experiment=NAME" in text
    assert all(name in text for name in options("experiment"))
    assert "\n  experiment " not in text                  # never listed as a plain group


def test_help_marks_what_the_command_line_picks():
    text = run_help("policy=prorsa", "+experiment=swe")
    assert "[prorsa]" in text and "[colocate]" not in text and "[swe]" in text
