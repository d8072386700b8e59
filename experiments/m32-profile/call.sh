#!/bin/bash
# Issue #42's first device call (not yet run): ncu of 116d358's gemvtz_kernel against gemvt at m = 32, then their SPEC
# times. Needs bench_base/submission_116d358.py in the working tree (untracked, carried to the device):
#   mkdir -p bench_base && git show 116d358:submission.py > bench_base/submission_116d358.py
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 330 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section Occupancy --section LaunchStats -k regex:gemvt -c 12 \
  python3 experiments/m32-profile/profile_gemvtz.py --calls 1 > $OUT/ncu-m32.log 2>&1
echo "ncu done $(( $(date +%s) - t0 )) s"; grep -E "\[m32\]|gemvt|Duration|DRAM Throughput|Memory Throughput|Issued Warp|No Eligible|Registers Per|Achieved Occ|Warp Cycles Per Issued" $OUT/ncu-m32.log | head -120
timeout 200 python3 experiments/m32-profile/profile_gemvtz.py --time > $OUT/time-m32.log 2>&1
echo "time done $(( $(date +%s) - t0 )) s"; grep "\[m32\]" $OUT/time-m32.log
