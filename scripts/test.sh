#!/usr/bin/env bash
# Runs every test: the Check suites through ctest in a normal build, then
# again built with AddressSanitizer and UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh build
(cd build && ctest --output-on-failure -j "$jobs")

DS4_CMAKE_ARGS="-DDS4_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug" scripts/setup.sh build-asan
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs")

# The threaded runtime once more under ThreadSanitizer.
DS4_CMAKE_ARGS="-DDS4_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug" scripts/setup.sh build-tsan
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j "$jobs" -R 'test_runtime|test_e2e|test_faults|test_review_rt|test_schedules_0')
