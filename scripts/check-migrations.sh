#!/usr/bin/env bash
# The top-level migrations/ folder (for users' own migration tools) holds exactly the SQL the
# crate embeds (crates/tower-idempotency/migrations/), file for file.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! diff -r --exclude README.md crates/tower-idempotency/migrations migrations; then
  echo "migrations/ differs from crates/tower-idempotency/migrations/: copy the crate's files with" >&2
  echo "  cp -r crates/tower-idempotency/migrations/* migrations/" >&2
  exit 1
fi
echo "migrations/ matches the crate's embedded migrations ($(find migrations -name '*.sql' | wc -l) files)"
