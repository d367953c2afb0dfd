"""The search, SWE and tool-use recipes at the loads published agentic-RL runs use, on Qwen3-235B-A22B
on 64 H200 (configs/cluster/qwen235_h200.yaml, vLLM semantics): 2, 8, 32, 64 and 128 trajectories per GPU
(docs/references.md, section 10: 1-32 per GPU in SWE runs, 21-512 in search and tool-use runs), one
sync step each. Per setting: colocation, every fixed split and Prorsa (the runner and table of
scripts/generalization.py), but for Prorsa at 64 and 128 per GPU (about 4,096 and 8,192 trajectories: at
2,048 a Prorsa run of SWE took ten minutes here); does PD reach the paper's 1.11x over colocation at
some load?
    python scripts/recipe_loads.py [OUT] [--only NAME ...] [--seeds 0]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from generalization import main  # noqa: E402

GPUS = 64   # configs/cluster/qwen235_h200.yaml: 8 engines x 8 GPUs
LOADS = (2, 8, 32, 64, 128)   # trajectories per GPU
# experiment, GRPO group size (configs/workload/{search,swe,tooluse}.yaml group_size)
RECIPES = {"search": ("+experiment=search", 5), "swe": ("+experiment=swe", 8), "tooluse": ("+experiment=tooluse", 8)}
# prompts per step: the load's trajectories over the recipe's group size (search: groups of 5, so
# 2 per GPU is 26 prompts, 130 trajectories)
SETTINGS = {f"{name}_load{load}": [experiment, "mode.num_steps=1", "cluster=qwen235_h200", "cluster.engine=vllm",
                                   f"workload.batch_size={round(load * GPUS / group)}"]
            for name, (experiment, group) in RECIPES.items() for load in LOADS}
STATICS_ONLY = {f"{name}_load{load}" for name in RECIPES for load in LOADS if load >= 64}

if __name__ == "__main__":
    main(SETTINGS, "results/recipe_loads", __doc__, STATICS_ONLY)
