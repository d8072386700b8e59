#!/bin/bash
# Issue #48, second round (session 29 or later): the ring with its corrections read from the stage's own x
# (experiments/ring-corrections-from-smem.diff: apply it first, `git apply` on the commit it names, then build.py).
# GPU tests (stop on a failure, with a memcheck of one case), then the ring against gemvz's rows with and without the
# corrections on the four bf16 layers at m = 32 (parts.py), then a compressed retune at m = 16 / 32 with both families,
# build.py and README's judge, as time allows. Logs to $OUT.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
T0=$(date +%s); left() { echo $(( ${BUDGET:-585} - ($(date +%s) - T0) )); }
timeout 150 python3 -m pytest -q -x tests/test_tmaz.py 2>&1 | tee $OUT/pytest-tmaz.log | tail -4
rc=${PIPESTATUS[0]}; echo "tests rc=$rc at $(( $(date +%s) - T0 )) s"
if [ "$rc" != 0 ]; then
  case=$(grep -m1 -o "^FAILED tests/test_tmaz.py::[^ ]*" $OUT/pytest-tmaz.log | cut -d' ' -f2)
  timeout 120 compute-sanitizer --tool memcheck python3 -m pytest -q -x "$case" 2>&1 | tail -30 > $OUT/memcheck.log
  tail -12 $OUT/memcheck.log; exit 1
fi
timeout 100 python3 experiments/ring/parts.py 2>&1 | grep "\[parts\]" | tee $OUT/parts.log
timeout 80 python3 experiments/ring/parts.py --others 2>&1 | grep "\[parts\]" | tee $OUT/parts-others.log
[ $(left) -gt 240 ] || exit 0
timeout $(( $(left) - 130 )) python3 tune.py --paths compressed --families gemvz,gemvtz --m 16,32 \
  --layers qkv_gate,o_proj,pooler,unpooler 2>&1 | tee $OUT/tune.log | grep -E "^\[tune [0-9]|done|WRONG" | cut -c1-260
cp tables/*/ztable.json $OUT/ 2>/dev/null; python3 build.py | tail -1
timeout $(( $(left) - 5 )) python3 judge.py > $OUT/judge.log 2>&1
grep -E "^(qkv_gate|o_proj|pooler|unpooler) +(16|32) |score|m=32|checks passed" $OUT/judge.log | cut -c1-200
echo "all $(( $(date +%s) - T0 )) s"
