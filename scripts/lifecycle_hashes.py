"""Lifecycle parquet hashes of a fixed set of simulator configurations.

`python scripts/lifecycle_hashes.py --write` records them in scripts/lifecycle_hashes.json;
without `--write` it reruns the set and reports every configuration whose lifecycle changed; `--print`
prints them (tests/test_native.py compares the compiled simulator's with the sources'). A change to
the simulator that must not move any result (a refactoring) keeps every hash.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import sys
from pathlib import Path

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
}


def lifecycle_hash(overrides: list[str]) -> str:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(config_name="config", overrides=["logger=none", *SMALL, *overrides])
    result, _ = run_rollout(cfg)
    buf = io.BytesIO()
    lifecycle_frame(result).to_parquet(buf, index=False)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="record the hashes instead of checking them")
    ap.add_argument("--print", action="store_true", help="print the hashes (JSON) instead of checking them")
    args = ap.parse_args()
    hashes = {name: lifecycle_hash(ov) for name, ov in CONFIGS.items()}
    if args.print:
        print(json.dumps(hashes, indent=1))
        return 0
    if args.write:
        REFERENCE.write_text(json.dumps(hashes, indent=2) + "\n")
        logging.info("wrote %d hashes to %s", len(hashes), REFERENCE.relative_to(ROOT))
        return 0
    reference = json.loads(REFERENCE.read_text())
    changed = [n for n in CONFIGS if reference.get(n) != hashes[n]]
    for name in CONFIGS:
        logging.info("%-34s %s", name, "CHANGED" if name in changed else "same")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
