#!/bin/bash
# Issue #48's first device call for the rebuilt ring (gemvtz_kernel, csrc/gemvtz.cuh): GPU tests (stop on a failure),
# a compressed retune at m = 16 and 32 of the four bf16 layers with gemvz and gemvtz both candidates (this card's
# tables only), build.py, then README's judge. Logs to $OUT.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
T0=$(date +%s); left() { echo $(( ${BUDGET:-585} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/gpu.txt
timeout 230 python3 -m pytest -q -x --durations=5 tests/test_tmaz.py 2>&1 | tee $OUT/pytest-tmaz.log | tail -15
rc=${PIPESTATUS[0]}; echo "tests rc=$rc at $(( $(date +%s) - T0 )) s"
if [ "$rc" != 0 ]; then
  case=$(grep -m1 -o "tests/test_tmaz.py::[^ ]*" $OUT/pytest-tmaz.log)
  echo "FAILED: $case; memcheck of the first failing test:"
  timeout 120 compute-sanitizer --tool memcheck python3 -m pytest -q -x "$case" 2>&1 | tail -30 > $OUT/memcheck.log
  tail -12 $OUT/memcheck.log; exit 1
fi
timeout $(( $(left) - 110 )) python3 tune.py --paths compressed --families gemvz,gemvtz --m 16,32 \
  --layers qkv_gate,o_proj,pooler,unpooler 2>&1 | tee $OUT/tune.log | grep -E "^\[tune [0-9]|compiled|done|WRONG" | cut -c1-260
cp tables/h100/ztable.json $OUT/ztable-h100.json 2>/dev/null; cp tables/h200/ztable.json $OUT/ztable-h200.json
python3 build.py | tail -2
echo "judge budget $(left) s"
timeout $(left) python3 judge.py > $OUT/judge.log 2>&1
grep -E "^(qkv_gate|o_proj|pooler|unpooler) +(16|32) |score|m=32|m=16|checks passed" $OUT/judge.log | cut -c1-200
cp $(ls -t results/judge-*.json | head -1) $OUT/ 2>/dev/null; echo "all $(( $(date +%s) - T0 )) s"
