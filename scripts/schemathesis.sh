#!/usr/bin/env bash
# Property-based API tests: schemathesis (PyPI) against the real orders API with its own
# /openapi.json, on SQLite, on PostgreSQL (DATABASE_URL's server) and on MariaDB/MySQL
# (MYSQL_URL's server), each a fresh database. Fails on
# an undocumented status, a 5xx other than a documented 503, a response that breaks its schema,
# or a schema-valid request refused. Bounded: a few examples per operation, about a minute each.
#
#   scripts/schemathesis.sh            # builds the binary, runs the three databases
set -euo pipefail
cd "$(dirname "$0")/.."
SCHEMATHESIS_VERSION=4.32.5
MAX_EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-25}"
command -v st >/dev/null && st --version | grep -q "$SCHEMATHESIS_VERSION" \
  || python3 -m pip install -q "schemathesis==$SCHEMATHESIS_VERSION"
cargo build -q -p orders-api
target="${CARGO_TARGET_DIR:-target}"
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

run_against() {
  local name=$1 database_url=$2
  BIND_ADDR=127.0.0.1:0 DATABASE_URL="$database_url" RUST_LOG=warn \
    "$target/debug/orders-api" >"$work/$name.out" 2>"$work/$name.err" &
  pids+=($!)
  local url=""
  for _ in $(seq 1 100); do
    url=$(sed -n 's/^listening on //p' "$work/$name.out")
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$work/$name.err"; echo "orders-api on $name did not start"; return 1; }
  echo "== schemathesis against the orders API on $name ($url)"
  timeout 150 st run "$url/openapi.json" --checks all --max-examples "$MAX_EXAMPLES" \
    --phases examples,coverage,fuzzing,stateful --seed 20 --request-timeout 10 \
    --report junit --report-junit-path "$work/$name.xml"
  python3 - "$work/$name.xml" "$name" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
tests = sum(int(s.get("tests", 0)) for s in suites)
failures = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
print(f"schemathesis {sys.argv[2]}: {tests} operations/phases, {failures} failed")
PY
}

run_against sqlite "sqlite://$work/orders.db"
db="tidem_schemathesis_$$"
pg="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
psql "$pg" -qc "CREATE DATABASE $db" >/dev/null
my="${MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
# mysql://USER[:PASSWORD]@HOST:PORT/DB, as the tests read it.
my_args() {
  python3 - "$my" <<'PY'
import sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
args = ["-h", u.hostname or "127.0.0.1", "-P", str(u.port or 3306), "-u", urllib.parse.unquote(u.username or "root")]
if u.password:
    args.append("-p" + urllib.parse.unquote(u.password))
print(" ".join(args))
PY
}
drop_databases() {
  psql "$pg" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true
  mariadb $(my_args) -e "DROP DATABASE IF EXISTS $db" || true
}
trap 'cleanup; drop_databases' EXIT
run_against postgres "${pg%/*}/$db"
mariadb $(my_args) -e "CREATE DATABASE $db"
run_against mysql "${my%/*}/$db"
