#!/bin/bash
# session 25 device call 1 (issue #41, quad slots): build, GPU tests, format A/B against main's kernel
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
t0=$(date +%s)
( time python3 -c "import time; t=time.time(); import submission; print('import', round(time.time()-t,1), 's')" ) > $OUT/import.log 2>&1
echo "import done $(( $(date +%s) - t0 )) s"; tail -4 $OUT/import.log
timeout 170 python3 -m pytest -q --maxfail=25 tests/test_gpu.py > $OUT/pytest-gpu.log 2>&1
echo "pytest done $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|^FAILED|^ERROR|Error" $OUT/pytest-gpu.log | tail -30
timeout 300 python3 tools/format_bench.py --base bench_base/submission_main.py --layers o_proj,pooler,qkv_gate \
  --weights trained,gaussian,exc1,pruned30 --m 1,16 --replays 10 --json $OUT/format.json > $OUT/format.log 2>&1
echo "format done $(( $(date +%s) - t0 )) s"; grep "\[format\]" $OUT/format.log | tail -60; tail -5 $OUT/format.log
