#!/usr/bin/env bash
# Install the official `swebench` package, pinned, into a versioned cache, and print the cache
# directory:
#   <dir>/venv/bin/python     has swebench: floe grades SWE-bench instances with it
#                             (`floe run --swebench-python`, docs/swebench.md);
#   <dir>/testbed/bin/python  has pytest: the test instances' environment in floe's own tests
#                             (what an image's conda `testbed` environment is to a real one).
# Changing a pin changes the cache key. Needs python3 with venv; packages come from the registry
# the machine's pip configuration names.
set -euo pipefail
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
PIN="swebench==5.0.2"
TESTBED_PIN="pytest==8.4.2"
KEY=$(printf '%s\n%s\n%s\n' "$PIN" "$TESTBED_PIN" "$(python3 --version)" | cksum | cut -d' ' -f1)
DIR=$CACHE/swebench-$KEY
if [ ! -f "$DIR/.complete" ]; then
  rm -rf "$DIR"; mkdir -p "$DIR"
  python3 -m venv "$DIR/venv" >&2
  "$DIR/venv/bin/pip" install --quiet --disable-pip-version-check "$PIN" >&2
  "$DIR/venv/bin/python" -I -c "import swebench.harness.grading, swebench.harness.utils" >&2
  python3 -m venv "$DIR/testbed" >&2
  "$DIR/testbed/bin/pip" install --quiet --disable-pip-version-check "$TESTBED_PIN" >&2
  touch "$DIR/.complete"
fi
echo "$DIR"
