#!/usr/bin/env bash
# Runs every experiment of REPRODUCE.md on the simulator and writes the reference tables and figures.
#   bash scripts/reproduce.sh [OUT]      (OUT defaults to results/reproduce)
#   RAY=1 bash scripts/reproduce.sh       each sweep's jobs in parallel on a local Ray, one per core
#                                         (the same numbers: every job is its own seeded process)
#   LARGE=1 bash scripts/reproduce.sh     also section 5's curriculum on 64 H200 (16 engines: 56 runs,
#                                         several hours on a 2-core machine; nothing in results/reference)
#   MAPS=0 bash scripts/reproduce.sh      without section 6's regime maps (about half the set's time)
#   PUBLISH=1 bash scripts/reproduce.sh   then replace the committed results in results/reference/ with
#                                         OUT's and render REPRODUCE.md (scripts/publish_reference.sh)
# Each block is one Hydra multirun; rerunning skips the jobs already complete.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/reproduce}
PY=${PYTHON:-.venv/bin/python}
POLICIES=colocate,prorsa,reactive_pd,ppd,oracle_pd
BASELINES=reactive_pd,ppd,oracle_pd   # at seeds 1 and 2 (pearl runs its three seeds on its own line)
LAUNCH=(); MAP=()
if [ "${RAY:-0}" = 1 ]; then
  LAUNCH=(hydra/launcher=ray +hydra.launcher.ray.init.include_dashboard=false); MAP=(--ray)
fi
mkdir -p "$OUT"
# Each step's wall time goes to OUT/timing.tsv (seconds, then the step), so a run resumed after a stop
# still adds up to the whole set's time (a step interrupted midway is best removed, to be timed whole).
timed() {
  local start=$SECONDS
  "$@"
  printf '%s\t%s\n' "$((SECONDS - start))" "${*:2}" >> "$OUT/timing.tsv"
}
sweep() { timed "$PY" run.py -m hydra.sweep.dir="$OUT/$1" "${@:2}" "${LAUNCH[@]}"; }

for exp in search swe tooluse; do
  for mode in sync async; do
    extra=()
    [ "$mode" = async ] && extra=(mode=async mode.num_steps=2 "mode.max_in_flight=256")
    sweep "$exp-$mode" +experiment=$exp policy=$POLICIES "${extra[@]}"
    sweep "$exp-$mode" +experiment=$exp policy=fixed_pd policy.num_prefill=1,2,3,4,5,6,7 "${extra[@]}"
    sweep "$exp-$mode" +experiment=$exp policy=pearl seed=0,1,2 "${extra[@]}"
  done
done
for exp in drift heavy_prefill; do
  sweep "$exp" +experiment=$exp policy=$POLICIES
  sweep "$exp" +experiment=$exp policy=fixed_pd policy.num_prefill=1,2,3,4,5,6,7
  sweep "$exp" +experiment=$exp policy=pearl seed=0,1,2
done
# Section 4 at seeds 1 and 2 (seed 0 above): colocation, Prorsa, every split and the baselines, for the
# mean and spread.
for exp in search tooluse; do
  for mode in sync async; do
    extra=()
    [ "$mode" = async ] && extra=(mode=async mode.num_steps=2 "mode.max_in_flight=256")
    sweep "$exp-$mode" +experiment=$exp policy=colocate,prorsa seed=1,2 "${extra[@]}"
    sweep "$exp-$mode" +experiment=$exp policy=fixed_pd policy.num_prefill=1,2,3,4,5,6,7 seed=1,2 "${extra[@]}"
    sweep "$exp-$mode" +experiment=$exp policy=$BASELINES seed=1,2 "${extra[@]}"
  done
done
for exp in heavy_prefill drift; do
  sweep "$exp" +experiment=$exp policy=colocate,prorsa seed=1,2
  sweep "$exp" +experiment=$exp policy=fixed_pd policy.num_prefill=1,2,3,4,5,6,7 seed=1,2
  sweep "$exp" +experiment=$exp policy=$BASELINES seed=1,2
done
sweep swe-sync +experiment=swe policy=colocate,prorsa seed=1,2
sweep swe-sync +experiment=swe policy=fixed_pd policy.num_prefill=1,2,3,4,5,6,7 seed=1,2
sweep swe-sync +experiment=swe policy=$BASELINES seed=1,2
swe_async=(mode=async mode.num_steps=2 "mode.max_in_flight=256")
sweep swe-async +experiment=swe policy=colocate,prorsa seed=1,2 "${swe_async[@]}"
sweep swe-async +experiment=swe policy=fixed_pd policy.num_prefill=1,2,3,4,5,6,7 seed=1,2 "${swe_async[@]}"
sweep swe-async +experiment=swe policy=$BASELINES seed=1,2 "${swe_async[@]}"
# Claim 2b, stage-specific parallelism: heavy_prefill's 6P2D split (TP4 prefill engines, above) with DP4+EP4
# prefill engines instead.
sweep stage_parallelism +experiment=heavy_prefill policy=fixed_pd policy.num_prefill=6 \
  cluster.parallelism.prefill.tp=1 cluster.parallelism.prefill.dp=4 cluster.parallelism.prefill.ep=true seed=0,1,2
# Ablations on the prefill-heavy setting: forecasting off, role switching off, horizon, switch cost.
sweep ablations +experiment=heavy_prefill policy=colocate
sweep ablations +experiment=heavy_prefill policy=prorsa policy.forecast=true,false policy.switching=true,false
sweep ablations +experiment=heavy_prefill policy=prorsa policy.initial=colocated policy.forecast=true,false \
  policy.switching=true,false
sweep ablations +experiment=heavy_prefill policy=prorsa policy.horizon_s=5,10,40
sweep ablations +experiment=heavy_prefill policy=prorsa,colocate cluster.switch_time_s=1,30 \
  cluster.reshard_switch_time_s=10,120
# Section 5: the mix that shifts during the run, with resharding and with vLLM's kv_both switch (moe_h200),
# and with kv_both on the dense cluster; colocation, every split, Prorsa and PEARL at three seeds, the
# ablations (switching off, forecasting off, a colocated start) at seed 0.
SHIFTS=(shift_reason_browse shift_reason_browse_kvboth shift_reason_browse_dense8)
for exp in "${SHIFTS[@]}"; do
  sweep "$exp" +experiment=$exp policy=colocate,prorsa seed=0,1,2
  sweep "$exp" +experiment=$exp policy=fixed_pd policy.num_prefill=1,2,3,4,5,6 seed=0,1,2
  sweep "$exp" +experiment=$exp policy=pearl
  sweep "$exp" +experiment=$exp policy=prorsa policy.switching=false
  sweep "$exp" +experiment=$exp policy=prorsa policy.forecast=false
  sweep "$exp" +experiment=$exp policy=pearl seed=1,2
  sweep "$exp" +experiment=$exp policy=prorsa policy.initial=colocated
done
timed "$PY" -m harness.report "$OUT"/search-sync "$OUT"/search-async "$OUT"/swe-sync "$OUT"/swe-async \
  "$OUT"/tooluse-sync "$OUT"/tooluse-async "$OUT"/drift "$OUT"/heavy_prefill --out "$OUT/report"
timed "$PY" -m harness.report "$OUT"/ablations --out "$OUT/report-ablations"
timed "$PY" scripts/claims.py "$OUT" "$OUT/report/claims.md"
# Section 6, the regime map (96 sync cells here; the 48 async ones below: DP1-8 with 50- and 500-token
# answers and DP16 in OUT/regime_map_async, 8,000-token answers on DP1-DP16 in OUT/regime_map_async_long;
# CSV and heatmaps in each), and section 4's performance-model accuracy (writes
# results/reference/whatif_accuracy.csv itself).
if [ "${MAPS:-1}" = 1 ]; then timed "$PY" scripts/regime_map.py "$OUT/regime_map" --grid coarse "${MAP[@]}"; fi
timed "$PY" scripts/whatif_accuracy.py
# The same curriculum in sync RL (kv_both, moe_h200): colocation, every split, Prorsa and PEARL at three
# seeds, the three ablations at seed 0.
SYNC=shift_reason_browse_sync
sweep $SYNC +experiment=$SYNC policy=colocate,prorsa seed=0,1,2
sweep $SYNC +experiment=$SYNC policy=fixed_pd policy.num_prefill=1,2,3,4,5,6,7 seed=0,1,2
sweep $SYNC +experiment=$SYNC policy=prorsa policy.switching=false
sweep $SYNC +experiment=$SYNC policy=prorsa policy.forecast=false
sweep $SYNC +experiment=$SYNC policy=pearl
sweep $SYNC +experiment=$SYNC policy=pearl seed=1,2
sweep $SYNC +experiment=$SYNC policy=prorsa policy.initial=colocated
# SGLang's role switch (drain) on the MoE curriculum: Prorsa at three seeds and its ablations; the statics are the ones above.
sweep shift_reason_browse_drain +experiment=shift_reason_browse cluster.switch_mechanism=drain policy=prorsa seed=0,1,2
sweep shift_reason_browse_drain +experiment=shift_reason_browse cluster.switch_mechanism=drain policy=prorsa policy.switching=false
sweep shift_reason_browse_drain +experiment=shift_reason_browse cluster.switch_mechanism=drain policy=prorsa policy.forecast=false
sweep shift_reason_browse_drain +experiment=shift_reason_browse cluster.switch_mechanism=drain policy=prorsa policy.initial=colocated
# The kv_both curriculum with decode migration (cluster.migrate_decodes_on_switch=true): Prorsa at three
# seeds; the statics are the ones above (a static allocation never switches, so it never migrates); and
# with Prorsa's first turns placed by forecast decode work (policy.placement=forecast_work).
MIG=cluster.migrate_decodes_on_switch=true
sweep shift_reason_browse_kvboth_migrate +experiment=shift_reason_browse_kvboth $MIG policy=prorsa seed=0,1,2
sweep shift_reason_browse_kvboth_migrate_placement +experiment=shift_reason_browse_kvboth $MIG \
  policy=prorsa policy.placement=forecast_work seed=0,1,2
timed "$PY" -m harness.report "${SHIFTS[@]/#/$OUT/}" "$OUT"/shift_reason_browse_{drain,kvboth_migrate,kvboth_migrate_placement} \
  "$OUT/$SYNC" --out "$OUT/report-shift"
# The async regime map; its 16 cells with 8,000-token answers, the slowest of the set, apart.
if [ "${MAPS:-1}" = 1 ]; then
  timed "$PY" scripts/regime_map.py "$OUT/regime_map_async" --grid async async_dp16 "${MAP[@]}"
  timed "$PY" scripts/regime_map.py "$OUT/regime_map_async_long" --grid async_long "${MAP[@]}"
  # the load (2, 8, 32 trajectories per GPU) and tool-latency (0.2, 2, 20 s) axes, DP4 and DP8
  timed "$PY" scripts/regime_map.py "$OUT/regime_map_load" --grid load "${MAP[@]}"
fi
# With LARGE=1, the kv_both curriculum on 16 engines (64 H200): colocation, every split and Prorsa at
# three seeds, both ablations at seed 0, and Prorsa with decode migration at three seeds.
E64=shift_reason_browse_kvboth_64gpu
if [ "${LARGE:-0}" = 1 ]; then
sweep $E64 +experiment=$E64 policy=colocate,prorsa seed=0,1,2
sweep $E64 +experiment=$E64 policy=fixed_pd policy.num_prefill=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 seed=0,1,2
sweep $E64 +experiment=$E64 policy=prorsa policy.switching=false
sweep $E64 +experiment=$E64 policy=prorsa policy.forecast=false
sweep ${E64}_migrate +experiment=$E64 $MIG policy=prorsa seed=0,1,2
timed "$PY" -m harness.report "$OUT/$E64" "$OUT/${E64}_migrate" --out "$OUT/report-shift-64gpu"
fi
# PUBLISH=1: OUT's tables, figures and timing replace the committed ones, and REPRODUCE.md is rendered.
if [ "${PUBLISH:-0}" = 1 ]; then PYTHON="$PY" bash scripts/publish_reference.sh "$OUT"; fi
# A step rerun after a stop only skips its complete jobs: the whole set's time counts each step's first run.
awk -F'\t' '!seen[$2]++ {s += $1; n++} END {printf "reproduce.sh: %d steps, %.0f s in all (OUT/timing.tsv)\n", n, s}' "$OUT/timing.tsv"
