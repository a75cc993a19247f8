#!/usr/bin/env bash
# scripts/with_cpu_hogs.sh N COMMAND...: run COMMAND beside N processes that only spin on the CPU,
# and stop them when it ends (its exit status is this script's). `make test-stress` runs the suite
# so, to find the timing margins that a loaded machine breaks (docs/development.md).
set -euo pipefail
hogs=$1
shift
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for _ in $(seq "$hogs"); do
    python3 -c 'while True: pass' &
    pids+=($!)
done
"$@"
