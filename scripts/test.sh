#!/usr/bin/env bash
# The test command: makes sure PostgreSQL, MariaDB, Redis (and a local Redis Cluster), RabbitMQ
# and NATS JetStream are reachable on 127.0.0.1, then runs every test of the workspace with every
# feature. Exits non-zero on any failure; never skips a database or broker test.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -E 'test(seed)' # extra arguments go to cargo nextest
set -euo pipefail
cd "$(dirname "$0")/.."

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
export MYSQL_URL="${MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
export REDIS_CLUSTER_URLS="${REDIS_CLUSTER_URLS:-redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003}"
export AMQP_URL="${AMQP_URL:-amqp://127.0.0.1:5672/%2f}"
export NATS_URL="${NATS_URL:-127.0.0.1:4222}"

log() { printf '[test.sh] %s\n' "$*" >&2; }

# Is something listening on 127.0.0.1:$1?
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local port=$1 name=$2
  for _ in $(seq 1 60); do
    port_open "$port" && return 0
    sleep 0.5
  done
  log "$name is not reachable on 127.0.0.1:$port"
  return 1
}

apt_install() {
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    log "cannot install $* (no apt-get or not root): install it and run again"
    return 1
  fi
}

ensure_postgres() {
  port_open 5432 && return 0
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    log "starting PostgreSQL and Redis with docker compose"
    docker compose up -d --wait postgres redis
    return 0
  fi
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    apt_install postgresql
  fi
  log "starting the local PostgreSQL cluster"
  for version in $(ls /etc/postgresql); do
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  done
  wait_port 5432 PostgreSQL
  # Trust auth on loopback is how the CI machine is set up; a fresh install needs the test DB.
  psql "postgres://postgres@127.0.0.1:5432/postgres" -Atc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
    || psql "postgres://postgres@127.0.0.1:5432/postgres" -c "CREATE DATABASE test" >/dev/null
}

# MariaDB for the MySQL store (MYSQL_URL: root, no password, database `test`).
ensure_mariadb() {
  if ! port_open 3306; then
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
      log "starting MariaDB with docker compose"
      docker compose up -d --wait mariadb
    else
      if [ ! -x /usr/sbin/mariadbd ]; then
        apt_install mariadb-server
      fi
      log "starting the local MariaDB"
      mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
      start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- \
        --user=mysql --bind-address=127.0.0.1 --port=3306
      wait_port 3306 MariaDB || { log "MariaDB did not start: see its error log"; return 1; }
    fi
  fi
  command -v mariadb >/dev/null 2>&1 || return 0
  # Each test creates its own database; `test` is the one MYSQL_URL names.
  for _ in $(seq 1 20); do
    mariadb -h127.0.0.1 -uroot -e "CREATE DATABASE IF NOT EXISTS test" 2>/dev/null && return 0
    # A fresh Debian install lets root in through the socket only: open TCP on loopback too.
    if [ "$(id -u)" = 0 ] && mariadb -uroot -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
        GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION" 2>/dev/null; then
      continue
    fi
    sleep 0.5
  done
  log "MariaDB listens on 127.0.0.1:3306 but root cannot log in from 127.0.0.1 without a password"
  return 1
}

ensure_redis() {
  port_open 6379 && return 0
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server
  log "starting the local Redis"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir "${TMPDIR:-/tmp}" --logfile "${TMPDIR:-/tmp}/redis-test.log"
  wait_port 6379 Redis
}

# A broker on its standard port: docker compose where Docker runs, else the installed server.
docker_runs() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

ensure_rabbitmq() {
  port_open 5672 && return 0
  if docker_runs; then
    log "starting RabbitMQ with docker compose"
    docker compose up -d --wait rabbitmq
  elif command -v rabbitmq-server >/dev/null 2>&1; then
    log "starting the local RabbitMQ"
    rabbitmq-server -detached
  else
    log "RabbitMQ is not reachable on 127.0.0.1:5672 and neither Docker nor rabbitmq-server is installed:"
    log "install rabbitmq-server (apt-get install rabbitmq-server) or run: docker compose up -d rabbitmq"
    return 1
  fi
  # RabbitMQ takes a while to boot (Erlang VM, then the AMQP listener).
  for _ in $(seq 1 120); do
    port_open 5672 && return 0
    sleep 0.5
  done
  log "RabbitMQ is not reachable on 127.0.0.1:5672 after 60 s"
  return 1
}

ensure_nats() {
  port_open 4222 && return 0
  if docker_runs; then
    log "starting NATS (JetStream) with docker compose"
    docker compose up -d --wait nats
  elif [ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null 2>&1; then
    log "starting the local NATS server with JetStream"
    local bin
    bin=$(command -v nats-server || echo /usr/sbin/nats-server)
    mkdir -p /var/lib/nats-server
    start-stop-daemon --start --oknodo --background --exec "$bin" -- \
      -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  else
    log "NATS is not reachable on 127.0.0.1:4222 and neither Docker nor nats-server is installed:"
    log "install nats-server (apt-get install nats-server) or run: docker compose up -d nats"
    return 1
  fi
  wait_port 4222 NATS
}

ensure_nextest() {
  command -v cargo-nextest >/dev/null 2>&1 && return 0
  log "installing cargo-nextest"
  cargo install --locked cargo-nextest
}

# Test databases of earlier runs: each database test makes its own (crates/testkit), on the
# servers and as SQLite files `tidem_*.db` in the temp dir.
drop_old_test_databases() {
  find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'tidem_*.db*' -type f -delete 2>/dev/null || true
  if command -v mariadb >/dev/null 2>&1; then
    mariadb -h127.0.0.1 -uroot -N -e "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'tidem\\_%'" 2>/dev/null |
      while read -r db; do
        mariadb -h127.0.0.1 -uroot -e "DROP DATABASE IF EXISTS \`$db\`" >/dev/null 2>&1 || true
      done
  fi
  command -v psql >/dev/null 2>&1 || return 0
  psql "$DATABASE_URL" -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'tidem\_%'" 2>/dev/null |
    while read -r db; do
      psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    done
}

ensure_postgres
ensure_mariadb
ensure_redis
scripts/redis-cluster.sh start
ensure_rabbitmq
ensure_nats
ensure_nextest
drop_old_test_databases

log "DATABASE_URL=$DATABASE_URL MYSQL_URL=$MYSQL_URL REDIS_URL=$REDIS_URL REDIS_CLUSTER_URLS=$REDIS_CLUSTER_URLS AMQP_URL=$AMQP_URL NATS_URL=$NATS_URL"
# nextest does not run doctests: run them first, so nextest's summary closes the run.
cargo test --workspace --all-features --doc
cargo nextest run --workspace --all-features --no-fail-fast "$@"
