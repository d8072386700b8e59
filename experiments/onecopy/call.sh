#!/bin/bash
# Issue #50's first device call for one copy (session 29 or later): the one-copy GPU tests and the drop-in's, the
# m > 32 path's time against cuBLAS on the caller's tensor (Llama-3-8B shapes, 512 and 2048 tokens), then the example
# on the 32-layer Llama-3-8B-dims model with one copy (the default), as time allows. Logs to $OUT.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
T0=$(date +%s); left() { echo $(( ${BUDGET:-585} - ($(date +%s) - T0) )); }
timeout 200 python3 -m pytest -q tests/test_onecopy.py tests/test_nn.py 2>&1 | tee $OUT/pytest.log | tail -6
timeout 120 python3 experiments/onecopy/prefill.py 2>&1 | tee $OUT/prefill.log | grep "\[prefill\]"
[ $(left) -gt 200 ] && timeout $(( $(left) - 10 )) python3 examples/llama_decode.py --steps 30 --seeds 2 \
  --out $OUT/e2e.json 2>&1 | tee $OUT/e2e.log | tail -30
echo "all $(( $(date +%s) - T0 )) s"
