"""One policy order, colour, line style, marker and hatch for every figure and table of the report, and one
look (seaborn's white grid at 8-pt print sizes) for every figure the harness draws.

A policy keeps its look across figures, runs and reports: nothing comes from matplotlib's cycle. The
methods a reader compares (colocate, the best fixed split, prorsa, oracle_pd) get strong Okabe-Ito
colours, and each policy its own line style, marker and hatch, so that they stay apart in greyscale and
where two curves coincide. Fixed splits other than the best are greys; every other policy is muted.
A name not known here is hashed (crc32, not Python's salted hash) into a muted palette, so it is stable
too. Engine roles are filled areas in another palette (ColorBrewer's Paired purples), never a policy's.
"""
from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

COLUMN_IN = 3.5       # one column of a two-column paper
PAGE_IN = 7.0         # the page width
MAX_WIDTH_IN = 7.5    # no figure is wider than this


@dataclass(frozen=True)
class Look:
    color: str
    linestyle: str | tuple = "-"
    marker: str = "o"
    hatch: str = ""


LOOKS = {   # Okabe-Ito (colour-blind safe) for the methods compared; muted for the rest
    "colocate": Look("#0072B2", "-", "o", ""),
    "best_fixed": Look("#009E73", (0, (5, 2)), "s", "//"),
    "fixed_pd": Look("#8A8A8A", ":", ".", ".."),
    "hindsight_best": Look("#CC79A7", (0, (5, 1, 1, 1)), "D", "\\\\"),
    "prorsa": Look("#D55E00", (0, (3, 1)), "^", "xx"),
    "oracle_pd": Look("#000000", (0, (1, 1)), "v", "--"),
    "pearl": Look("#B58DB6", (0, (4, 1, 1, 1, 1, 1)), "P", "++"),
    "ppd": Look("#D9B96F", (0, (2, 2)), "X", "oo"),
    "reactive_pd": Look("#C4A484", (0, (6, 2, 1, 2)), "*", "||"),
}
COLORS = {name: look.color for name, look in LOOKS.items()}
ORDER = list(LOOKS)
SPLIT_GREYS = ["#DADADA", "#C6C6C6", "#B2B2B2", "#9E9E9E", "#8A8A8A", "#767676", "#626262"]   # by num_prefill
PRORSA_SHADES = ["#F4A582", "#E9967A", "#F6C1A6", "#D98C6A", "#EBB08F"]   # prorsa's ablations and variants
MUTED = ["#9E9E9E", "#B0A48F", "#8E9EAB", "#A89CB0", "#9FB09A", "#B59A9A"]
OTHER_MARKERS = ["h", "p", "8", "<", ">", "d"]     # for policies without a look of their own
# ColorBrewer's Paired (seaborn's "Paired"): dark and light purple, apart in greyscale too, and brown.
ROLE_COLORS = {"prefill": "#6a3d9a", "decode": "#cab2d6", "colocated": "#D9D9D9", "switching": "#b15928"}


def _rank(policy: str) -> int:
    """colocate, best_fixed, the fixed splits, hindsight_best, prorsa, oracle_pd, the other baselines,
    then prorsa's ablations and variants, then anything else."""
    base = policy.partition("[")[0]
    if base == "fixed_pd":
        return ORDER.index("fixed_pd")
    if policy in LOOKS:
        return ORDER.index(policy)
    return len(ORDER) + (0 if base == "prorsa" else 1)


def _natural(policy: str) -> list:
    """Numbers compare as numbers: fixed_pd[num_prefill=2] before fixed_pd[num_prefill=10]."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", policy)]


def policy_order(policies: Iterable[str]) -> list[str]:
    return sorted(set(policies), key=lambda p: (_rank(p), _natural(p)))


def policy_look(policy: str, best_split: str | None = None) -> Look:
    """`best_split`: the fixed split that was fastest where the figure looks, drawn as best_fixed."""
    if policy == best_split:
        return LOOKS["best_fixed"]
    if policy in LOOKS:
        return LOOKS[policy]
    h = zlib.crc32(policy.encode())
    prefill = re.search(r"num_prefill=(\d+)", policy)
    if policy.startswith("fixed_pd[") and prefill:
        return Look(SPLIT_GREYS[(int(prefill[1]) - 1) % len(SPLIT_GREYS)], ":", ".", "..")
    if policy.startswith("prorsa["):
        return Look(PRORSA_SHADES[h % len(PRORSA_SHADES)], (0, (3, 1)), OTHER_MARKERS[h % len(OTHER_MARKERS)], "xx")
    return Look(MUTED[h % len(MUTED)], (0, (1, 2)), OTHER_MARKERS[h % len(OTHER_MARKERS)], "..")


def policy_color(policy: str, best_split: str | None = None) -> str:
    return policy_look(policy, best_split).color


def policy_label(policy: str, best_split: str | None = None) -> str:
    return f"{policy} (best split)" if policy == best_split else policy


def rc() -> dict:
    """Seaborn's white grid at print sizes: 8-pt text at 100% scale, fonts embedded as TrueType in PDFs
    (camera-ready checks). A function: seaborn takes seconds to import, and only figures need it."""
    import seaborn as sns
    return {**sns.axes_style("whitegrid"),
            "font.size": 8, "figure.titlesize": 9, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7,
            "ytick.labelsize": 7, "legend.fontsize": 7, "legend.frameon": False, "lines.linewidth": 1.2,
            "grid.color": "0.9", "grid.linewidth": 0.5, "axes.spines.top": False, "axes.spines.right": False,
            "axes.edgecolor": "0.2", "axes.linewidth": 0.8, "xtick.bottom": True, "ytick.left": True,
            "hatch.linewidth": 0.6, "pdf.fonttype": 42, "ps.fonttype": 42, "savefig.dpi": 200}


def save(fig, path, dpi: int | None = None) -> None:
    """Write a figure; a PDF without its creation date, so a figure redrawn from the same data is the same
    file (a regenerated result changes only where its data did)."""
    metadata = {"CreationDate": None} if str(path).endswith(".pdf") else None
    fig.savefig(path, dpi=dpi, metadata=metadata)   # dpi None: rc's savefig.dpi
