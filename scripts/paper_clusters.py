"""The REPRODUCE.md claims on clusters of the paper's kind: Qwen3-235B-A22B on 64 H200 and DeepSeek-V3
on 128 H200 (configs/cluster/qwen235_h200.yaml, deepseek_v3_h200.yaml), under both engine semantics,
with the search, SWE and tool-use experiments' workloads and recipe batch sizes. Per setting:
colocation, every fixed split and Prorsa (the runner and table of scripts/generalization.py).
    python scripts/paper_clusters.py [OUT] [--only NAME ...] [--seeds 0,1,2]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from generalization import main  # noqa: E402

# Batch per step: the experiments' own (configs/experiment/*.yaml: Search-R1 512 x 5, DeepSWE 64 x 8,
# tooluse 64 x 8); one step each.
WORKLOADS = {"search": ["+experiment=search", "mode.num_steps=1"], "swe": ["+experiment=swe", "mode.num_steps=1"],
             "tooluse": ["+experiment=tooluse", "mode.num_steps=1"]}
SETTINGS = {f"{w}_{c}_{e}": [*over, f"cluster={c}", f"cluster.engine={e}"]
            for c in ("qwen235_h200", "deepseek_v3_h200") for e in ("vllm", "sglang") for w, over in WORKLOADS.items()}


if __name__ == "__main__":
    main(SETTINGS, "results/paper_clusters", __doc__)
