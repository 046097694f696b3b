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

if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

rm -rf "$WORK" && mkdir -p "$WORK"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
./target/debug/socialgate demo --listen "127.0.0.1:$port" >"$WORK/demo.out" 2>"$WORK/demo.err" &
demo=$!
trap 'kill "$demo" 2>/dev/null; wait "$demo" 2>/dev/null || true' EXIT

key=""
for _ in $(seq 1 100); do
    key=$(sed -n 's/^demo API key: //p' "$WORK/demo.out")
    if [ -n "$key" ] && python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1])" "$base/readyz" 2>/dev/null; then
        break
    fi
    if ! kill -0 "$demo" 2>/dev/null; then
        echo "socialgate demo exited:" >&2
        cat "$WORK/demo.err" >&2
        exit 1
    fi
    sleep 0.1
done
if [ -z "$key" ]; then
    echo "socialgate demo did not become ready" >&2
    exit 1
fi

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
