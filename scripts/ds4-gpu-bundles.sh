#!/usr/bin/env bash
# Builds, on a machine without a GPU, what scripts/ds4-gpu-check.sh runs on
# one NVIDIA sm_90 GPU (an H200), into out/ds4gpu/: the tools (bin/) and the
# DeepSeek-V4-Flash bundles: ds4-flash-mini and ds4-flash-slice (the
# release's dtypes) and their -bf16 variants with each shipped schedule for
# the GPU (ds4-flash-h200, ds4-flash-decode-early) and for the cpu
# (ds4-flash-cpu), plus the mini's kernels for host and sm_90 for gpu_ops. Bundles hold no weights (the seeded generator, or --weights),
# so the folder stays small. Carry out/ds4gpu, with a checkout, to the GPU
# machine and run scripts/ds4-gpu-check.sh there from the checkout's root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build >/dev/null
ninja -C build ds4run gpu_ops ds4_bench ds4_prefill >/dev/null

out=out/ds4gpu
rm -rf "$out"
mkdir -p "$out/bin"
cp build/ds4run build/gpu_ops build/ds4_bench build/ds4_prefill "$out/bin/"

ds4c=build/ds4c
for m in mini slice mini-bf16 slice-bf16; do
  $ds4c compile models/ds4-flash-$m.yaml schedules/ds4-flash-cpu.yaml -o "$out/$m-cpu"
  $ds4c compile models/ds4-flash-$m.yaml schedules/ds4-flash-h200.yaml -o "$out/$m-h200"
  $ds4c compile models/ds4-flash-$m.yaml schedules/ds4-flash-decode-early.yaml -o "$out/$m-early"
done
$ds4c compile models/ds4-flash-mini.yaml schedules/ds4-flash-h200.yaml -o "$out/mini-ops" --target host,sm_90
echo "ds4-gpu-bundles: $out: $(du -sh "$out" | cut -f1)"
