#!/usr/bin/env bash
# The project's test command (README): formatting, vet, the whole suite,
# the race detector on the concurrent packages, and the pure-Go kernels.
# Installs what the tests need first (the openai npm client for the
# compatibility test, when npm is present).
set -euo pipefail
cd "$(dirname "$0")"

echo "== go version: $(go version)"
go mod download

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...
go vet -tags purego ./...

# The OpenAI client compatibility test needs the official npm package.
client_dir=internal/gateway/testdata/openai-client
if [ -f "$client_dir/package.json" ] && command -v npm >/dev/null 2>&1; then
  # A failed install fails the run: skipping the compatibility test
  # silently would hide exactly what it is there to catch.
  (cd "$client_dir" && npm install --no-audit --no-fund --silent)
  export PAGEWARDEN_NODE_TESTS=1
else
  echo "note: npm not found; the openai npm client compatibility tests are skipped"
fi

# Debian packages some checks need, installed when root with apt-get (one
# update for all): promtool checks the alert rules (package prometheus), a
# headless Chromium runs the admin page map's browser test (package
# chromium), and SPIN with a C compiler checks the handoff's Promela model
# (verify/spin; packages spin and gcc).
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v spin >/dev/null 2>&1 || need+=(spin)
command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 || need+=(gcc)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq >/dev/null 2>&1 || true
  for pkg in "${need[@]}"; do
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1 ||
      echo "note: could not install the Debian package $pkg"
  done
fi
if ! command -v chromium >/dev/null 2>&1 && [ -z "${PAGEWARDEN_CHROMIUM:-}" ]; then
  echo "note: chromium not found; the admin page map's browser test (internal/admin TestPageMapInBrowser) is SKIPPED"
fi
if ! command -v spin >/dev/null 2>&1; then
  echo "note: spin not found; the SPIN model of the handoff (verify/spin TestModel) is SKIPPED"
fi
if command -v promtool >/dev/null 2>&1; then
  promtool check rules deploy/monitoring/alerts.yml
  promtool test rules deploy/monitoring/alerts_test.yml
else
  echo "note: promtool not found; the alert rules are checked only by deploy/monitoring's Go test"
fi

# The multi-host test makes network namespaces with ip (iproute2); it runs
# where that and root with CAP_NET_ADMIN are there, and says SKIPPED where not.
if ! command -v ip >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2) >/dev/null 2>&1 ||
    echo "note: could not install iproute2 (Debian package); the multi-host network-namespace test will be skipped"
fi

echo "== go test ./..."
go test -count=1 -timeout 20m ./...
echo "== go test -tags pw_mutants (positive controls that re-introduce bugs through build-tagged hooks)"
go test -count=1 -tags pw_mutants ./internal/sched/ ./internal/disagg/
# Each mutant must be caught by the whole-system simulation within 1,000
# seeds (TestSimulation itself ran above, without the tag).
go test -count=1 -tags pw_mutants -run 'TestMutantsCaught' ./internal/sim/
# The replay audit's positive control: a page of another tenant swapped
# into running sequences behind the ownership check, on every test model;
# each contaminated answer's teacher-forced re-score must differ (~30 s).
go test -count=1 -tags pw_mutants -run 'TestAuditCatchesSwappedPage' ./internal/engine/
# ... and through the gateway's audit (mismatch logged with pages, ~1 s).
go test -count=1 -tags pw_mutants -run 'TestReplayAuditCatchesSwappedPage' ./internal/node/
# The probe against serve started as each mutant (with the handoff fault
# that triggers it, and the fault alone as control; a and a2 through the
# server's must-be-zero counters), a typo'd mutant refused, and no mutant
# code in the release binary (~45 s).
go test -count=1 -tags pw_mutants -run 'TestProbeCatchesMutants|TestMutantEnvRefusesUnknown|TestReleaseBinaryHasNoMutants' ./internal/cli/
echo "== go test -race -short (concurrent packages)"
go test -count=1 -race -short -timeout 20m $(go list ./internal/... | grep -E '/(kvcache|sched|gateway|kernels|engine|node|loadgen|probe|cli|transfer|link|disagg|cluster)($|/)')
echo "== go test -tags purego -short (the whole suite on the reference kernels)"
go test -count=1 -tags purego -short -timeout 20m ./...
