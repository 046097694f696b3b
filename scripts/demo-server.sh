# Sourced, not run: what .ci/schemathesis.sh and scripts/openapi-client-check.sh
# share. Both need the debug build (`cargo build --workspace`) and run from
# the repository's root.

# venv_tool VENV COMMAND PACKAGE VERSION: installs PACKAGE==VERSION in the
# venv VENV unless its COMMAND already reports that version.
venv_tool() {
    local venv=$1 command=$2 package=$3 version=$4
    if ! "$venv/bin/$command" --version 2>/dev/null | grep -q "$version"; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "$package==$version"
    fi
}

# start_demo WORK: starts `socialgate demo` on a free port, its output in
# WORK, and waits (10 s at most) until it is ready. Sets DEMO_BASE (the
# URL) and DEMO_KEY (its API key); the server is stopped when the shell
# exits.
start_demo() {
    local work=$1 port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    DEMO_BASE="http://127.0.0.1:$port"
    ./target/debug/socialgate demo --listen "127.0.0.1:$port" >"$work/demo.out" 2>"$work/demo.err" &
    DEMO_PID=$!
    trap 'kill "$DEMO_PID" 2>/dev/null; wait "$DEMO_PID" 2>/dev/null || true' EXIT
    DEMO_KEY=""
    for _ in $(seq 1 100); do
        DEMO_KEY=$(sed -n 's/^demo API key: //p' "$work/demo.out")
        if [ -n "$DEMO_KEY" ] && python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1])" "$DEMO_BASE/readyz" 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "$DEMO_PID" 2>/dev/null; then
            echo "socialgate demo exited:" >&2
            cat "$work/demo.err" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "socialgate demo did not become ready" >&2
    exit 1
}
