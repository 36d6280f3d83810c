#!/usr/bin/env bash
# The committed review artefacts: out/<model>--<schedule>.plan.txt and
# out/<model>--<schedule>.decode.plan.txt, the canonical texts of the
# prefill and the decode plan of every shipped pair. A shipped pair is a model of
# models/ and a schedule of schedules/ whose `model:` is that model or one
# it extends. With no option, compiles every pair and writes its text;
# with --check, compiles every pair into a scratch folder and fails (exit 1)
# when a committed text is stale, missing or belongs to no shipped pair,
# printing the command that refreshes them. A pair whose plan needs more
# memory than a device has (ds4c's "needs an arena of" error: the released
# model on one H200) has no text; the script says so and goes on.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ds4c="$root/build/ds4c"
check=0

usage() {
  echo "usage: scripts/plans.sh [--check] [--ds4c PATH]" >&2
  exit 64
}
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=1 ;;
    --ds4c) [ $# -ge 2 ] || usage; ds4c="$2"; shift ;;
    *) usage ;;
  esac
  shift
done
if [ ! -x "$ds4c" ]; then
  echo "plans.sh: error: $ds4c is not an executable ds4c (build first, or pass --ds4c PATH)" >&2
  exit 2
fi

# A YAML file's top-level scalar KEY, without quotes or comment.
top_value() {
  sed -n "s/^$1:[[:space:]]*\"\{0,1\}\([^\"#[:space:]]*\).*/\1/p" "$2" | head -n 1
}

# The models a model is: its own name, then every base along `extends:`.
lineage() {
  local file="$1"
  while [ -n "$file" ]; do
    top_value model "$file"
    local base
    base=$(top_value extends "$file")
    file=${base:+$(dirname "$file")/$base}
  done
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
declare -A shipped=()
for model in "$root"/models/*.yaml; do
  names=" $(lineage "$model" | tr '\n' ' ')"
  mname=$(top_value model "$model")
  for sched in "$root"/schedules/*.yaml; do
    want=$(top_value model "$sched")
    case "$names" in *" $want "*) ;; *) continue ;; esac
    sname=$(basename "$sched" .yaml)
    if ! log=$("$ds4c" compile "$model" "$sched" -o "$scratch/bundle" 2>&1); then
      if grep -q "error: device '[^']*' needs an arena of" <<<"$log"; then
        echo "${model#"$root"/} with ${sched#"$root"/}: does not fit, no plan text:"
        grep "needs an arena of" <<<"$log" | sed 's/^/  /'
        continue
      fi
      echo "plans.sh: error: compiling ${model#"$root"/} with ${sched#"$root"/} failed:" >&2
      echo "$log" >&2
      exit 2
    fi
    for plan in prefill decode; do
      if [ "$plan" = prefill ]; then
        text="out/$mname--$sname.plan.txt" made="$scratch/bundle/plan.txt"
      else
        text="out/$mname--$sname.decode.plan.txt" made="$scratch/bundle/decode/plan.txt"
      fi
      shipped[$text]=1
      if [ "$check" -eq 0 ]; then
        cp "$made" "$root/$text"
        echo "wrote $text"
      elif [ ! -f "$root/$text" ]; then
        echo "$text: missing"
        status=1
      elif ! cmp -s "$made" "$root/$text"; then
        line=$({ cmp "$made" "$root/$text" 2>&1 || true; } | sed -n 's/.*line \([0-9]*\).*/\1/p')
        echo "$text: stale (first difference at line ${line:-?})"
        status=1
      fi
    done
  done
done
for text in "$root"/out/*.plan.txt; do
  [ -e "$text" ] || continue
  rel="out/$(basename "$text")"
  if [ -z "${shipped[$rel]:-}" ]; then
    if [ "$check" -eq 0 ]; then
      rm "$text"
      echo "removed $rel (no shipped pair)"
    else
      echo "$rel: no shipped model and schedule pair gives it"
      status=1
    fi
  fi
done
if [ "$status" -ne 0 ]; then
  echo "plans.sh: the committed plan texts are out of date; refresh them with: scripts/plans.sh" >&2
elif [ "$check" -eq 1 ]; then
  echo "plans.sh: ${#shipped[@]} committed plan texts are current"
fi
exit "$status"
