#!/usr/bin/env bash
# The outputs of scripts/reproduce.sh in OUT replace the committed results in results/reference/ (tables,
# the figures REPRODUCE.md names, the steps' timing), then REPRODUCE.md is rendered from them.
#   bash scripts/publish_reference.sh OUT        (MAPS=0: OUT has no regime maps; keep the committed ones)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/publish_reference.sh OUT}
PY=${PYTHON:-.venv/bin/python}
R=results/reference
cp "$OUT"/report/{speedup.md,speedup.csv,prorsa.csv,claims.md,claims.json} "$R"/
cp "$OUT"/report-ablations/speedup.md "$R"/ablations.md
cp "$OUT"/report-ablations/prorsa.csv "$R"/ablations.csv
cp "$OUT"/report-shift/speedup.md "$R"/shift.md
cp "$OUT"/report-shift/speedup.csv "$R"/shift.csv
cp "$OUT"/report-shift/prorsa.csv "$R"/shift_prorsa.csv
for f in "$R"/figures/*; do   # the figures REPRODUCE.md names: section 4's report's first, then the others'
  new=""
  for d in report report-shift report-ablations; do
    if [ -z "$new" ] && [ -f "$OUT/$d/figures/$(basename "$f")" ]; then new="$OUT/$d/figures/$(basename "$f")"; fi
  done
  if [ -n "$new" ]; then cp "$new" "$f"; else echo "publish_reference.sh: no $(basename "$f") in $OUT/report*/figures" >&2; fi
done
if [ "${MAPS:-1}" = 1 ]; then
  cp "$OUT"/regime_map/regime_map.csv "$R"/regime_map.csv
  cp "$OUT"/regime_map/regime_map_sync.{png,pdf} "$R"/
  cp "$OUT"/regime_map_async/regime_map.csv "$R"/regime_map_async.csv
  cp "$OUT"/regime_map_async/regime_map_async.{png,pdf} "$R"/
  cp "$OUT"/regime_map_async_long/regime_map.csv "$R"/regime_map_async_long.csv
  for ext in png pdf; do cp "$OUT"/regime_map_async_long/regime_map_async.$ext "$R"/regime_map_async_long.$ext; done
  cp "$OUT"/regime_map_load/regime_map.csv "$R"/regime_map_load.csv
  cp "$OUT"/regime_map_load/regime_map_load_{sync,async}.{png,pdf} "$R"/
fi
sed "s#$OUT#OUT#g" "$OUT"/timing.tsv > "$R"/timing.tsv   # the steps as reproduce.sh names them
"$PY" scripts/claims.py --render
