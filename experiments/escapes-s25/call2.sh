#!/bin/bash
# session 25 device call 2 (issue #41): where the fixed cost goes (staging wait, scatter), pf and mb
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 260 python3 tools/ab.py --variant '' --variant MUSE_SKIP_ESCAPES --variant MUSE_SKIP_STAGE_WAIT --variant MUSE_SKIP_STAGING \
  --rounds 3 --replays 10 o_proj:1:compressed o_proj:16:compressed pooler:1:compressed pooler:16:compressed > $OUT/ab-stage.log 2>&1
echo "ab1 done $(( $(date +%s) - t0 )) s"; grep -v "^\[muse\]" $OUT/ab-stage.log | tail -24
timeout 150 python3 tools/ab.py --field pf=0,1 --rounds 3 --replays 10 o_proj:1:compressed pooler:1:compressed > $OUT/ab-pf.log 2>&1
echo "ab2 done $(( $(date +%s) - t0 )) s"; grep -v "^\[muse\]" $OUT/ab-pf.log | tail -12
timeout 120 python3 tools/ab.py --field mb=0,3 --rounds 3 --replays 10 qkv_gate:1:compressed > $OUT/ab-mb.log 2>&1
echo "ab3 done $(( $(date +%s) - t0 )) s"; grep -v "^\[muse\]" $OUT/ab-mb.log | tail -8
