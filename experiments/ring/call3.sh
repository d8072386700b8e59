#!/bin/bash
# Issue #48, second device call of session 28 (after the slot-release fix, mbar_arrive_after): the ring's GPU tests,
# a compressed retune at m = 32 (gemvz and gemvtz both candidates; this card's tables), build.py, README's judge, then
# the planner alone at m = 32 on the public shapes (trained-like), as time allows. Logs to $OUT.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
T0=$(date +%s); left() { echo $(( ${BUDGET:-585} - ($(date +%s) - T0) )); }
timeout 150 python3 -m pytest -q -x tests/test_tmaz.py 2>&1 | tee $OUT/pytest-tmaz.log | tail -4
rc=${PIPESTATUS[0]}; echo "tests rc=$rc at $(( $(date +%s) - T0 )) s"; [ "$rc" != 0 ] && exit 1
timeout 200 python3 tune.py --paths compressed --families gemvz,gemvtz --m 32 --layers qkv_gate,o_proj,pooler,unpooler \
  2>&1 | tee $OUT/tune.log | grep -E "^\[tune [0-9]|compiled|done|WRONG" | cut -c1-300
cp tables/h100/ztable.json $OUT/ztable-h100.json; python3 build.py | tail -1
timeout 150 python3 judge.py > $OUT/judge.log 2>&1
grep -E "^(qkv_gate|o_proj|pooler|unpooler) +32 |score|m=32|checks passed" $OUT/judge.log | cut -c1-200
cp $(ls -t results/judge-*.json | head -1) $OUT/ 2>/dev/null
echo "public at $(( $(date +%s) - T0 )) s, $(left) s left"
[ $(left) -gt 60 ] && timeout $(( $(left) - 10 )) python3 judge.py --shapes public --m 32 > $OUT/public.log 2>&1
grep -E "score|geomean|checks passed|x cuBLAS" $OUT/public.log | tail -8; tail -18 $OUT/public.log | cut -c1-160
echo "all $(( $(date +%s) - T0 )) s"
