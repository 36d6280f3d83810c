#!/usr/bin/env bash
# The main job: build, compile tiny-moe with its one-device schedule into
# out/tiny-moe/, replay it on the CPU backend against the float64
# reference, and print the result.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
build/ds4c compile models/tiny-moe.yaml schedules/tiny-1dev.yaml -o out/tiny-moe
build/ds4run out/tiny-moe --steps 8 --check
