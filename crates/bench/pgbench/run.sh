#!/usr/bin/env bash
# Measure the claim and save sequences of the PostgreSQL store with pgbench, without HTTP.
#
#   crates/bench/pgbench/run.sh [DATABASE_URL] [SECONDS] [ROUNDS] [CLIENTS] [SCRIPT...]
#
# DATABASE_URL: a server where the user may create a database (default: $DATABASE_URL, else
#   postgres://postgres@127.0.0.1:5432/test). The runs use their own database,
#   tower_idempotency_pgbench, dropped and created again (schema.sql: the store's migrations,
#   the bench's orders table, 10,000 saved answers for the replay scripts).
# SECONDS per run (default 10), ROUNDS (default 3), CLIENTS (default 32; pgbench -j 2).
# SCRIPT: which scripts (default: every *.sql but schema.sql), in the order of the first round.
#
# Every script runs once per round with `pgbench -M prepared` (scripts named simple_*.sql with
# `-M simple`: they send several statements in one query string), the order rotating each round,
# so a change in the machine's load falls on every script alike. Prints tps (without the
# initial connection time) per round, then the mean and its ratio to the first script's.
set -euo pipefail
cd "$(dirname "$0")"

url="${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}"
seconds="${2:-10}"
rounds="${3:-3}"
clients="${4:-32}"
shift $(( $# < 4 ? $# : 4 ))
if [ $# -gt 0 ]; then
  scripts=("$@")
else
  scripts=()
  for f in *.sql; do [ "$f" = schema.sql ] || scripts+=("$f"); done
fi

db=tower_idempotency_pgbench
# The same URL with the database replaced (a query string, if any, is kept).
base="${url%%\?*}"
query=""
[ "$base" = "$url" ] || query="?${url#*\?}"
db_url="${base%/*}/$db$query"

PGOPTIONS="-c client_min_messages=warning" psql "$url" -qX -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
PGOPTIONS="-c client_min_messages=warning" psql "$db_url" -qX -v ON_ERROR_STOP=1 -f schema.sql >/dev/null

declare -A results
n=${#scripts[@]}
for ((round = 0; round < rounds; round++)); do
  for ((i = 0; i < n; i++)); do
    script="${scripts[(i + round) % n]}"
    mode=prepared
    case "$script" in simple_*) mode=simple ;; esac
    tps=$(pgbench -n -M "$mode" -c "$clients" -j 2 -T "$seconds" -f "$script" "$db_url" 2>&1 |
      sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' || true)
    if [ -z "$tps" ]; then
      echo "pgbench failed on $script:" >&2
      pgbench -n -M "$mode" -c 1 -t 1 -f "$script" "$db_url" >&2 || true
      exit 1
    fi
    results[$script]="${results[$script]:-} $tps"
    printf 'round %d  %-26s %8.0f tps\n' "$((round + 1))" "$script" "$tps" >&2
  done
done

printf '\n%d clients, -M prepared (simple_*: -M simple), %s s per run, %d alternating rounds\n\n' "$clients" "$seconds" "$rounds"
printf '| script | tps per round | mean | vs %s |\n|---|---|---:|---:|\n' "${scripts[0]}"
first_mean=""
for script in "${scripts[@]}"; do
  mean=$(echo "${results[$script]}" | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.0f", s / NF }')
  [ -n "$first_mean" ] || first_mean=$mean
  per_round=$(echo "${results[$script]}" | awk '{ for (i = 1; i <= NF; i++) printf "%s%.0f", (i > 1 ? ", " : ""), $i }')
  ratio=$(awk -v a="$mean" -v b="$first_mean" 'BEGIN { printf "%.2fx", a / b }')
  printf '| %s | %s | %s | %s |\n' "$script" "$per_round" "$mean" "$ratio"
done
