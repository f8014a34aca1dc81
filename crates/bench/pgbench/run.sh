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
# so a change in the machine's load falls on every script alike. Scripts named batch_*.sql run
# once per batch size N of BATCH_SIZES (default "1 8 32 128"), with `-D batch=N`; each of their
# transactions serves N requests (batch_claims_and_saves.sql also needs -D prev=0, which every
# run gets), on connections with the store's batch settings (a generic plan, no sequential or
# bitmap scans). Prints tps (without the initial connection time) per round,
# then the mean, its ratio to the first script's, and for batch scripts the requests served per
# second (tps x N: claim+save pairs per second).
#
#   crates/bench/pgbench/run.sh "$DATABASE_URL" 6 1 32 bare.sql first_standard.sql batch_claim_save.sql
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

# One run per script, and per batch size for batch scripts: "script" or "script N".
runs=()
for script in "${scripts[@]}"; do
  case "$script" in
    batch_*) for n in ${BATCH_SIZES:-1 8 32 128}; do runs+=("$script $n"); done ;;
    *) runs+=("$script") ;;
  esac
done

db=tower_idempotency_pgbench
# The same URL with the database replaced (a query string, if any, is kept).
base="${url%%\?*}"
query=""
[ "$base" = "$url" ] || query="?${url#*\?}"
db_url="${base%/*}/$db$query"

PGOPTIONS="-c client_min_messages=warning" psql "$url" -qX -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
PGOPTIONS="-c client_min_messages=warning" psql "$db_url" -qX -v ON_ERROR_STOP=1 -f schema.sql >/dev/null

# The store runs its batch statements on connections with these settings (batch_connections in
# the PostgreSQL store's mod.rs): one generic plan per statement, probes by key.
BATCH_OPTIONS="-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c enable_bitmapscan=off"

declare -A results
n=${#runs[@]}
for ((round = 0; round < rounds; round++)); do
  for ((i = 0; i < n; i++)); do
    run="${runs[(i + round) % n]}"
    read -r script batch <<<"$run"
    args=(-n -M prepared)
    case "$script" in simple_*) args=(-n -M simple) ;; esac
    options=""
    if [ -n "$batch" ]; then
      args+=(-D "batch=$batch" -D prev=0)
      options="$BATCH_OPTIONS"
    fi
    tps=$(PGOPTIONS="$options" pgbench "${args[@]}" -c "$clients" -j 2 -T "$seconds" -f "$script" "$db_url" 2>&1 |
      sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' || true)
    if [ -z "$tps" ]; then
      echo "pgbench failed on $run:" >&2
      PGOPTIONS="$options" pgbench "${args[@]}" -c 1 -t 1 -f "$script" "$db_url" >&2 || true
      exit 1
    fi
    results[$run]="${results[$run]:-} $tps"
    printf 'round %d  %-30s %8.0f tps\n' "$((round + 1))" "$run" "$tps" >&2
  done
done

printf '\n%d clients, -M prepared (simple_*: -M simple), %s s per run, %d alternating rounds\n\n' "$clients" "$seconds" "$rounds"
printf '| script | N | tps per round | mean tps | vs %s | requests/s (tps x N) |\n|---|---:|---|---:|---:|---:|\n' "${runs[0]}"
first_mean=""
for run in "${runs[@]}"; do
  read -r script batch <<<"$run"
  mean=$(echo "${results[$run]}" | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.0f", s / NF }')
  [ -n "$first_mean" ] || first_mean=$mean
  per_round=$(echo "${results[$run]}" | awk '{ for (i = 1; i <= NF; i++) printf "%s%.0f", (i > 1 ? ", " : ""), $i }')
  ratio=$(awk -v a="$mean" -v b="$first_mean" 'BEGIN { printf "%.2fx", a / b }')
  served=""
  [ -z "$batch" ] || served=$(awk -v a="$mean" -v b="$batch" 'BEGIN { printf "%.0f", a * b }')
  printf '| %s | %s | %s | %s | %s | %s |\n' "$script" "${batch:-}" "$per_round" "$mean" "$ratio" "$served"
done
