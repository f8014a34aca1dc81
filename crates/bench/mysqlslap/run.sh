#!/usr/bin/env bash
# The database's own ceiling for the MySQL store's statements, with mysqlslap (no HTTP, no
# Rust): what one first-time request and one replay cost the server, next to the bare INSERT.
#
#   crates/bench/mysqlslap/run.sh [REQUESTS] [CONCURRENCY]
#
# Runs against 127.0.0.1:3306 as root without a password (MYSQL_URL's server), in its own
# database tower_idempotency_mysqlslap (dropped and created again: the store's migration, the
# bench's orders table, one saved answer for the replay script). REQUESTS per run, shared by
# the clients (default 4000), CONCURRENCY (default "1,8,32", mysqlslap's comma list).
#
# The claim is the store's own statement (src/store/sql/mysql/claim.sql, its five parameters
# written in as session variables); the live read and the save are the store's statements with
# the same values. Each script is one request; every statement autocommits, as the store's do.
# Prints requests/s per script and concurrency (mysqlslap's mean over 2 iterations).
set -euo pipefail
cd "$(dirname "$0")"
requests="${1:-4000}"
concurrency="${2:-1,8,32}"
db=tower_idempotency_mysqlslap
my=(mariadb -h127.0.0.1 -uroot)
command -v mariadb >/dev/null || my=(mysql -h127.0.0.1 -uroot)
slap=mariadb-slap
command -v "$slap" >/dev/null || slap=mysqlslap

now="CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED)"
claim=$(grep -v '^--' ../../tower-idempotency/src/store/sql/mysql/claim.sql |
  perl -0pe 'BEGIN { @v = ("\@k", "\@fp", "\@t", "30000", "86400000") } s/\?/shift @v/ge')
live="SELECT CASE WHEN r.fingerprint <> @fp THEN 'mismatch' WHEN r.state = 'done' THEN 'done'
  ELSE 'in_flight' END AS outcome, FALSE AS taken_over,
  GREATEST(0, r.lease_until - clock.now) AS lease_remaining_ms, r.status, r.headers, r.body
FROM idempotency_records AS r, (SELECT $now AS now) AS clock
WHERE r.\`key\` = @k AND r.expires_at > clock.now
  AND (r.fingerprint <> @fp OR r.state = 'done' OR r.lease_until > clock.now)"
save="UPDATE idempotency_records SET state = 'done', status = 201,
  headers = 'content-type: application/json\n',
  body = '{\"orderId\":1,\"customerId\":\"c_1\",\"totalCents\":4000,\"status\":\"pending\"}'
WHERE \`key\` = @k AND token = @t AND state = 'running'"
insert="INSERT INTO bench_orders (customer_id, total_cents) VALUES ('c_1', 4000)"
fresh="SET @k = UNHEX(SHA2(UUID(), 256)), @fp = UNHEX(SHA2('fp', 256)), @t = UNHEX(REPLACE(UUID(), '-', ''))"

"${my[@]}" -e "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db"
"${my[@]}" "$db" < ../../tower-idempotency/migrations/mysql/0001_idempotency_records.sql
"${my[@]}" "$db" -e "CREATE TABLE bench_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY,
  customer_id VARCHAR(255) NOT NULL, total_cents BIGINT NOT NULL) ENGINE = InnoDB;
  $fresh; SET @k = UNHEX(SHA2('replayed', 256)); $claim; $save"

declare -A scripts=(
  [bare]="$insert;"
  [first_standard]="$fresh;$live;$claim;$insert;$save;"
  [first_claim_only]="$fresh;$live;$claim;"
  [replay]="SET @k = UNHEX(SHA2('replayed', 256)), @fp = UNHEX(SHA2('fp', 256));$live;"
)
declare -A statements=([bare]=1 [first_standard]=5 [first_claim_only]=3 [replay]=2)

printf '| script | clients | requests/s |\n|---|---:|---:|\n'
for name in bare first_standard first_claim_only replay; do
  out=$("$slap" -h127.0.0.1 -uroot --create-schema="$db" --delimiter=';' \
    --query="${scripts[$name]}" --concurrency="$concurrency" --iterations=2 \
    --number-of-queries=$((requests * statements[$name])) 2>&1)
  # One block per concurrency: "Number of clients running queries: N" then the mean seconds.
  echo "$out" | awk -v requests="$requests" -v name="$name" '
    /Average number of seconds to run all queries/ { secs = $(NF-1) }
    /Number of clients running queries/ { printf "| %s | %d | %.0f |\n", name, $NF, requests / secs }'
done
