#!/bin/bash
# session 25 device call 3 (issue #41): staging loads batched before use, scatter one batch ahead, qkv_gate mb=3
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 120 python3 tools/ab.py --variant '' --variant MUSE_SKIP_STAGING --rounds 3 --replays 10 \
  o_proj:1:compressed pooler:16:compressed qkv_gate:1:compressed > $OUT/ab-stage.log 2>&1
echo "ab done $(( $(date +%s) - t0 )) s"; grep "compressed Gemvz" $OUT/ab-stage.log
timeout 330 python3 tools/format_bench.py --base bench_base/submission_main.py --layers o_proj,pooler,qkv_gate \
  --weights trained,gaussian,exc1,pruned30 --m 1,16 --replays 10 --json $OUT/format.json > $OUT/format.log 2>&1
echo "format done $(( $(date +%s) - t0 )) s"; grep "\[format\]" $OUT/format.log | grep -v wrote | tail -40
