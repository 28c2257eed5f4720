# Sourced by scripts/test.sh and .ci/run: where heavy, reusable build products live.
# Everything is keyed by version, so a cache is never reused for something it was not built for.
export FLOE_CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
# One cargo target dir per toolchain, shared by every checkout on this machine (a fresh CI clone
# then rebuilds only floe's own crates, not the ~300 dependencies).
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  CARGO_TARGET_DIR="$FLOE_CACHE/cargo-target-$(rustc -V | cksum | cut -d' ' -f1)"
  export CARGO_TARGET_DIR
fi

# The floe binary the example scripts run: $FLOE, else `floe` from PATH, else a dev build.
floe_binary() {
  if [ -n "${FLOE:-}" ]; then echo "$FLOE"
  elif command -v floe >/dev/null; then command -v floe
  else
    echo "[floe] building floe" >&2
    cargo build --quiet -p floe
    echo "$CARGO_TARGET_DIR/debug/floe"
  fi
}
