"""REPRODUCE.md's tables are what the committed results render (scripts/claims.py --render), so no number
in it can drift from results/; a hand-edited table, an unknown block or an unclosed one is refused."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def claims(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/claims.py", *args], cwd=ROOT, capture_output=True, text=True)


def test_reproduce_md_is_what_the_committed_results_render():
    done = claims("--check")
    assert done.returncode == 0, done.stderr


def test_a_table_edited_by_hand_fails_the_check_and_render_restores_it(tmp_path):
    text = (ROOT / "REPRODUCE.md").read_text()
    start = text.index("<!-- rendered: thinning -->\n") + len("<!-- rendered: thinning -->\n")
    doc = tmp_path / "REPRODUCE.md"
    doc.write_text(text[:start] + "| plan | settings |\n|---|---|\n| full | 99 |\n" + text[text.index("<!-- /rendered -->", start):])
    done = claims("--check", str(doc))
    assert done.returncode != 0 and "differs from what the committed results render" in done.stderr
    assert claims("--render", str(doc)).returncode == 0
    assert doc.read_text() == text


def test_an_unknown_or_unclosed_block_is_refused_with_its_line(tmp_path):
    doc = tmp_path / "REPRODUCE.md"
    doc.write_text("# title\n\n<!-- rendered: nonsense -->\n<!-- /rendered -->\n")
    done = claims("--render", str(doc))
    assert done.returncode != 0 and "REPRODUCE.md:3: unknown rendered block 'nonsense'" in done.stderr
    assert "Traceback" not in done.stderr
    doc.write_text("# title\n<!-- rendered: thinning -->\nno end\n")
    done = claims("--render", str(doc))
    assert done.returncode != 0 and "REPRODUCE.md:2: a rendered block without its end" in done.stderr
    assert doc.read_text() == "# title\n<!-- rendered: thinning -->\nno end\n"   # nothing written


def test_gain_from_names_the_component_whose_removal_loses_twice_the_other():
    """Prorsa 1.12x, no switching 1.00x, colocated start 1.12x: switching alone loses (0.12 against 0);
    1.32 / 1.31 / 1.05: the start (0.27 against 0.01); 1.43 / 1.31 / 1.23: both (0.20 against 0.12, not
    twice); no gain anywhere: neither."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from reproduce_tables import gain_from
    assert gain_from(1.12, 1.00, 1.12) == "switching"
    assert gain_from(1.32, 1.31, 1.05) == "the start"
    assert gain_from(1.43, 1.31, 1.23) == "both"
    assert gain_from(1.00, 1.00, 1.00) == "neither (no gain to lose)"
