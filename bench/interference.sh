#!/usr/bin/env bash
# Inter-token latency of running streams while long prompts arrive: one
# `serve --colocated` (one engine) on two cores, `serve` (a prefill and a
# decode node in one process) on two cores, and a prefill node and a decode
# node as processes pinned to one core each (the interference
# disaggregation exists to remove).
#
#   bash bench/interference.sh [MODEL]        (default builtin:135m-q8_0)
#
# Needs taskset (util-linux) and two cores. Prints the decode workload's
# loadtest report for each setup; compare the inter-token p50/p99 lines.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-builtin:135m-q8_0}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
go build -o "$work/pw" ./cmd/pagewarden
pw="$work/pw"
common=(--model "$model" --max-context 2048 --kv-memory 512MiB)

await() { # file pattern → first match's group
  for _ in $(seq 600); do
    if m=$(grep -oE "$2" "$1" | head -1); then [ -n "$m" ] && { echo "$m"; return; }; fi
    sleep 0.1
  done
  echo "timed out waiting for $2 in $1" >&2; cat "$1" >&2; exit 1
}

# itl prints p50/p90/p99 of the gateway's inter-token latency histogram
# (upper bucket bounds: the streams' gaps as the gateway relays them).
itl() {
  curl -s "http://$1/metrics" | awk '
    /^pagewarden_inter_token_latency_seconds_bucket/ {
      match($0, /le="[^"]+"/); le = substr($0, RSTART+4, RLENGTH-5); n[le] += $NF; order[++k] = le }
    /^pagewarden_inter_token_latency_seconds_count/ { total += $NF }
    END {
      if (total == 0) { print "   inter-token (gateway): no gaps"; exit }
      split("50 90 99", qs, " ")
      line = "   inter-token (gateway, bucket bounds):"
      for (qi = 1; qi <= 3; qi++) {
        q = qs[qi]; want = total * q / 100
        for (i = 1; i <= k; i++) { le = order[i]; if (seen[le]++) continue; if (n[le] >= want) { line = line sprintf("  p%s <= %s s", q, le); break } }
        delete seen
      }
      print line sprintf("  (n=%d)", total)
    }'
}

workload() { # url key label metrics
  local url=$1 key=$2
  # Long prompts keep arriving (prefill work) while the decode workload runs.
  "$pw" loadtest --url "$url" --key "$key" --concurrency 1 --requests 12 --prompt-tokens 1500 --max-tokens 1 >"$work/long.txt" 2>&1 &
  local long=$!
  "$pw" loadtest --url "$url" --key "$key" --concurrency 4 --requests 8 --prompt-tokens 32 --max-tokens 96 >"$work/decode.txt" 2>&1
  wait $long || true
  echo "== $3: decode workload (4 streams, 32-token prompts, 96 tokens) while 1500-token prompts arrive"
  grep -E "sent|output" "$work/decode.txt"
  itl "$4"
  echo "   long prompts:"; grep -E "sent" "$work/long.txt" | sed 's/^/   /'
}

# 1. serve --colocated, then serve (split in one process), on two cores.
for mode in --colocated ""; do
  taskset -c 0,1 "$pw" serve "${common[@]}" $mode --threads 2 --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 2>"$work/serve.log" &
  pid=$!
  url=http://$(await "$work/serve.log" 'listening on http://[0-9.:]+' | sed 's|listening on http://||')
  key=$(await "$work/serve.log" 'shown once\): \S+' | sed 's/shown once): //')
  metrics=$(await "$work/serve.log" 'metrics on http://[0-9.:]+' | sed 's|metrics on http://||')
  workload "$url" "$key" "serve ${mode:-(prefill + decode node)}, 2 threads on cores 0-1" "$metrics"
  kill $pid; wait $pid 2>/dev/null || true
  : >"$work/serve.log"
done

# 2. decode on core 0, prefill on core 1, one thread each.
"$pw" certs --out "$work/pki" --node gw:gateway --node p0:prefill:127.0.0.1 --node d0:decode:127.0.0.1 >/dev/null
tls() { echo --name "$1" --tls-ca "$work/pki/ca.pem" --tls-cert "$work/pki/$1.pem" --tls-key "$work/pki/$1-key.pem"; }
taskset -c 0 "$pw" decode "${common[@]}" --threads 1 $(tls d0) --link-listen 127.0.0.1:0 --metrics-listen "" 2>"$work/d0.log" &
d0=$(await "$work/d0.log" 'linked on [0-9.:]+' | sed 's/linked on //')
taskset -c 1 "$pw" prefill "${common[@]}" --threads 1 $(tls p0) --link-listen 127.0.0.1:0 --metrics-listen "" --decode "d0=$d0" 2>"$work/p0.log" &
p0=$(await "$work/p0.log" 'linked on [0-9.:]+' | sed 's/linked on //')
"$pw" gateway "${common[@]}" $(tls gw) --prefill "p0=$p0" --decode "d0=$d0" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 2>"$work/gw.log" &
url=http://$(await "$work/gw.log" 'listening on http://[0-9.:]+' | sed 's|listening on http://||')
key=$(await "$work/gw.log" 'shown once\): \S+' | sed 's/shown once): //')
metrics=$(await "$work/gw.log" 'metrics on http://[0-9.:]+' | sed 's|metrics on http://||')
workload "$url" "$key" "decode on core 0, prefill on core 1, 1 thread each" "$metrics"
