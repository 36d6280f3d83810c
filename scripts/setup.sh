#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks for building and testing
# ds4c and ds4run, then configures and builds into build/ (or $1), quietly:
# one line when it worked, the log's tail when it did not.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

# clang-19, lld-19 and llvm-19 build the AMD and NVIDIA code objects (and
# llvm-readelf-19 inspects them); libamdhip64-dev lets the hip backend's
# error paths be tested on a machine without a GPU; libclang-rt-19-dev is
# clang-19's libFuzzer runtime (scripts/fuzz.sh).
packages="build-essential cmake ninja-build pkg-config libyaml-dev check libsubunit-dev clang-19 lld-19 llvm-19 libclang-rt-19-dev libamdhip64-dev python3"
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: error: packages missing ($missing) and not running as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

# Quiet unless it fails: the whole log stays in the build folder.
mkdir -p "$build"
log="$build/build.log"
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${DS4_CMAKE_ARGS:-} &&
       ninja -C "$build"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "setup.sh: error: the build of $build failed; its whole log is $log" >&2
  exit 1
fi
echo "setup.sh: built $build (log: $log)"
