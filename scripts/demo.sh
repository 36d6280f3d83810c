#!/usr/bin/env bash
# The main job: build, compile ds4-flash-mini (DeepSeek-V4-Flash's structure
# at small dimensions) with its cpu schedule into out/ds4-flash-mini/,
# replay it on the CPU backend against the float64 reference of the whole
# model, and print the result.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
build/ds4c compile models/ds4-flash-mini.yaml schedules/ds4-flash-cpu.yaml -o out/ds4-flash-mini
build/ds4run out/ds4-flash-mini --steps 16 --check
