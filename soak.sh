#!/usr/bin/env bash
# The long soaks, on demand (not in CI): the whole-system simulation over
# many seeds, every mutant's catch rate over its 1,000 seeds, the
# scheduler's own simulation, and the canary soak against the real
# multi-process system with many trials per tenant. SCALE multiplies the
# defaults: ./soak.sh (about an hour on 2 cores), SCALE=10 ./soak.sh.
set -euo pipefail
cd "$(dirname "$0")"
scale=${SCALE:-1}
case $scale in
  ''|*[!0-9]*|0) echo "soak.sh: SCALE must be a positive integer, got '$scale'" >&2; exit 2 ;;
esac

echo "== whole-system simulation: $((100000 * scale)) seeds"
PAGEWARDEN_SIM_SEEDS=$((100000 * scale)) go test -count=1 -timeout 0 -run 'TestSimulation$' ./internal/sim/
echo "== scheduler simulation: $((100000 * scale)) seeds"
PAGEWARDEN_SIM_SEEDS=$((100000 * scale)) go test -count=1 -timeout 0 -run 'TestSimulation$' ./internal/sched/
echo "== every mutant over all of its 1,000 seeds (catch rates)"
go test -count=1 -timeout 0 -tags pw_mutants -run 'TestMutantsCaught' -v ./internal/sim/ -args -sim.all
echo "== canary soak: $((200 * scale)) trials per tenant, handoff faults, audit at 100%"
PAGEWARDEN_SOAK=$((200 * scale)) go test -count=1 -timeout 0 -run 'TestCanarySoak' -v ./internal/cli/ 2>&1 | tail -40
