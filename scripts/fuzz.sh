#!/usr/bin/env bash
# Runs a libFuzzer target of tests/fuzz for a while.
#
#   scripts/fuzz.sh TARGET SECONDS [--merge] [-- LIBFUZZER_ARGS...]
#   scripts/fuzz.sh all SECONDS [--merge] [-- LIBFUZZER_ARGS...]
#
# TARGET is model, schedule, plan, safetensors or compile (fuzz_model, ...
# also do); all runs each in turn, SECONDS each. The binaries are built in
# build-fuzz/ ($DS4_FUZZ_BUILD) with clang-19 and -DDS4_FUZZ=ON, configured
# there first when needed (scripts/setup.sh installs clang-19 and its
# libFuzzer runtime, libclang-rt-19-dev).
#
# A run works on a copy of the committed corpus, tests/fuzz/corpus/TARGET,
# in build-fuzz/fuzz/TARGET/corpus: the inputs it finds go there, never
# into the tree. With --merge the committed corpus then takes, minimised
# (-merge=1), the inputs that add coverage. Limits: -timeout=10 (seconds
# per input), -rss_limit_mb=2048 (also the largest malloc), leaks found by
# LeakSanitizer; anything after -- is passed to libFuzzer as well.
#
# The last line says "fuzz TARGET: N execs in S s, no finding", or names the
# input that crashed, leaked, ran out of time or memory (exit 1). A finding
# is fixed in the project's code and its input added to the committed
# corpus, where the ctest entry fuzz_corpus_TARGET runs it in every build.
#
# The plan corpus holds plan.ds4p files of ds4c compiles (the tiny models on
# tests/cases/compile/one-cpu.sched.yaml and the tiny-* schedules, and
# ds4-flash-slice on ds4-flash-2gpu): compile them again after a change of
# the plan format.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${DS4_FUZZ_BUILD:-$root/build-fuzz}"
targets="model schedule plan safetensors compile"

usage() {
  echo "usage: scripts/fuzz.sh TARGET|all SECONDS [--merge] [-- LIBFUZZER_ARGS...]" >&2
  echo "       TARGET: $targets" >&2
  exit 64
}

[ $# -ge 2 ] || usage
target="${1#fuzz_}"
seconds="$2"
shift 2
merge=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --merge) merge=1 ;;
    --) shift; extra=("$@"); break ;;
    *) usage ;;
  esac
  shift
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || usage
if [ "$target" = all ]; then
  run_list="$targets"
else
  case " $targets " in *" $target "*) run_list="$target" ;; *) usage ;; esac
fi

# Configure (once) and build the binaries asked for.
if ! grep -q '^DS4_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  if ! command -v clang-19 >/dev/null; then
    echo "fuzz.sh: error: clang-19 is not installed (scripts/setup.sh installs it)" >&2
    exit 2
  fi
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-19 -DDS4_FUZZ=ON >/dev/null
fi
bins=()
for t in $run_list; do bins+=("fuzz_$t"); done
ninja -C "$build" "${bins[@]}" >/dev/null

export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0

fuzz_one() {
  local t="$1" work="$build/fuzz/$1"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
  cp -R "$root/tests/fuzz/corpus/$t/." "$work/corpus/"
  local start=$SECONDS rc=0
  # TMPDIR: the targets' scratch folders, left behind only by a crash.
  TMPDIR="$work/tmp" "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -detect_leaks=1 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" ${extra[@]+"${extra[@]}"} "$work/corpus" >"$work/log" 2>&1 || rc=$?
  local elapsed=$((SECONDS - start))
  local found
  found="$(find "$work/artifacts" -type f | sort | head -n 1)"
  if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    tail -n 40 "$work/log"
    echo "fuzz $t: finding: ${found:-none written (libFuzzer exit $rc)}; log: $work/log"
    status=1
    return
  fi
  if [ "$merge" = 1 ]; then
    TMPDIR="$work/tmp" "$build/tests/fuzz/fuzz_$t" -merge=1 -timeout=10 -rss_limit_mb=2048 \
      "$root/tests/fuzz/corpus/$t" "$work/corpus" >"$work/merge.log" 2>&1 || {
      echo "fuzz $t: the merge failed; log: $work/merge.log"
      status=1
      return
    }
    local added
    added="$(sed -n 's/.*MERGE-OUTER: \([0-9]*\) new files.*/\1/p' "$work/merge.log" | tail -n 1)"
    echo "fuzz $t: ${added:-0} inputs merged into tests/fuzz/corpus/$t"
  fi
  local execs
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)"
  echo "fuzz $t: ${execs:-?} execs in $elapsed s, no finding"
}

for t in $run_list; do fuzz_one "$t"; done
exit "$status"
