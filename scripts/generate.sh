#!/usr/bin/env bash
# Regenerate the files derived from Rust types: charts/floe/files/crds/floe-crds{,-pre-1.25}.yaml, docs/crds.md and
# docs/trajectory.schema.json.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOE_BLESS=1 cargo test --quiet -p floe-crds --test generated_files
FLOE_BLESS=1 cargo test --quiet -p floe-gateway --test wire_format checked_in_schema
git status --short charts/floe/files/crds docs/crds.md docs/trajectory.schema.json
