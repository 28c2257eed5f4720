#!/usr/bin/env bash
# Fuzz the gateway's request parsers and its reader of vLLM's answers (fuzz/): libFuzzer via
# cargo-fuzz, on stable Rust with `--sanitizer none` (AddressSanitizer needs nightly; what is
# fuzzed is that safe Rust never panics — overflow and bounds checks on, every input a
# normalized request or a 4xx). cargo-fuzz is installed once into ~/.cache/floe; each target's
# corpus grows there from run to run, seeded from fuzz/seeds/ and fuzz/corpus/. A crash fails
# the run and leaves the input under fuzz/artifacts/<target>/. `--minimize` then merges what the
# cache holds into the committed fuzz/corpus/ (libFuzzer's -merge=1), which the gateway's
# tests/fuzz_corpus.rs replays on every test run.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [--minimize]   (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
SECS=${1:-20}
MINIMIZE=${2:-}
V=0.13.1
TOOLS="$FLOE_CACHE/cargo-fuzz-$V"
if [ ! -x "$TOOLS/bin/cargo-fuzz" ]; then
  cargo install --quiet --locked --root "$TOOLS" cargo-fuzz --version "$V" >&2
fi
export PATH="$TOOLS/bin:$PATH"
TARGET_DIR="$FLOE_CACHE/fuzz-target-$(rustc -V | cksum | cut -d' ' -f1)"
CORPUS="$FLOE_CACHE/fuzz-corpus"
cd fuzz
build_log=$(mktemp)
if ! cargo fuzz build --sanitizer none --release --target-dir "$TARGET_DIR" >"$build_log" 2>&1; then
  tail -40 "$build_log" >&2
  exit 1
fi
rm -f "$build_log"
for t in $(cargo fuzz list); do
  mkdir -p "$CORPUS/$t"
  log=$(mktemp)
  if ! cargo fuzz run --sanitizer none --release --target-dir "$TARGET_DIR" "$t" "$CORPUS/$t" "seeds/$t" "corpus/$t" \
      -- -max_total_time="$SECS" -dict=json.dict -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "[fuzz] $t FAILED: the input is under fuzz/artifacts/$t/" >&2
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  echo "[fuzz] $t: $runs runs in ${SECS} s, no crash ($cov, corpus $(ls "$CORPUS/$t" | wc -l) inputs)" >&2
  rm -f "$log"
done

[ "$MINIMIZE" = --minimize ] || exit 0
# libFuzzer's merge: into an empty directory, the fewest inputs of the cache's corpus, the
# committed one and the seeds that keep all the coverage they reach together (what produced
# the committed corpus).
for t in $(cargo fuzz list); do
  merged=$(mktemp -d)
  log=$(mktemp)
  cargo fuzz run --sanitizer none --release --target-dir "$TARGET_DIR" "$t" "$merged" "$CORPUS/$t" "corpus/$t" "seeds/$t" \
      -- -merge=1 -dict=json.dict >"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
  rm -rf "corpus/$t" && mv "$merged" "corpus/$t" && chmod 755 "corpus/$t"
  echo "[fuzz] $t: corpus minimized to $(ls "corpus/$t" | wc -l) inputs ($(du -sh "corpus/$t" | cut -f1))" >&2
  rm -f "$log"
done
