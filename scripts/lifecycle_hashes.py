"""Lifecycle parquet hashes of a fixed set of simulator configurations.

`python scripts/lifecycle_hashes.py --write` records them in scripts/lifecycle_hashes.json (`--experiments`:
and Prorsa's on every simulated experiment);
without `--write` it reruns the set and reports every configuration whose lifecycle changed; `--print`
prints them (tests/test_native.py compares the compiled simulator's with the sources'). A change to
the simulator that must not move any result (a refactoring) keeps every hash.

The bytes are exact floats, so they may depend on the machine's numpy: its vectorised kernels (exp,
sums) are chosen by the CPU's SIMD level and can round the last bit differently. Measured at one
commit: 7 of the 12 hashes recorded on an earlier development machine differ on an AMD EPYC with AVX2
only (numpy 2.4.6), while heavy_prefill's rollout times (colocate and Prorsa, seed 0) agree with the
committed reference results to every digit. The file records where its hashes were made; on another
kind of machine, record the base commit's hashes there first (`git stash; python
scripts/lifecycle_hashes.py --write; git stash pop`).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import sys
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.experiment import lifecycle_frame, run_rollout  # noqa: E402

REFERENCE = ROOT / "scripts" / "lifecycle_hashes.json"
SMALL = ["workload.batch_size=8", "workload.group_size=4", "mode.num_steps=2",
         "cluster.flush_prefix_cache_on_weight_update=false"]   # the refactoring check: new options off
# policies x workloads x modes x engine sizes: each line one configuration.
CONFIGS = {
    "colocate-synthetic-sync-dense": ["policy=colocate", "workload=synthetic", "mode=sync", "cluster=dense_h100"],
    "fixed_pd-synthetic-sync-dense": ["policy=fixed_pd", "workload=synthetic", "mode=sync", "cluster=dense_h100"],
    "colocate-synthetic-async-moe": ["policy=colocate", "workload=synthetic", "mode=async", "cluster=moe_h200", "mode.max_in_flight=24"],
    "fixed_pd-synthetic-async-moe": ["policy=fixed_pd", "workload=synthetic", "mode=async", "cluster=moe_h200", "mode.max_in_flight=24"],
    "prorsa-tooluse-sync-moe": ["policy=prorsa", "workload=tooluse", "mode=sync", "cluster=moe_h200"],
    "prorsa-search-async-dense8": ["policy=prorsa", "workload=search", "mode=async", "cluster=dense8_h100", "mode.max_in_flight=24"],
    "ppd-swe-sync-dense": ["policy=ppd", "workload=swe", "mode=sync", "cluster=dense_h100"],
    "reactive_pd-tooluse-async-moe": ["policy=reactive_pd", "workload=tooluse", "mode=async", "cluster=moe_h200", "mode.max_in_flight=24"],
    "colocate-search-sync-dense8": ["policy=colocate", "workload=search", "mode=sync", "cluster=dense8_h100"],
    "fixed_pd-swe-async-dense4": ["policy=fixed_pd", "workload=swe", "mode=async", "cluster=dense_h100",
                                  "cluster.num_engines=4", "policy.num_prefill=1", "mode.max_in_flight=24"],
    "colocate-heavy-sync-moe2": ["+experiment=heavy_prefill", "policy=colocate", "cluster.num_engines=2",
                                 "workload.batch_size=4"],
    "fixed_pd-heavy-sync-moe": ["+experiment=heavy_prefill", "policy=fixed_pd", "policy.num_prefill=3",
                                "workload.batch_size=4"],
    "fixed_pd-tooluse-sync-sglang": ["policy=fixed_pd", "workload=tooluse", "mode=sync", "cluster=moe_h200_sglang"],
    "colocate-search-async-sglang-mixed": ["policy=colocate", "workload=search", "mode=async", "cluster=moe_h200_sglang",
                                           "cluster.enable_mixed_chunk=true", "mode.max_in_flight=24"],
}
# `--experiments`: Prorsa on each simulated experiment of REPRODUCE.md (configs/experiment/), at the
# small size above: the check for a refactoring of the policy or of what an experiment turns on.
EXPERIMENTS = {f"prorsa-{p.stem}": [f"+experiment={p.stem}", "policy=prorsa"]
               for p in sorted((ROOT / "configs" / "experiment").glob("*.yaml")) if not p.stem.startswith("vllm_cpu")}


def lifecycle_hash(overrides: list[str]) -> str:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(config_name="config", overrides=["logger=none", *SMALL, *overrides])
    result, _ = run_rollout(cfg)
    buf = io.BytesIO()
    lifecycle_frame(result).to_parquet(buf, index=False)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def recorded_on() -> dict[str, str]:
    """What the bytes depend on besides the code: numpy's version and the SIMD levels it runs with."""
    try:   # (np.show_runtime's source; numpy._core from numpy 2, numpy.core before)
        from numpy._core import _multiarray_umath as umath
    except ImportError:
        from numpy.core import _multiarray_umath as umath
    simd = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
    return {"numpy": np.__version__, "simd": " ".join(simd)}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="record the hashes instead of checking them")
    ap.add_argument("--print", action="store_true", help="print the hashes (JSON) instead of checking them")
    ap.add_argument("--experiments", action="store_true", help="also Prorsa on every simulated experiment")
    args = ap.parse_args()
    configs = {**CONFIGS, **EXPERIMENTS} if args.experiments else CONFIGS
    hashes = {name: lifecycle_hash(ov) for name, ov in configs.items()}
    if args.print:
        print(json.dumps(hashes, indent=1))
        return 0
    here = recorded_on()
    if args.write:
        REFERENCE.write_text(json.dumps({"recorded_on": here, "hashes": hashes}, indent=2) + "\n")
        logging.info("wrote %d hashes to %s", len(hashes), REFERENCE.relative_to(ROOT))
        return 0
    data = json.loads(REFERENCE.read_text())
    if data["recorded_on"] != here:
        logging.warning("the hashes were recorded with %s, this machine has %s: a difference below may be the "
                        "machine's rounding, not the code (record the base commit's hashes here first)",
                        data["recorded_on"], here)
    reference = data["hashes"]
    changed = [n for n in configs if reference.get(n) != hashes[n]]
    for name in configs:
        logging.info("%-34s %s", name, "CHANGED" if name in changed else "same")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
