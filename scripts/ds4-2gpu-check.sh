#!/usr/bin/env bash
# Runs on an NVIDIA sm_90 host, from the root of a checkout holding
# out/ds4gpu2 (scripts/ds4-2gpu-bundles.sh), nothing built there:
#   1. ds4-flash-slice under ds4-flash-2gpu gives the bits of ds4-flash-h200;
#   2. a trace of ds4-flash-2gpu (both devices' busy time, their overlap,
#      the copies' durations), written to TRACE_DIR (default: a scratch
#      folder);
#   3. ds4run compare of ds4-flash-2gpu against ds4-flash-2gpu-cold-second.
# With two or more GPUs it runs the two-GPU bundles; with one it runs the
# `-on1` stand-ins (both plan devices on ordinal 0) and says so: the
# figures of a stand-in show the plan replayed across two contexts of one
# GPU, not two GPUs working at once.
set -uo pipefail
cd "$(dirname "$0")/.."
o=out/ds4gpu2
run=$o/bin/ds4run
w=${TRACE_DIR:-$(mktemp -d)}
mkdir -p "$w"
steps=${STEPS:-16}
fail=0
step() { echo; echo "== $*"; }
sha() { grep 'outputs sha256' "$1" | cut -d' ' -f3; }

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -ge 2 ]; then
  two=$o/2gpu cold2=$o/2gpu-cold-second
  echo "ds4-2gpu-check: $ngpu GPUs: the two-GPU bundles"
else
  two=$o/2gpu-on1 cold2=$o/2gpu-cold-second-on1
  echo "ds4-2gpu-check: $ngpu GPU: the one-GPU stand-ins (both plan devices on ordinal 0)"
fi

step "bit-identical to ds4-flash-h200 ($steps decode steps)"
for b in $o/h200 $two $cold2; do
  n=$(basename "$b")
  $run "$b" --steps "$steps" > "$w/$n.txt" || fail=1
  grep -E '^(schedule|device|time|outputs)' "$w/$n.txt"
done
for b in $two $cold2; do
  n=$(basename "$b")
  [ "$(sha "$w/h200.txt")" = "$(sha "$w/$n.txt")" ] && echo "$n: bit-identical to h200" ||
    { echo "$n: DIFFERS from h200"; fail=1; }
done

step "trace of $(basename "$two")"
$run "$two" --steps "$steps" --trace "$w/2gpu-trace.json" > "$w/trace.txt" || fail=1
grep -E '^(trace|busy|overlap|copies|critical: +step)' "$w/trace.txt"

step "compare $(basename "$two") (A) against $(basename "$cold2") (B)"
$run compare "$two" "$cold2" --steps "$steps" --warmup 1 --blocks "${BLOCKS:-4}" || fail=1

echo
[ "$fail" = 0 ] && echo "ds4-2gpu-check: PASS" || echo "ds4-2gpu-check: FAIL"
exit "$fail"
