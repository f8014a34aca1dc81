#!/usr/bin/env bash
# A bounded fuzzing run of every cargo-fuzz target (see fuzz/README.md).
#
#   scripts/fuzz.sh        # 30 s per target
#   scripts/fuzz.sh 300    # 5 minutes per target
#
# Reads the committed corpus without changing it; exits non-zero on the first failing input
# (saved under fuzz/artifacts/<target>/). Needs a nightly toolchain and cargo-fuzz; with only a
# stable toolchain it uses RUSTC_BOOTSTRAP=1, which the targets' build accepts.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-30}"
log() { printf '[fuzz.sh] %s\n' "$*" >&2; }

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

if rustup run nightly rustc --version >/dev/null 2>&1; then
  toolchain=(+nightly)
else
  log "no nightly toolchain: building with RUSTC_BOOTSTRAP=1 on the default one"
  export RUSTC_BOOTSTRAP=1
  toolchain=()
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

for target in $(cargo "${toolchain[@]}" fuzz list); do
  log "$target: ${seconds} s"
  mkdir -p "$scratch/$target"
  cargo "${toolchain[@]}" fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1
done
log "no failure"
