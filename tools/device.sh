#!/usr/bin/env bash
# One device call: build (cold + warm import time), GPU tests, judge, tuning. Logs go to $OUT/run/ and leave
# as one archive, $OUT/run.tgz (the device tool returns at most 8 files).
# usage: tools/device.sh [stages...]   stages: build tests judge judgefull tune rebuild
#        sanitize racemin ncu trace ab sass probe prebuild pytest (default: build tests judge). tools/README.md says
#        which tool each stage runs. From the env: TUNE_ARGS, NCU_CASES, NCU_METRICS (extra,
#        comma-separated), TRACE_CASES (may start with --define NAME), PROBE_ARGS, PYTEST_ARGS (default
#        tests/test_tma.py), PYTEST_S and BUDGET (seconds); the ab stage (tools/ab.py): AB_VARIANTS (space-separated,
#        '-' = shipped; e.g. '- MUSE_SKIP_CORRECTIONS', the exception cost), AB_FIELD (e.g. pf=0,1), AB_CASES (default
#        router:1), AB_ARGS (e.g. --preps 3 --xallocs 3, the spread over placements). A failing pytest stage skips the
#        stages after it. prebuild: the shipped extension, and those of the ab, trace, tune (TUNE_ARGS set) and probe
#        stages asked, compiled in parallel (ab and trace build only the instantiations their cases need: seconds)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R="$OUT/run"; mkdir -p "$R"
stages=${*:-build tests judge}
T0=$(date +%s)
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - T0) )); }
asked() { [[ " $stages " == *" $1 "* ]]; }
AB_CASES=${AB_CASES:-router:1}; TRACE_CASES=${TRACE_CASES:-router:1 pooler:1}
av=(); for v in ${AB_VARIANTS:--}; do [ "$v" = - ] && v=""; av+=(--variant "$v"); done
af=(${AB_FIELD:+--field "$AB_FIELD"})
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$R/build.log" 2>&1
for st in $stages; do
  echo "=== $st ($(left) s left)"
  if [ -n "${gate_failed:-}" ]; then echo "skipped: the pytest stage failed (a broken kernel may hang the rest)"; continue; fi
  case $st in
    pytest)
      timeout ${PYTEST_S:-200} python3 -m pytest -q --maxfail=5 --durations=5 ${PYTEST_ARGS:-tests/test_tma.py} \
        2>&1 | tee "$R/pytest_extra.log" | tail -25
      [ "${PIPESTATUS[0]}" = 0 ] || gate_failed=1 ;;
    build)
      { /usr/bin/time -f "cold import %e s" python3 -c "import submission"; \
        /usr/bin/time -f "warm import %e s" python3 -c "import submission"; } 2>&1 | tee -a "$R/build.log" | tail -4 ;;
    tests)
      timeout $(( $(left) / 2 )) python3 -m pytest -q --maxfail=10 --durations=5 tests/test_gpu.py tests/test_tma.py \
        2>&1 | tee "$R/pytest_gpu.log" | tail -25 ;;
    rebuild)
      python3 build.py 2>&1 | tee "$R/rebuild.log"; cp submission.py "$R/submission.py" ;;
    judge)
      timeout $(( $(left) - 20 )) python3 judge.py --quick --no-correctness --json "$R/judge_quick.json" 2>&1 | tee "$R/judge_quick.log" | tail -40 ;;
    judgefull)
      timeout $(( $(left) - 20 )) python3 judge.py --json "$R/judge.json" 2>&1 | tee "$R/judge.log" | tail -45 ;;
    tune)
      python3 tune.py --budget-s $(( $(left) - 30 )) ${TUNE_ARGS:-} 2>&1 | tee "$R/tune.log" | tail -40
      cp tables/ctable.json tables/ztable.json "$R/" ;;
    ncu)
      PYTHONPATH=. timeout $(( $(left) - 10 )) ncu -k regex:gemv --cache-control all --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
        --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct${NCU_METRICS:+,$NCU_METRICS} \
        python3 tools/ncu_case.py ${NCU_CASES:-pooler:1} > "$R/ncu.log" 2>&1; tail -5 "$R/ncu.log" ;;
    probe)
      PYTHONPATH=. timeout $(( $(left) - 10 )) python3 tools/pdl_probe.py ${PROBE_ARGS:-} 2>&1 | tee "$R/probe.log" ;;
    trace)
      PYTHONPATH=. timeout $(( $(left) - 10 )) python3 tools/trace_chain.py $TRACE_CASES 2>&1 | tee "$R/trace.log" ;;
    ab)
      PYTHONPATH=. timeout $(( $(left) - 10 )) python3 tools/ab.py ${AB_ARGS:-} "${av[@]}" "${af[@]}" $AB_CASES 2>&1 | tee "$R/ab.log" ;;
    sass)
      so=$(python3 -c "import submission as S; print(S.build_extension().__file__)" 2>/dev/null | tail -1)
      cuobjdump -sass "$so" > "$R/sass.txt" 2>&1; grep -c "Function" "$R/sass.txt"; gzip "$R/sass.txt" ;;
    prebuild)
      python3 -c "import submission" > "$R/prebuild.log" 2>&1 &
      if asked ab; then               # one process per variant: the builds run in parallel
        for ((i = 1; i < ${#av[@]}; i += 2)); do
          PYTHONPATH=. python3 tools/ab.py --build-only --variant "${av[i]}" "${af[@]}" $AB_CASES >> "$R/prebuild.log" 2>&1 &
        done
      fi
      asked trace && PYTHONPATH=. python3 tools/trace_chain.py --build-only $TRACE_CASES >> "$R/prebuild.log" 2>&1 &
      [ -n "${TUNE_ARGS:-}" ] && python3 tune.py --build-only ${TUNE_ARGS} >> "$R/prebuild.log" 2>&1 &
      asked probe && PYTHONPATH=. python3 tools/pdl_probe.py --build-only >> "$R/prebuild.log" 2>&1 &
      wait; tail -8 "$R/prebuild.log" ;;
    racemin)
      SANITIZE_MIN=${SANITIZE_MIN:-1} PYTHONPATH=. timeout ${RACE_S:-150} compute-sanitizer --tool racecheck python3 tools/sanitize_case.py 2>&1 | tail -15 | tee "$R/racemin.log"
      echo "racemin exit ${PIPESTATUS[0]}" | tee -a "$R/racemin.log" ;;
    sanitize)
      SANITIZE_CL=0 PYTHONPATH=. timeout ${RACE_S:-240} compute-sanitizer --tool racecheck python3 tools/sanitize_case.py 2>&1 | tail -15 | tee "$R/racecheck.log"
      PYTHONPATH=. timeout $(( $(left) - 10 )) compute-sanitizer --tool synccheck python3 tools/sanitize_case.py 2>&1 | tail -15 | tee "$R/synccheck.log" ;;
  esac
done
echo "=== done in $(( $(date +%s) - T0 )) s"
tar czf "$OUT/run.tgz" -C "$OUT" run && rm -rf "$R"
