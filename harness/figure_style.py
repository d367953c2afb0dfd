"""One policy order and one policy -> colour map for every figure and table of the report.

Colours never come from matplotlib's cycle, so a policy keeps its colour across figures, runs and
reports. The methods a reader compares (colocate, the best fixed split, prorsa, oracle_pd) get strong
colours; fixed splits other than the best are greys; every other policy a muted colour. A name not
known here is hashed (crc32, not Python's salted hash) into a muted palette, so it is stable too.
"""
from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

COLUMN_IN = 3.5       # one column of a two-column paper
PAGE_IN = 7.0         # the page width
MAX_WIDTH_IN = 7.5    # no figure is wider than this

COLORS = {   # Okabe-Ito (colour-blind safe) for the methods compared; muted for the rest
    "colocate": "#0072B2",
    "best_fixed": "#009E73",
    "fixed_pd": "#8A8A8A",
    "hindsight_best": "#44AA99",
    "prorsa": "#D55E00",
    "oracle_pd": "#000000",
    "pearl": "#B58DB6",
    "ppd": "#D9B96F",
    "reactive_pd": "#C4A484",
}
ORDER = list(COLORS)
SPLIT_GREYS = ["#DADADA", "#C6C6C6", "#B2B2B2", "#9E9E9E", "#8A8A8A", "#767676", "#626262"]   # by num_prefill
PRORSA_SHADES = ["#F4A582", "#E9967A", "#F6C1A6", "#D98C6A", "#EBB08F"]   # prorsa's ablations and variants
MUTED = ["#9E9E9E", "#B0A48F", "#8E9EAB", "#A89CB0", "#9FB09A", "#B59A9A"]
ROLE_COLORS = {"prefill": "#E69F00", "decode": "#56B4E9", "colocated": "#BBBBBB", "switching": "#CC79A7"}


def _rank(policy: str) -> int:
    """colocate, best_fixed, the fixed splits, hindsight_best, prorsa, oracle_pd, the other baselines,
    then prorsa's ablations and variants, then anything else."""
    base = policy.partition("[")[0]
    if base == "fixed_pd":
        return ORDER.index("fixed_pd")
    if policy in COLORS:
        return ORDER.index(policy)
    return len(ORDER) + (0 if base == "prorsa" else 1)


def _natural(policy: str) -> list:
    """Numbers compare as numbers: fixed_pd[num_prefill=2] before fixed_pd[num_prefill=10]."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", policy)]


def policy_order(policies: Iterable[str]) -> list[str]:
    return sorted(set(policies), key=lambda p: (_rank(p), _natural(p)))


def policy_color(policy: str, best_split: str | None = None) -> str:
    """`best_split`: the fixed split that was fastest where the figure looks, drawn in best_fixed's colour."""
    if policy == best_split:
        return COLORS["best_fixed"]
    if policy in COLORS:
        return COLORS[policy]
    prefill = re.search(r"num_prefill=(\d+)", policy)
    if policy.startswith("fixed_pd[") and prefill:
        return SPLIT_GREYS[(int(prefill[1]) - 1) % len(SPLIT_GREYS)]
    shades = PRORSA_SHADES if policy.startswith("prorsa[") else MUTED
    return shades[zlib.crc32(policy.encode()) % len(shades)]


def policy_label(policy: str, best_split: str | None = None) -> str:
    return f"{policy} (best)" if policy == best_split else policy


# Sizes for print: 8-pt text at 100% scale, fonts embedded as TrueType in PDFs (camera-ready checks).
RC = {"font.size": 8, "figure.titlesize": 9, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7,
      "ytick.labelsize": 7, "legend.fontsize": 7, "legend.frameon": False, "lines.linewidth": 1.2, "axes.grid": True,
      "grid.color": "0.9", "grid.linewidth": 0.5, "axes.spines.top": False, "axes.spines.right": False,
      "axes.axisbelow": True, "pdf.fonttype": 42, "ps.fonttype": 42, "savefig.dpi": 200}
