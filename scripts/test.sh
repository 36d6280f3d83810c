#!/usr/bin/env bash
# Runs every test in three stages: the Check suites through ctest in a
# normal build, again built with AddressSanitizer and
# UndefinedBehaviorSanitizer, and the threaded replay tests under
# ThreadSanitizer. Every stage runs even when an earlier one failed (one
# red stage must not hide the others); a summary line per stage with its
# time closes the output, and the exit status is non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

summary=()
failed=0

# stage NAME BUILD_DIR CMAKE_ARGS ENV... -- CTEST_ARGS...: builds into
# BUILD_DIR (installing what is missing) and runs ctest there.
stage() {
  local name=$1 dir=$2 cmake_args=$3
  shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local t0=$SECONDS status=PASS
  echo "==== test.sh: stage $name (build $dir)"
  if ! DS4_CMAKE_ARGS="$cmake_args" scripts/setup.sh "$dir"; then
    status="FAIL (build)"
  elif ! (cd "$dir" && env "${envs[@]}" ctest --output-on-failure -j "$jobs" "$@"); then
    status="FAIL (tests)"
  fi
  [ "$status" = PASS ] || failed=1
  summary+=("$(printf 'test.sh: %-10s %-13s %5d s' "$name" "$status" $((SECONDS - t0)))")
}

stage normal build "" -- 
stage asan+ubsan build-asan "-DDS4_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug" \
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 --
stage tsan build-tsan "-DDS4_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug" TSAN_OPTIONS=halt_on_error=1 -- \
  -R 'test_runtime|test_e2e|test_faults|test_review_rt|test_schedules_0'

echo
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
  echo "test.sh: FAILED"
  exit 1
fi
echo "test.sh: all stages passed"
