#!/usr/bin/env bash
# Schemathesis against a real server: the built binary's `socialgate demo`
# (the real host and plugins, with the sandbox upstreams) on a free port,
# tested from the document it serves at /v1/openapi.json. Every check, every
# phase (examples, coverage, fuzzing, stateful), positive and negative data,
# a fixed number of examples and a fixed seed; any finding fails the run.
#
# Needs `cargo build --workspace` first. Installs schemathesis (pinned) in a
# venv under target/ once. Locally: `bash .ci/schemathesis.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
MAX_EXAMPLES=${MAX_EXAMPLES:-15}
VENV=target/ci-venv
WORK=target/ci-schemathesis

. scripts/demo-server.sh
venv_tool "$VENV" schemathesis schemathesis "$SCHEMATHESIS_VERSION"
rm -rf "$WORK" && mkdir -p "$WORK"
start_demo "$WORK"
base=$DEMO_BASE
key=$DEMO_KEY

started=$(date +%s)
status=0
# Run from the work folder: schemathesis keeps a cache in its working
# directory, which belongs under target/, not in the tree.
root=$PWD
cd "$WORK"
timeout 300 "$root/$VENV/bin/schemathesis" --config-file "$root/.ci/schemathesis.toml" run "$base/v1/openapi.json" \
    --url "$base" \
    --header "X-API-Key: $key" \
    --checks all \
    --phases examples,coverage,fuzzing,stateful \
    --mode all \
    --max-examples "$MAX_EXAMPLES" \
    --seed 13 \
    --generation-database none \
    --workers 2 \
    --request-timeout 10 \
    --max-time 200 \
    --suppress-health-check all \
    --warnings off \
    --no-color \
    --report junit --report-dir . || status=$?
echo "schemathesis: exit $status after $(($(date +%s) - started)) s"
exit "$status"
