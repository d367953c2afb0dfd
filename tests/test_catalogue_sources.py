"""Every constant in configs/catalogue/ names its source.

The rule: each scalar value in configs/catalogue/*.yaml has a `#` comment that names where it comes from,
on its own line or on the line of a mapping key that holds it (a GPU's or a model's line, which then
covers every key under it: `deepseek_v3:  # deepseek-ai/DeepSeek-V3 config.json`). A comment names a
source when it contains one of SOURCE_MARKERS: a datasheet, a model's config.json, a paper (arXiv), a
named public measurement (Vidur's or BLIS's profiles, DeepEP's README), a committed file (results/...,
configs/..., docs/...), or the word `assumption`, which declares a number that no source gives
(test_assumptions_are_few lists them). Comment-only lines are explanation, not sources.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

CATALOGUE = Path(__file__).resolve().parents[1] / "configs" / "catalogue"
SOURCE_MARKERS = ("datasheet", "config.json", "arXiv", "Vidur", "BLIS", "DeepEP", "results/", "configs/",
                  "docs/", "assumption")


def line_comment(line: str) -> str:
    """The text after `#` on a YAML line (the catalogue quotes no `#`)."""
    return line.split("#", 1)[1].strip() if "#" in line else ""


def names_source(comment: str) -> bool:
    return any(m in comment for m in SOURCE_MARKERS)


def unsourced(text: str) -> list[str]:
    """Dotted keys of the scalars in a YAML document whose own line and enclosing keys' lines carry no
    comment that names a source."""
    lines = text.splitlines()
    out: list[str] = []

    def walk(node, path: list[str], sourced: bool) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                own = names_source(line_comment(lines[key.start_mark.line]))
                walk(value, path + [key.value], sourced or own)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + [str(i)], sourced)
        elif not sourced and not names_source(line_comment(lines[node.start_mark.line])):
            out.append(".".join(path))

    root = yaml.compose(text)
    if root is not None:
        walk(root, [], False)
    return out


FILES = sorted(CATALOGUE.glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_catalogue_constant_names_its_source(path):
    assert unsourced(path.read_text()) == [], f"{path.name}: constants without a source comment"


def test_the_rule_catches_a_constant_without_a_source():
    text = ("h100:                 # NVIDIA H100 SXM datasheet\n  peak_flops: 989.0e12\n"
            "x100:\n  peak_flops: 1.0e15   # 1 PFLOP/s\n  hbm_bw: 1.0e12   # assumption\n"
            "gemm_mfu: 0.74\nattn_mfu: 0.45   # BLIS default prefill MFU\n"
            "m:   # a model\n  moe: {layers: 3, experts: 8}\n")
    assert unsourced(text) == ["x100.peak_flops", "gemm_mfu", "m.moe.layers", "m.moe.experts"]


def test_assumptions_are_few():
    """The declared assumptions (a number no source gives), so a new one is a visible change."""
    found = []
    for path in FILES:
        lines = path.read_text().splitlines()
        for line in lines:
            key = line.split("#", 1)[0].split(":", 1)[0].strip()
            if key and "assumption" in line_comment(line):
                found.append(f"{path.stem}.{key}")
    assert found == ["gpus.nic_bw", "gpus.nic_bw", "gpus.peak_flops", "gpus.hbm_bytes", "gpus.hbm_bw",
                     "gpus.scaleup_bw", "gpus.nic_bw", "perf.attn_mfu", "perf.nic_efficiency"]
