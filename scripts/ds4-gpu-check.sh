#!/usr/bin/env bash
# Runs on a machine with an NVIDIA sm_90 GPU (an H200), from the root of a
# checkout holding out/ds4gpu (scripts/ds4-gpu-bundles.sh), nothing built
# there; python3 with torch and transformers 5.17 for the HF part.
#   1. gpu_ops: every kernel of ds4-flash-mini against the cpu backend;
#   2. ds4-flash-mini, 10-token prompt + 40 decode steps, on the cpu and on
#      the GPU under both GPU schedules, each with --check against the
#      float64 reference; the GPU schedules bit-identical; GPU against cpu
#      logits;
#   3. transformers' deepseek_v4 (fp32): a seeded checkpoint written by it
#      loads into ds4run (cpu and GPU); logits against HF's on the same ids;
#   4. ds4-flash-slice: both GPU schedules bit-identical; GPU against cpu
#      logits over the prompt and 3 decode steps;
#   5. bench/ds4 (ds4_bench): slice decode step per GPU schedule and floor.
set -uo pipefail
cd "$(dirname "$0")/.."
o=out/ds4gpu
bin=$o/bin
hf="python3 scripts/hf/ds4_hf_check.py"
w=$(mktemp -d)
fail=0
step() { echo; echo "== $*"; }
sha() { grep 'outputs sha256' "$1" | cut -d' ' -f3; }
ids() { sed -n 's/.*ids fed: //p' "$1"; }

step "gpu_ops: every ds4-flash-mini kernel against the cpu backend"
$bin/gpu_ops $o/mini-ops --trials 2 | tail -3 || fail=1

step "ds4-flash-mini: cpu and GPU against float64, GPU schedules bit-identical"
for s in cpu h200 early; do
  $bin/ds4run $o/mini-$s --steps 40 --check --dump-logits $w/mini-$s.bin > $w/mini-$s.txt || fail=1
  grep -E '^(schedule|model|check|outputs)' $w/mini-$s.txt
done
[ "$(sha $w/mini-h200.txt)" = "$(sha $w/mini-early.txt)" ] && echo "mini GPU schedules: bit-identical" ||
  { echo "mini GPU schedules: DIFFER"; fail=1; }
$hf compare $w/mini-h200.bin $w/mini-cpu.bin --vocab 256 --tol 1e-5 | tail -1 || fail=1

step "transformers deepseek_v4 (fp32) on ds4-flash-mini-bf16 (its checkpoint holds bf16 matrices)"
$hf make --out $w/hfw --seed 1 --store-bf16 | tail -3 || fail=1
for s in cpu h200; do
  $bin/ds4run $o/mini-bf16-$s --weights $w/hfw --steps 9 --dump-logits $w/ours-$s.bin > $w/ours-$s.txt || fail=1
  grep -E '^(weights|generated)' $w/ours-$s.txt
done
$hf run --weights $w/hfw --ids "$(ids $w/ours-cpu.txt)" --prompt-len 10 --chunk 4 --out $w/hf.bin | tail -2 || fail=1
for s in cpu h200; do $hf compare $w/ours-$s.bin $w/hf.bin --vocab 256 | tail -1 || fail=1; done

step "ds4-flash-slice: GPU schedules bit-identical, GPU against cpu"
for s in h200 early; do
  /usr/bin/time -f "$s: %e s wall, %M KiB max rss" $bin/ds4run $o/slice-$s --steps 3 --dump-logits $w/slice-$s.bin \
    > $w/slice-$s.txt || fail=1
  grep -E '^(device|weights|time|generated|outputs)' $w/slice-$s.txt
done
[ "$(sha $w/slice-h200.txt)" = "$(sha $w/slice-early.txt)" ] && echo "slice GPU schedules: bit-identical" ||
  { echo "slice GPU schedules: DIFFER"; fail=1; }
/usr/bin/time -f "cpu: %e s wall, %M KiB max rss" $bin/ds4run $o/slice-cpu --steps 3 --threads 16 \
  --dump-logits $w/slice-cpu.bin > $w/slice-cpu.txt || fail=1
grep -E '^(time|generated)' $w/slice-cpu.txt
$hf compare $w/slice-h200.bin $w/slice-cpu.bin --vocab 129280 --tol 1e-4 | tail -1 || fail=1

step "bench/ds4"
$bin/ds4_bench $o/slice-h200 $o/slice-early --steps 30 --warmup 3 || fail=1

rm -rf "$w"
echo
[ "$fail" = 0 ] && echo "ds4-gpu-check: PASS" || echo "ds4-gpu-check: FAIL"
exit "$fail"
