#!/usr/bin/env bash
# One device call: build (cold + warm import time), GPU tests, judge, optional tuning. Logs under $OUT.
# usage: tools/device.sh [stages...]   stages: build tests judge judgefull tune rebuild sanitize
#        (default: build tests judge); TUNE_ARGS and BUDGET (seconds) from the environment
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=${*:-build tests judge}
T0=$(date +%s)
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/build.log" 2>&1
for st in $stages; do
  echo "=== $st ($(left) s left)"
  case $st in
    build)
      { /usr/bin/time -f "cold import %e s" python3 -c "import submission"; \
        /usr/bin/time -f "warm import %e s" python3 -c "import submission"; } 2>&1 | tee -a "$OUT/build.log" | tail -4 ;;
    tests)
      timeout $(( $(left) / 2 )) python3 -m pytest -q --maxfail=10 --durations=5 tests/test_gpu.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25 ;;
    rebuild)
      python3 build.py 2>&1 | tee "$OUT/rebuild.log"; cp submission.py "$OUT/submission.py" ;;
    judge)
      timeout $(( $(left) - 20 )) python3 judge.py --quick --no-correctness --json "$OUT/judge_quick.json" 2>&1 | tee "$OUT/judge_quick.log" | tail -40 ;;
    judgefull)
      timeout $(( $(left) - 20 )) python3 judge.py --json "$OUT/judge.json" 2>&1 | tee "$OUT/judge.log" | tail -45 ;;
    tune)
      python3 tune.py --budget-s $(( $(left) - 30 )) ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log" | tail -40
      cp tables/ctable.json tables/ztable.json "$OUT/" ;;
    excost)
      timeout $(( $(left) - 10 )) python3 tools/exception_cost.py 2>&1 | tee "$OUT/excost.log" ;;
    sanitize)
      PYTHONPATH=. timeout $(( $(left) - 10 )) compute-sanitizer --tool racecheck python3 tools/sanitize_case.py 2>&1 | tail -15 | tee "$OUT/racecheck.log"
      PYTHONPATH=. timeout $(( $(left) - 10 )) compute-sanitizer --tool synccheck python3 tools/sanitize_case.py 2>&1 | tail -15 | tee "$OUT/synccheck.log" ;;
  esac
done
echo "=== done in $(( $(date +%s) - T0 )) s"
