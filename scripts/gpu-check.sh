#!/usr/bin/env bash
# Runs on a machine with an NVIDIA sm_90 GPU (an H200), from the folder
# scripts/gpu-bundles.sh made (out/gpu), with nothing built there:
#   1. gpu_smoke: the cuda backend's calls, streams, events, timestamps;
#   2. gpu_ops: every kernel of tiny-moe against the cpu backend on fresh
#      random inputs (f32 relative error bound 1e-5, i32 exact);
#   3. tiny-moe on the GPU with --check against the float64 reference;
#   4. tiny-gpu-cpu (experts 6-7 on the CPU, copies both ways) with --check;
#   5. the exact oracle on the GPU: every random multi-stream schedule
#      prints the same outputs sha256 as tiny-h200;
#   6. bench/gpu (gpu_bench): copy bandwidth, the expert-FFN GEMV, host
#      cost per replayed launch, a tiny-moe decode step.
set -uo pipefail
cd "$(dirname "$0")"
bin=./bin
fail=0
step() { echo; echo "== $*"; }

step "gpu_smoke"
$bin/gpu_smoke ops/kernels/sm_90.cubin || fail=1

step "gpu_ops: every kernel against the cpu backend"
$bin/gpu_ops ops --trials 5 || fail=1
for b in ops-* expert-gemv; do $bin/gpu_ops "$b" --trials 3 || fail=1; done

step "tiny-h200 --check"
$bin/ds4run tiny-h200 --steps 8 --check | tee h200.txt || fail=1
want=$(grep 'outputs sha256' h200.txt | cut -d' ' -f3)

step "tiny-gpu-cpu --check"
$bin/ds4run tiny-gpu-cpu --steps 8 --check || fail=1

step "random multi-stream schedules: bit-identical to tiny-h200"
same=0 total=0
for b in random-*; do
  total=$((total + 1))
  got=$($bin/ds4run "$b" --steps 8 | grep 'outputs sha256' | cut -d' ' -f3)
  if [ -n "$got" ] && [ "$got" = "$want" ]; then same=$((same + 1)); else echo "DIFFER: $b ($got)"; fail=1; fi
done
echo "random schedules: $same of $total identical to tiny-h200 ($want)"


step "bench/gpu"
$bin/gpu_bench . || fail=1

echo
[ "$fail" = 0 ] && echo "gpu-check: PASS" || echo "gpu-check: FAIL"
exit "$fail"
