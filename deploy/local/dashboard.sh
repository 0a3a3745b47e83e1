#!/usr/bin/env bash
# Draws docs/dashboard.png: the chart's Grafana dashboard answered by a real
# Prometheus scrape of the gateway `make run` started, under load from
# stockbench. Started by `make dashboard`, after `make run`.
#
# Prometheus (Debian's package) scrapes 127.0.0.1:8080 every 2 s with the
# labels a Kubernetes scrape would add (namespace, pod); stockbench runs a
# holds, a flash-sale, a sold-out-storm and a reads scenario one after
# another; deploy/local/dashshot evaluates every panel's queries over the
# run and draws them; headless Chromium turns the page into a PNG.
set -euo pipefail

RUN_DIR=${RUN_DIR:-.run}
PROM_ADDR=${PROM_ADDR:-127.0.0.1:9091}
GATEWAY=${GATEWAY:-127.0.0.1:8080}
LOAD_SECONDS=${LOAD_SECONDS:-40}
OUT=${OUT:-docs/dashboard.png}
mkdir -p "$RUN_DIR"
RUN_DIR=$(cd "$RUN_DIR" && pwd)
prom_dir=$RUN_DIR/prometheus

curl -fsS "http://$GATEWAY/readyz" >/dev/null || { echo "dashboard: no gateway on $GATEWAY; run 'make run' first" >&2; exit 1; }

stop_prometheus() {
	if [[ -f $prom_dir.pid ]]; then
		local pid
		pid=$(cat "$prom_dir.pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		rm -f "$prom_dir.pid"
	fi
}
stop_prometheus
trap stop_prometheus EXIT

rm -rf "$prom_dir" && mkdir -p "$prom_dir"
cat >"$prom_dir/prometheus.yml" <<EOF
global:
  scrape_interval: 2s
  evaluation_interval: 2s
scrape_configs:
  - job_name: stockgate
    static_configs:
      - targets: ["$GATEWAY"]
        labels: {namespace: local, pod: stockgate-0}
EOF
prometheus --config.file="$prom_dir/prometheus.yml" --storage.tsdb.path="$prom_dir/data" \
	--web.listen-address="$PROM_ADDR" >"$prom_dir.log" 2>&1 &
echo $! >"$prom_dir.pid"
for _ in $(seq 100); do curl -fsS "http://$PROM_ADDR/-/ready" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS "http://$PROM_ADDR/-/ready" >/dev/null || { echo "dashboard: prometheus did not start; see $prom_dir.log" >&2; exit 1; }

start=$(date +%s)
go build -o "$RUN_DIR/stockbench" ./cmd/stockbench
go build -o "$RUN_DIR/dashshot" ./deploy/local/dashshot
for scenario in holds flash soldout reads; do
	echo "dashboard: stockbench $scenario for ${LOAD_SECONDS}s"
	"$RUN_DIR/stockbench" run -url "http://$GATEWAY" -scenario "$scenario" -duration "${LOAD_SECONDS}s" -workers 32 -rate 1500 >"$RUN_DIR/dashboard-$scenario.txt" 2>&1
done
# Two more scrapes, so the last requests are in every rate.
sleep 5
window=$(($(date +%s) - start + 60))

"$RUN_DIR/dashshot" -prometheus "http://$PROM_ADDR" -window "${window}s" -out "$RUN_DIR/dashboard.html"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	--disable-background-networking --disable-component-update --disable-sync \
	--user-data-dir="$(mktemp -d)" --hide-scrollbars --window-size=1212,1990 \
	--screenshot="$(pwd)/$OUT" "file://$RUN_DIR/dashboard.html" 2>"$RUN_DIR/chromium.log"
echo "dashboard: wrote $OUT (page $RUN_DIR/dashboard.html, load summaries $RUN_DIR/dashboard-*.txt)"
