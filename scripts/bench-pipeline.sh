#!/usr/bin/env bash
# Whole-pipeline benchmark (docs/BENCHMARKS.md): `contrail up` end to end — broker, local Cosmos
# endpoint and the five stages as processes on this machine — at a load the pipeline sustains
# (500 events/s, February 1–3), at a fixed 5,000 events/s and at saturation (as fast as ingest
# takes them; both February 1–14). Prints sustained events/s end to end, latency from ingest to the
# Cosmos document and to the Delta row, peak memory, and the baseline of the same run: how fast
# ingest alone acknowledged the feed.
#   scripts/bench-pipeline.sh            # all three
#   scripts/bench-pipeline.sh 500:2013-02-01:2013-02-03   # RATE:FROM:TO ...
#   CONTRAIL_BENCH_UP_ARGS="--durable-broker" scripts/bench-pipeline.sh …   # more `contrail up` flags
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --workspace --all-targets
bin="$CARGO_TARGET_DIR/debug/contrail"
out="$(mktemp -d /var/tmp/contrail-bench-pipeline.XXXXXX)"
if [ $# -eq 0 ]; then set -- 500:2013-02-01:2013-02-03 5000:2013-02-01:2013-02-14 0:2013-02-01:2013-02-14; fi
for run in "$@"; do
  IFS=: read -r rate from to <<<"$run"
  label=$([ "$rate" = 0 ] && echo saturation || echo "$rate events/s offered")
  # shellcheck disable=SC2086 # CONTRAIL_BENCH_UP_ARGS is a list of flags
  "$bin" up --from "$from" --to "$to" --rate "$rate" --exit --latency-sample-every 20 --port-offset 700 ${CONTRAIL_BENCH_UP_ARGS:-} \
    --workdir "$out/rate-$rate" --summary-json "$out/rate-$rate.json" >"$out/rate-$rate.log" 2>&1 \
    || { echo "contrail up failed ($label):"; tail -30 "$out/rate-$rate.log"; exit 1; }
  python3 - "$out/rate-$rate.json" "$label" "${CONTRAIL_BENCH_UP_ARGS:-}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); label = sys.argv[2]
ingest = s["acknowledged"] / max(s["replay_seconds"], 1e-9)
e2e = s["events_per_second_end_to_end"]
c, d = s["latency_ms"]["ingest_to_cosmos"], s["latency_ms"]["ingest_to_delta"]
print(f"== {label} {sys.argv[3]}: {s['flights']} flights, {s['distinct_events']} distinct events "
      f"({s['acknowledged']} deliveries), checks {'passed' if s['passed'] else 'FAILED'}")
print(f"   baseline: ingest acknowledged {ingest:,.0f} deliveries/s ({s['replay_seconds']:.1f} s)")
print(f"   end to end: {e2e:,.0f} events/s sustained ({s['settled_seconds']:.1f} s until every store settled)"
      f" = {100 * e2e / max(ingest, 1e-9):.0f} % of the ingest rate")
if "events_per_second_to_complete_stores" in s:
    print(f"   stores complete: {s['events_per_second_to_complete_stores']:,.0f} events/s"
          f" ({s['stores_complete_seconds']:.1f} s from the first event to the stores' last commit)")
print(f"   latency ingest → Cosmos document: p50 {c.get('p50')} ms, p90 {c.get('p90')} ms, p99 {c.get('p99')} ms, max {c.get('max')} ms ({c.get('samples')} flights sampled)")
print(f"   latency ingest → Delta row:       p50 {d.get('p50')} ms, p90 {d.get('p90')} ms, p99 {d.get('p99')} ms, max {d.get('max')} ms ({d.get('samples')} events)")
print(f"   peak RSS (MiB): {s['peak_rss_mib']}")
PY
done
echo "logs and summaries: $out"
