#!/usr/bin/env bash
# Builds, on a machine without a GPU, everything the GPU checks of
# docs/GPU.md need, into out/gpu/: the tools (bin/), the tiny-moe bundles
# for one NVIDIA sm_90 GPU (tiny-h200, tiny-gpu-cpu, every op kind for
# gpu_ops, and N random multi-stream schedules) and the expert GEMVs of
# bench/gpu.c (expert-gemv, host and sm_90), as users of an ahead-of-time
# compiler do. Carry out/gpu to the GPU machine and run scripts/gpu-check.sh
# (and bin/gpu_bench out/gpu) there.
#
#   scripts/gpu-bundles.sh [N]      N random schedules (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
scripts/setup.sh build >/dev/null
ninja -C build gpu_ops gpu_smoke gen_schedules gpu_bench >/dev/null

out=out/gpu
rm -rf "$out"
mkdir -p "$out/bin" "$out/schedules"
cp build/ds4run build/gpu_ops build/gpu_smoke build/gpu_bench "$out/bin/"
cp scripts/gpu-check.sh "$out/"

ds4c=build/ds4c
$ds4c compile models/tiny-moe.yaml schedules/tiny-h200.yaml -o "$out/tiny-h200"
$ds4c compile models/tiny-moe.yaml schedules/tiny-gpu-cpu.yaml -o "$out/tiny-gpu-cpu"
$ds4c compile models/tiny-moe.yaml schedules/tiny-1dev.yaml -o "$out/tiny-1dev"
# every kernel of tiny-moe, split experts included, for host and sm_90
$ds4c compile models/tiny-moe.yaml schedules/tiny-hotcold.yaml -o "$out/ops" --target host,sm_90
# bench/gpu.c's bf16 expert GEMVs; the host code object lets gpu_ops check them
$ds4c compile bench/models/expert-gemv.yaml bench/schedules/expert-gemv-h200.yaml -o "$out/expert-gemv" \
  --target host,sm_90
# the DeepSeek-V4 op kinds at small sizes (tests/gpu/models), host + sm_90,
# each on one cpu device (gpu_ops runs every kernel of a bundle itself)
for m in tests/gpu/models/*.yaml; do
  name=$(sed -n 's/^model: *//p' "$m")
  cat > "$out/schedules/$name-1dev.yaml" <<YAML
schedule: $name-1dev
model: $name
devices:
  - {name: cpu0, backend: cpu, arch: host, ordinal: 0, threads: 1, bandwidth: 2.0e10, flops: 5.0e10, launch: 2.0e-6}
streams:
  - {name: main, device: cpu0}
owners:
  - "* -> cpu0.main"
step: {prompt: 4, decode: 1}
YAML
  $ds4c compile "$m" "$out/schedules/$name-1dev.yaml" -o "$out/ops-$(basename "$m" .yaml)" --target host,sm_90 >/dev/null
done
build/gen_schedules "$out/schedules" "$n"
for i in $(seq 0 $((n - 1))); do
  $ds4c compile models/tiny-moe.yaml "$out/schedules/random-$i.yaml" -o "$out/random-$i" >/dev/null
done
echo "gpu-bundles: $out: $(du -sh "$out" | cut -f1), $n random schedules"
