#!/usr/bin/env bash
# A local 3-master Redis Cluster for the tests: 127.0.0.1:7001-7003, no replicas, no persistence.
#
#   scripts/redis-cluster.sh         start it (or do nothing if it is already up)
#   scripts/redis-cluster.sh stop    shut the nodes down and remove their directory
#
# Then: export REDIS_CLUSTER_URLS=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003
#
# The nodes live in ${REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/tower-idempotency-redis-cluster}
# (one sub-directory per port, holding nodes.conf and the log).
set -euo pipefail

PORTS=(7001 7002 7003)
HOST=127.0.0.1
DIR="${REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/tower-idempotency-redis-cluster}"
WAIT_SECONDS=30

log() { echo "redis-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || die "$tool not found: install redis (apt-get install redis-server redis-tools)"
done

cli() { redis-cli -h "$HOST" -p "$1" "${@:2}"; }
is_up() { [ "$(cli "$1" ping 2>/dev/null)" = "PONG" ]; }
state_ok() { cli "$1" cluster info 2>/dev/null | tr -d '\r' | grep -qx 'cluster_state:ok'; }
known_nodes() { cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_known_nodes://p'; }
all_ok() {
    local port
    for port in "${PORTS[@]}"; do
        state_ok "$port" || return 1
        [ "$(known_nodes "$port")" = "${#PORTS[@]}" ] || return 1
    done
}

stop() {
    local port
    for port in "${PORTS[@]}"; do
        if is_up "$port"; then
            cli "$port" shutdown nosave >/dev/null 2>&1 || true
            log "stopped $HOST:$port"
        fi
    done
    for port in "${PORTS[@]}"; do
        for _ in $(seq 50); do is_up "$port" || break; sleep 0.1; done
        is_up "$port" && die "$HOST:$port is still answering after shutdown"
    done
    rm -rf "$DIR"
}

start() {
    if all_ok; then
        log "already running on ${PORTS[*]} (cluster_state:ok)"
        return 0
    fi

    local port
    mkdir -p "$DIR"
    for port in "${PORTS[@]}"; do
        if is_up "$port"; then
            # Up but not a healthy cluster of ours: only acceptable if it is a fresh cluster node.
            cli "$port" info cluster 2>/dev/null | tr -d '\r' | grep -qx 'cluster_enabled:1' \
                || die "$HOST:$port is taken by a redis that is not in cluster mode"
            continue
        fi
        mkdir -p "$DIR/$port"
        (cd "$DIR/$port" && redis-server \
            --port "$port" --bind "$HOST" \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
            --save "" --appendonly no \
            --dir "$DIR/$port" --logfile "$DIR/$port/redis.log" --pidfile "$DIR/$port/redis.pid" \
            --daemonize yes) || die "redis-server on port $port did not start"
    done
    for port in "${PORTS[@]}"; do
        for _ in $(seq 100); do is_up "$port" && break; sleep 0.1; done
        is_up "$port" || die "$HOST:$port did not answer PING (see $DIR/$port/redis.log)"
    done

    # Assign the slots unless a previous run already did (nodes.conf kept, or a node restarted).
    local assigned
    assigned=$(cli "${PORTS[0]}" cluster info | tr -d '\r' | sed -n 's/^cluster_slots_assigned://p')
    if [ "${assigned:-0}" != "16384" ]; then
        local nodes=()
        for port in "${PORTS[@]}"; do nodes+=("$HOST:$port"); done
        # A node that holds keys or knows other nodes refuses to join: start from scratch.
        for port in "${PORTS[@]}"; do
            cli "$port" flushall >/dev/null
            cli "$port" cluster reset hard >/dev/null
        done
        redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$DIR/create.log" 2>&1 \
            || { cat "$DIR/create.log" >&2; die "redis-cli --cluster create failed"; }
    fi

    for _ in $(seq $((WAIT_SECONDS * 10))); do
        if all_ok; then
            log "running on ${PORTS[*]} (cluster_state:ok)"
            return 0
        fi
        sleep 0.1
    done
    for port in "${PORTS[@]}"; do log "$HOST:$port: $(cli "$port" cluster info | tr -d '\r' | grep cluster_state)"; done
    die "the cluster did not reach cluster_state:ok within ${WAIT_SECONDS}s"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    *) die "usage: $0 [start|stop|restart]" ;;
esac
