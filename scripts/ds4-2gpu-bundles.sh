#!/usr/bin/env bash
# Builds, on a machine without a GPU, what scripts/ds4-2gpu-check.sh runs,
# into out/ds4gpu2/: ds4run (bin/) and ds4-flash-slice compiled with
# ds4-flash-h200 (the one-GPU reference), ds4-flash-2gpu and
# ds4-flash-2gpu-cold-second, and the same two-GPU schedules with GPU 1
# mapped onto ordinal 0 (`-on1`): the stand-in for a host with one GPU, where
# both plan devices share it and the copies stay on the GPU. Carry
# out/ds4gpu2, with a checkout, to the GPU machine and run
# scripts/ds4-2gpu-check.sh there from the checkout's root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build >/dev/null
ninja -C build ds4c ds4run >/dev/null

out=out/ds4gpu2
rm -rf "$out"
mkdir -p "$out/bin" "$out/sched"
cp build/ds4run "$out/bin/"
ds4c=build/ds4c
m=models/ds4-flash-slice.yaml
$ds4c compile $m schedules/ds4-flash-h200.yaml -o "$out/h200"
for s in 2gpu 2gpu-cold-second; do
  $ds4c compile $m schedules/ds4-flash-$s.yaml -o "$out/$s"
  sed 's/ordinal: 1,/ordinal: 0,/' schedules/ds4-flash-$s.yaml > "$out/sched/$s-on1.yaml"
  $ds4c compile $m "$out/sched/$s-on1.yaml" -o "$out/$s-on1"
done
echo "ds4-2gpu-bundles: $out: $(du -sh "$out" | cut -f1)"
