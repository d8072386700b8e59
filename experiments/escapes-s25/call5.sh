#!/bin/bash
# session 25 device call 5 (issue #41; calls 4 and 4b were lost to the device): entries read ahead into registers and
# scattered after the mma, x before the staging wait; where the time goes, ug on the m=16 rows, format A/B vs main
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 150 python3 tools/ab.py --variant '' --variant MUSE_SKIP_ESCAPES --variant MUSE_SKIP_STAGING --rounds 3 --replays 10 \
  o_proj:1:compressed o_proj:16:compressed pooler:1:compressed pooler:16:compressed qkv_gate:1:compressed > $OUT/ab-stage.log 2>&1
echo "ab done $(( $(date +%s) - t0 )) s"; grep "compressed Gemvz" $OUT/ab-stage.log
timeout 60 python3 tools/ab.py --field ug=1,2 --rounds 2 --replays 10 o_proj:16:compressed pooler:16:compressed > $OUT/ab-ug.log 2>&1
echo "ab-ug done $(( $(date +%s) - t0 )) s"; grep "compressed Gemvz\|skipped" $OUT/ab-ug.log
timeout 200 python3 tools/format_bench.py --base bench_base/submission_main.py --layers o_proj,pooler,qkv_gate \
  --weights trained,gaussian,exc0.3,exc1,pruned30,sparse24 --m 1,8,16 --replays 10 --json $OUT/format.json > $OUT/format.log 2>&1
echo "format done $(( $(date +%s) - t0 )) s"; grep "\[format\]" $OUT/format.log | grep -v wrote | tail -80
