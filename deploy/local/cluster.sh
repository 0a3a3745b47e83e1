#!/usr/bin/env bash
# Local Redis Cluster for `make run`: 3 masters + 3 replicas on loopback
# ports 7000-7005 (REDIS_PORT_BASE moves them), files and pids under
# .run/redis. `stop` kills only the pids this script wrote.
set -euo pipefail
dir="${RUN_DIR:-.run}/redis"
case "$dir" in /*) abs="$dir" ;; *) abs="$PWD/$dir" ;; esac
base="${REDIS_PORT_BASE:-7000}"
ports=($(seq "$base" $((base + 5))))

# alive: the node's pid runs and is not a zombie (a killed daemon whose
# parent, pid 1 in some containers, does not reap it still answers kill -0).
alive() {
  [ -f "$dir/$1.pid" ] || return 1
  local pid
  pid=$(cat "$dir/$1.pid")
  kill -0 "$pid" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

start() {
  mkdir -p "$dir"
  # Fresh when none of our nodes runs: no node may come up with the slots
  # of the last cluster. Otherwise a node that died (a killed master whose
  # replica took over) comes back with its nodes.conf and rejoins as a
  # replica of whoever serves its slots now.
  fresh=1
  for p in "${ports[@]}"; do alive "$p" && fresh=0; done
  for p in "${ports[@]}"; do
    if alive "$p"; then
      echo "redis $p already running (pid $(cat "$dir/$p.pid"))"
      continue
    fi
    if redis-cli -p "$p" ping >/dev/null 2>&1; then
      echo "port $p is taken by a Redis this script did not start; stop it or free ports $base-$((base + 5))" >&2
      exit 1
    fi
    # A replica writes the RDB of its first sync to disk even with
    # --save "", so each node has its own file, removed here: a returning
    # node resyncs from its master. Replicas sync at once (no 5s wait for
    # a diskless sync): one that never synced cannot take over.
    rm -f "$dir/dump-$p.rdb" "$dir/dump.rdb"
    [ "$fresh" = 1 ] && rm -f "$dir/nodes-$p.conf"
    redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "nodes-$p.conf" --cluster-node-timeout 5000 \
      --dir "$dir" --dbfilename "dump-$p.rdb" --save "" --appendonly no --daemonize yes \
      --repl-diskless-sync-delay 0 \
      --pidfile "$abs/$p.pid" --logfile "$p.log"
  done
  for p in "${ports[@]}"; do
    for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  if [ "$fresh" = 1 ]; then
    redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 1 --cluster-yes >"$dir/create.log"
  fi
  for _ in $(seq 150); do
    ok=1
    for p in "${ports[@]}"; do
      redis-cli -p "$p" cluster info | grep -q cluster_state:ok || ok=0
      # A replica that never synced cannot be promoted: ready means a
      # master may fail right away.
      if redis-cli -p "$p" info replication | grep -q role:slave; then
        redis-cli -p "$p" info replication | grep -q master_link_status:up || ok=0
      fi
    done
    [ "$ok" = 1 ] && { echo "redis cluster ready on 127.0.0.1:$base-$((base + 5))"; return; }
    sleep 0.2
  done
  echo "redis cluster did not become ready; see $dir/*.log" >&2
  exit 1
}

stop() {
  for p in "${ports[@]}"; do
    f="$dir/$p.pid"
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null && echo "stopped redis $p (pid $pid)"
    rm -f "$f"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
