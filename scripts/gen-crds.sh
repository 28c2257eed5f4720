#!/usr/bin/env bash
# Regenerate the files derived from the CRD types: charts/floe/crds/floe-crds.yaml and docs/crds.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOE_BLESS=1 cargo test --quiet -p floe-crds --test generated_files
git status --short charts/floe/crds docs/crds.md
