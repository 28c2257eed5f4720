#!/usr/bin/env bash
# Regenerate the files derived from Rust types: charts/floe/files/crds/floe-crds{,-pre-1.25}.yaml, docs/crds.md,
# docs/trajectory.schema.json and docs/cli.md (the `floe` command reference, from the clap definitions);
# and from the chart, deploy/operator-rbac.yaml (its RBAC for the operator without Helm).
set -euo pipefail
cd "$(dirname "$0")/.."
FLOE_BLESS=1 cargo test --quiet -p floe-crds --test generated_files
FLOE_BLESS=1 cargo test --quiet -p floe-gateway --test wire_format checked_in_schema
FLOE_BLESS=1 cargo test --quiet -p floe --bin floe cli_reference
FLOE_BLESS=1 cargo test --quiet -p floe-tests --test chart the_helmless_rbac_manifest_is_the_charts
git status --short charts/floe/files/crds docs/crds.md docs/trajectory.schema.json docs/cli.md deploy/
