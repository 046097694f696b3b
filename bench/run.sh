#!/usr/bin/env bash
# Side-by-side benchmark of socialgate against nginx (issue 9).
#
# One shared upstream double (nginx, 1 worker, the contract's sample
# payloads) and three things measured against it, interleaved, on 127.0.0.1:
#   static      wrk straight at the upstream URL the plugin requests
#   proxy       wrk at a plain nginx reverse proxy (1 worker, keepalive)
#   socialgate  wrk at the release build (with profile-guided optimization
#               and BOLT unless BENCH_PGO=0: see pgo_build and bolt_build),
#               `shortvideo-primary` -> upstream
# then the floor: bench/floor (socialgate's runtime, HTTP server and
# upstream client forwarding, with none of its work) on one serving thread,
# one per core and one more, and socialgate on one thread, beside the proxy and
# socialgate, with the CPU each spends per request; then, when the build
# has the response cache (issue 10), two cache scenarios: cached `profile`
# against nginx `proxy_cache` and nginx static, and a seeded Zipf trace
# replayed once through a fresh instance, counting the upstream requests it
# causes; then the shared-state scenario (issue 15): one instance on
# `[state] backend = "redis"` against the same instance on "local",
# interleaved; then the user-space instructions an uncached `profile`
# costs socialgate and the nginx proxy, counted by callgrind (a figure the
# machine's load does not move); last, growth figures of socialgate alone
# (connections, keys, idle memory).
#
# Usage: bench/run.sh   (knobs: see bench/README.md or the block below)
# Exit: 0 targets met; 1 a target missed (the reasons are printed last);
#       2 the benchmark could not run (setup, check or tool failure).
# Working files: $CARGO_TARGET_DIR/bench (default target/bench), wiped at
# start. Everything started here is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/bench
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$TARGET_DIR/bench

# ------------------------------------------------------------------ knobs
DURATION=${BENCH_SECONDS:-6}              # seconds per wrk run
ROUNDS=${BENCH_ROUNDS:-3}                 # figures are medians over rounds
CONNS=${BENCH_CONNS:-"32 256"}            # side-by-side connection counts
CHECK_CONNS=${BENCH_CHECK_CONNS:-32}      # where the targets are checked
TARGET_RATIO=${BENCH_TARGET_RATIO:-0.8}   # socialgate/proxy req/s, profile
P99_FACTOR=${BENCH_P99_FACTOR:-2}         # socialgate p99 <= this x proxy p99
GROWTH=${BENCH_GROWTH:-1}                 # 0 skips the growth figures
GROWTH_CONNS=${BENCH_GROWTH_CONNS:-"1 32 256 1024"}
KEYS_SMALL=10                             # keys of the main instance
KEYS_LARGE=${BENCH_KEYS_LARGE:-100000}
IDLE_CONNS=${BENCH_IDLE_CONNS:-10000}
WARMUP=${BENCH_WARMUP_SECONDS:-2}         # per target and endpoint, unrecorded
LOG_LEVEL=${BENCH_LOG:-info}              # SOCIALGATE_LOG of the servers
COMMENTS_COUNT=${BENCH_COMMENTS_COUNT:-60}
SKIP_BUILD=${BENCH_SKIP_BUILD:-0}         # 1: use the existing release build
# The cache scenarios. 1: run them when the build has the cache, print them
# skipped otherwise; 0: skip them; force: run them even on a build without
# the cache (figures and checks printed, never enforced: the "before").
CACHE_MODE=${BENCH_CACHE:-1}
CACHE_PROXY_RATIO=${BENCH_CACHE_PROXY_RATIO:-1.5}   # sg cached / nginx proxy_cache req/s
CACHE_STATIC_RATIO=${BENCH_CACHE_STATIC_RATIO:-0.5} # sg cached / nginx static req/s
TRACE_REQUESTS=${BENCH_TRACE_REQUESTS:-20000}
TRACE_USERS=${BENCH_TRACE_USERS:-2000}
TRACE_S=${BENCH_TRACE_S:-1.0}             # Zipf exponent
TRACE_SEED=${BENCH_TRACE_SEED:-42}
TRACE_CONNS=${BENCH_TRACE_CONNS:-32}      # replayer threads, one connection each
# The shared-state scenario: 1 runs it, 0 skips it.
REDIS_MODE=${BENCH_REDIS:-1}
REDIS_RATIO=${BENCH_REDIS_RATIO:-0.7}     # redis/local req/s at BENCH_CHECK_CONNS
REDIS_P50_MS=${BENCH_REDIS_P50_MS:-0.5}   # most p50 redis may add, at 1 connection
# appendfsync of the redis instances' servers; the first is judged.
REDIS_FSYNC=${BENCH_REDIS_FSYNC:-"everysec always"}

# The floor: 1 runs it (bench/floor, and socialgate on one thread, beside
# the nginx proxy), 0 skips it.
FLOOR_MODE=${BENCH_FLOOR:-1}

# How socialgate is built: 1 with profile-guided optimization (an
# instrumented build trained here on a mix of requests, then the release
# build with that profile; see pgo_build), 0 the plain release build only.
PGO_MODE=${BENCH_PGO:-1}
PGO_TRAIN_SECONDS=${BENCH_PGO_TRAIN_SECONDS:-3}   # per request kind trained
# BOLT, LLVM's post-link optimizer, on the PGO build: 1 lays its code out
# again by how an instrumented copy of it ran the same training (see
# bolt_build), 0 measures the PGO build as linked. Needs BENCH_PGO=1.
BOLT_MODE=${BENCH_BOLT:-$PGO_MODE}
BUILD_ONLY=${BENCH_BUILD_ONLY:-0}         # 1: stop once the builds are made

# The instruction count: 1 runs it (valgrind's callgrind), 0 skips it.
INSTR_MODE=${BENCH_INSTRUCTIONS:-1}
INSTR_SECONDS=${BENCH_INSTR_SECONDS:-8}   # seconds of wrk -c4 counted

# The fixtures' subjects (tests/src/upstream.rs: LUNA, POST_ID).
USERNAME=lunabakes
POST_ID=7312345678901234567
# The upstream key socialgate sends (via api_key_env) and nginx checks.
export SHORTVIDEO_PRIMARY_KEY=bench-upstream-key
# The cursor key of the instances that share state (replicas must share it),
# named by their `cursor_key_env`.
export BENCH_CURSOR_KEY=bench-cursor-key-shared-by-replicas-0123456789
# The per-request state work of a shared deployment: a rate limit that never
# refuses and billing enforced with credits that never run out.
STATE_WORK_TABLES=$'[rate_limit]\nper_second = 1000000\nburst = 1000000\n\n[billing]\nenforce = true\nfree_credits = 1000000000000\n'

PIDS=()        # everything started here, stopped by cleanup()
NGINX_WRAP=()  # a command nginx runs under (valgrind), for the next start
SG_WRAP=()     # the same for socialgate

# ------------------------------------------------------------ utilities
log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() {
    log "ERROR: $*" >&2
    exit 2
}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_number() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }

validate_knobs() {
    local v
    for v in "$DURATION" "$ROUNDS" "$CHECK_CONNS" "$KEYS_LARGE" "$IDLE_CONNS" \
        "$WARMUP" "$COMMENTS_COUNT" "$TRACE_REQUESTS" "$TRACE_USERS" "$TRACE_SEED" \
        "$TRACE_CONNS" "$INSTR_SECONDS" "$PGO_TRAIN_SECONDS" $CONNS $GROWTH_CONNS; do
        is_uint "$v" || die "not a whole number: '$v' (check the BENCH_* variables)"
    done
    is_number "$TARGET_RATIO" || die "BENCH_TARGET_RATIO is not a number: $TARGET_RATIO"
    is_number "$P99_FACTOR" || die "BENCH_P99_FACTOR is not a number: $P99_FACTOR"
    is_number "$CACHE_PROXY_RATIO" || die "BENCH_CACHE_PROXY_RATIO is not a number: $CACHE_PROXY_RATIO"
    is_number "$CACHE_STATIC_RATIO" || die "BENCH_CACHE_STATIC_RATIO is not a number: $CACHE_STATIC_RATIO"
    is_number "$TRACE_S" || die "BENCH_TRACE_S is not a number: $TRACE_S"
    is_number "$REDIS_RATIO" || die "BENCH_REDIS_RATIO is not a number: $REDIS_RATIO"
    is_number "$REDIS_P50_MS" || die "BENCH_REDIS_P50_MS is not a number: $REDIS_P50_MS"
    [[ $REDIS_MODE =~ ^(0|1)$ ]] || die "BENCH_REDIS is 0 or 1, not '$REDIS_MODE'"
    [[ $REDIS_FSYNC =~ ^(always|everysec|no)( (always|everysec|no))*$ ]] ||
        die "BENCH_REDIS_FSYNC lists always, everysec or no"
    [[ $CACHE_MODE =~ ^(0|1|force)$ ]] || die "BENCH_CACHE is 0, 1 or force, not '$CACHE_MODE'"
    [[ $INSTR_MODE =~ ^(0|1)$ ]] || die "BENCH_INSTRUCTIONS is 0 or 1, not '$INSTR_MODE'"
    [[ $FLOOR_MODE =~ ^(0|1)$ ]] || die "BENCH_FLOOR is 0 or 1, not '$FLOOR_MODE'"
    [[ $PGO_MODE =~ ^(0|1)$ ]] || die "BENCH_PGO is 0 or 1, not '$PGO_MODE'"
    [[ $BOLT_MODE =~ ^(0|1)$ ]] || die "BENCH_BOLT is 0 or 1, not '$BOLT_MODE'"
    [[ $BOLT_MODE == 0 || $PGO_MODE == 1 ]] ||
        die "BENCH_BOLT=1 works on the PGO build: it needs BENCH_PGO=1"
    [[ $BUILD_ONLY =~ ^(0|1)$ ]] || die "BENCH_BUILD_ONLY is 0 or 1, not '$BUILD_ONLY'"
    ((PGO_TRAIN_SECONDS >= 1)) || die "BENCH_PGO_TRAIN_SECONDS must be >= 1"
    ((INSTR_SECONDS >= 1)) || die "BENCH_INSTR_SECONDS must be >= 1"
    ((TRACE_REQUESTS >= 1 && TRACE_USERS >= 1 && TRACE_CONNS >= 1)) ||
        die "BENCH_TRACE_REQUESTS, BENCH_TRACE_USERS and BENCH_TRACE_CONNS must be >= 1"
    ((DURATION >= 1 && ROUNDS >= 1)) || die "BENCH_SECONDS and BENCH_ROUNDS must be >= 1"
    ((COMMENTS_COUNT >= 1 && COMMENTS_COUNT <= 200)) || die "BENCH_COMMENTS_COUNT is 1-200"
    ((KEYS_LARGE > KEYS_SMALL)) || die "BENCH_KEYS_LARGE must exceed $KEYS_SMALL"
    [[ " $CONNS " == *" $CHECK_CONNS "* ]] ||
        die "BENCH_CONNS ($CONNS) must include BENCH_CHECK_CONNS ($CHECK_CONNS): the targets are checked there"
}

# Stops one process started here: TERM, a bounded wait, then KILL.
stop_pid() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    { wait "$pid"; } 2>/dev/null || true
}

forget_pid() {
    local pid=$1 i
    for i in "${!PIDS[@]}"; do
        # An `if`, not `&&`: a last entry that differs must not fail the call.
        if [[ ${PIDS[$i]} == "$pid" ]]; then unset 'PIDS[i]'; fi
    done
}

cleanup() {
    local status=$? idx i
    trap - EXIT INT TERM
    # Reverse order: clients before servers, servers before their upstream.
    idx=("${!PIDS[@]}")
    for ((i = ${#idx[@]} - 1; i >= 0; i--)); do
        stop_pid "${PIDS[${idx[$i]}]}"
    done
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits until `curl URL` answers at all (any status), up to 15 s.
wait_http() {
    local url=$1 pid=$2 i
    for ((i = 0; i < 150; i++)); do
        kill -0 "$pid" 2>/dev/null || return 1
        curl -s -o /dev/null --max-time 1 "$url" && return 0
        sleep 0.1
    done
    return 1
}

# listening_url FILE PID: the URL a server prints as `listening on URL` to
# FILE once it accepts; empty when PID exits first or after 30 s.
listening_url() {
    local file=$1 pid=$2 url="" i
    for ((i = 0; i < 300; i++)); do
        url=$(sed -n 's|^listening on \(http://[0-9.:]*\)$|\1|p' "$file")
        [[ -n $url ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    printf '%s' "$url"
}

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# 100000 -> 100,000 (for labels).
fmt_int() { sed -e ':a' -e 's/\([0-9]\)\([0-9]\{3\}\)\($\|,\)/\1,\2\3/' -e 'ta' <<<"$1"; }

# record_rss LABEL PID: one row of the memory table.
record_rss() { printf '%s\t%s\n' "$1" "$(rss_kib "$2")" >>"$WORK/memory.tsv"; }

# ---------------------------------------------------------------- set-up
ensure_tools() {
    local missing=()
    command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
    command -v wrk >/dev/null || missing+=(wrk)
    command -v curl >/dev/null || missing+=(curl)
    command -v python3 >/dev/null || missing+=(python3)
    if [[ $INSTR_MODE == 1 ]]; then
        command -v callgrind_control >/dev/null || missing+=(valgrind)
    fi
    if [[ $PGO_MODE == 1 ]] && ! find_profdata >/dev/null; then
        missing+=("llvm-$(llvm_major)")
    fi
    if [[ $BOLT_MODE == 1 ]] && ! find_bolt >/dev/null; then
        local package
        package=$(bolt_package) ||
            die "no llvm-bolt $BOLT_MIN_VERSION or later here, nor a bolt-N package of one to install (BENCH_BOLT=0 measures the PGO build as linked)"
        missing+=("$package")
    fi
    if ((${#missing[@]})); then
        local sudo=()
        ((EUID == 0)) || sudo=(sudo)
        log "installing ${missing[*]}"
        # An update only when the install fails (stale or empty package lists).
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y "${missing[@]}" ||
            {
                DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update &&
                    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y "${missing[@]}"
            } || die "cannot install ${missing[*]}"
    fi
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    if [[ $REDIS_MODE == 1 ]]; then
        "$ROOT/scripts/install-redis.sh" || die "cannot install redis-server"
    fi
    command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain"
    if [[ $PGO_MODE == 1 ]]; then
        PROFDATA=$(find_profdata) ||
            die "no llvm-profdata for rustc's LLVM $(llvm_major) (BENCH_PGO=0 measures the plain release build)"
    fi
    if [[ $BOLT_MODE == 1 ]]; then
        BOLT=$(find_bolt) ||
            die "no llvm-bolt $BOLT_MIN_VERSION or later beside a merge-fdata (BENCH_BOLT=0 measures the PGO build as linked)"
        BOLT_VERSION=$(bolt_version "$BOLT")
        log "BOLT: $BOLT (LLVM $BOLT_VERSION)"
    fi
}

# The major version of the LLVM rustc is built on: profiles it writes are
# read only by an llvm-profdata of the same version.
llvm_major() { rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p'; }

# find_profdata: the path of an llvm-profdata for rustc's LLVM: rustup's
# llvm-tools component, or the distribution's llvm-N package.
find_profdata() {
    local major sysroot candidate
    major=$(llvm_major)
    sysroot=$(rustc --print sysroot)
    for candidate in "$sysroot/lib/rustlib/$(host_triple)/bin/llvm-profdata" \
        "/usr/lib/llvm-$major/bin/llvm-profdata" "$(command -v "llvm-profdata-$major" || true)"; do
        [[ -n $major && -x $candidate ]] && { echo "$candidate"; return 0; }
    done
    return 1
}

# The oldest BOLT taken: BOLT_FLAGS' -reorder-functions=cdsort is in 18 on.
BOLT_MIN_VERSION=18

# bolt_version BOLT: the LLVM major version an llvm-bolt was built from.
bolt_version() { "$1" --version 2>/dev/null | sed -n 's/.*LLVM version \([0-9]*\).*/\1/p' | head -n 1; }

# find_bolt: the path of an llvm-bolt of BOLT_MIN_VERSION or later with a
# merge-fdata beside it: one on the PATH, or the newest of the
# distribution's bolt-N packages. Unlike llvm-profdata it need not match
# rustc's LLVM: it reads the linked files.
find_bolt() {
    local candidate version
    for candidate in "$(command -v llvm-bolt || true)" \
        $(compgen -G '/usr/lib/llvm-*/bin/llvm-bolt' | sort -rV); do
        [[ -n $candidate && -x $candidate && -x ${candidate%/*}/merge-fdata ]] || continue
        version=$(bolt_version "$candidate")
        is_uint "$version" && ((version >= BOLT_MIN_VERSION)) || continue
        echo "$candidate"
        return 0
    done
    return 1
}

# bolt_package: the newest bolt-N the package lists offer, when it is
# BOLT_MIN_VERSION or later (the lists are refreshed once when they offer
# none).
bolt_package() {
    local search=(apt-cache search --names-only '^bolt-[0-9]+$') found sudo=()
    ((EUID == 0)) || sudo=(sudo)
    found=$("${search[@]}" 2>/dev/null | cut -d' ' -f1 | sort -V | tail -n 1)
    if [[ -z $found ]]; then
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update >/dev/null 2>&1 || return 1
        found=$("${search[@]}" 2>/dev/null | cut -d' ' -f1 | sort -V | tail -n 1)
    fi
    [[ -n $found ]] && ((${found#bolt-} >= BOLT_MIN_VERSION)) || return 1
    echo "$found"
}

build() {
    if [[ $SKIP_BUILD == 1 ]]; then
        log "BENCH_SKIP_BUILD=1: using the existing release build"
    else
        # Only what the benchmark runs: the server, its provider plugins and
        # the floor.
        local packages=(-p socialgate -p shortvideo-primary -p shortvideo-fallback)
        [[ $FLOOR_MODE == 1 ]] && packages+=(-p bench-floor)
        log "cargo build --release ${packages[*]}"
        (cd "$ROOT" && cargo build --release "${packages[@]}") || die "release build failed"
    fi
    SG=$TARGET_DIR/release/socialgate
    PLUGIN_DIR=$TARGET_DIR/release
    FLOOR=$TARGET_DIR/release/floor-proxy
    [[ -x $SG ]] || die "$SG missing"
    [[ $FLOOR_MODE == 0 || -x $FLOOR ]] || die "$FLOOR missing"
    [[ -f $TARGET_DIR/release/libshortvideo_primary.so ]] ||
        die "$TARGET_DIR/release/libshortvideo_primary.so missing"
}

# Many sockets: 1024 wrk connections, 10,000 idle ones, and the servers'
# side of each. Children inherit the raised limit.
raise_nofile() {
    local hard want=$((IDLE_CONNS + 2048))
    hard=$(ulimit -Hn)
    if [[ $hard == unlimited ]] || ((hard >= want)); then
        ulimit -n "$want"
    else
        ulimit -n "$hard"
    fi
    log "open files limit: $(ulimit -n)"
}

# --------------------------------------------------------------- nginx
# start_nginx NAME TEMPLATE PORT [sed expressions...]; sets NGINX_PID.
start_nginx() {
    local name=$1 template=$2 port=$3
    shift 3
    local dir=$WORK/$name user_line=""
    mkdir -p "$dir/tmp"
    # As root, workers would otherwise run as nobody, who may not read target/.
    ((EUID == 0)) && user_line="user root root;"
    sed -e "s|@DIR@|$dir|g" -e "s|@PORT@|$port|g" -e "s|@USER_LINE@|$user_line|" \
        "$@" "$template" >"$dir/nginx.conf"
    "$NGINX" -q -t -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" ||
        die "$name: nginx refuses its config ($dir/nginx.conf)"
    "${NGINX_WRAP[@]}" "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" &
    NGINX_PID=$!
    PIDS+=("$NGINX_PID")
    wait_http "http://127.0.0.1:$port/" "$NGINX_PID" ||
        die "$name: nginx did not start (see $dir/error.log)"
    log "$name: nginx pid $NGINX_PID on 127.0.0.1:$port"
}

start_upstream() {
    local docroot=$WORK/upstream-root
    mkdir -p "$docroot/primary" "$WORK/nginx-upstream"
    cp "$ROOT"/fixtures/upstreams/primary/*.json "$docroot/primary/"
    COMMENT_PAGES=$(python3 "$SRC/tools.py" comment-pages \
        "$ROOT/fixtures/upstreams/primary/comment_list.json" "$docroot" \
        "$WORK/nginx-upstream/comments.map" "$POST_ID" "$COMMENTS_COUNT") ||
        die "cannot generate the comment pages"
    log "$COMMENT_PAGES"
    # wrk's comments path for the nginx rows: the first page the plugin asks for.
    local first
    first=$(head -n 1 "$WORK/nginx-upstream/comments.map")
    [[ $first =~ ^\"[0-9]+:([0-9]+):([0-9]+)\" ]] || die "unexpected comments.map: $first"
    UP_PATH[comments]="/v1/comment/list?aweme_id=$POST_ID&count=${BASH_REMATCH[1]}&cursor=${BASH_REMATCH[2]}"
    start_nginx nginx-upstream "$SRC/nginx-upstream.conf.in" "$UPSTREAM_PORT" \
        -e "s|@DOCROOT@|$docroot|g" -e "s|@POST_ID@|$POST_ID|g" \
        -e "s|@UPSTREAM_KEY@|$SHORTVIDEO_PRIMARY_KEY|g" -e "s|@TRACE_PORT@|$TRACE_PORT|g"
}

start_proxy() {
    start_nginx nginx-proxy "$SRC/nginx-proxy.conf.in" "$PROXY_PORT" \
        -e "s|@UPSTREAM_PORT@|$UPSTREAM_PORT|g"
}

# ---------------------------------------------------------- socialgate
# write_config DIR [extra [server] lines] [extra top-level tables] [upstream port]
write_config() {
    local dir=$1 extra=${2:-} tables=${3:-} port=${4:-$UPSTREAM_PORT}
    mkdir -p "$dir"
    cat >"$dir/platforms.toml" <<EOF
# Written by bench/run.sh.
[server]
listen = "127.0.0.1:0"
admin_listen = "off"
keys_file = "keys.toml"
state_dir = "state"
plugin_dir = "$PLUGIN_DIR"
shutdown_grace_ms = 2000
# The same headroom as max_in_flight below: no 503 at 1024 connections.
max_concurrent_requests = 4096
$extra
$tables

[platforms.shortvideo]
status = "live"
providers = ["shortvideo-primary"]

[providers.shortvideo-primary]
library = "shortvideo_primary"
base_url = "http://127.0.0.1:$port"
api_key_env = "SHORTVIDEO_PRIMARY_KEY"
# Above the most connections measured (the default, 64, would answer
# 503 OVERLOADED to the rest of 256 or 1024 uncached requests at once).
max_in_flight = 4096
EOF
}

issue_key() { "$SG" keys issue --name "$2" --config "$1/platforms.toml"; }

# start_socialgate NAME; sets SG_PID and SG_URL. Logs at $LOG_LEVEL to a file.
start_socialgate() {
    local dir=$WORK/$1
    # Logs in a folder of their own: the server watches its config's folder
    # for changes, and a busy log file beside the config would wake that
    # watcher on every line (a few % of the CPU under load).
    mkdir -p "$dir/logs"
    # Created here: the child's redirection may happen after our first read.
    : >"$dir/logs/stdout.log"
    SOCIALGATE_LOG=$LOG_LEVEL "${SG_WRAP[@]}" "$SG" serve --config "$dir/platforms.toml" \
        >"$dir/logs/stdout.log" 2>"$dir/logs/server.log" &
    SG_PID=$!
    PIDS+=("$SG_PID")
    SG_URL=$(listening_url "$dir/logs/stdout.log" "$SG_PID")
    [[ -n $SG_URL ]] || die "$1: socialgate did not start: $(tail -n 5 "$dir/logs/server.log")"
    log "$1: socialgate pid $SG_PID on $SG_URL (log: $dir/logs/server.log)"
}

# ---------------------------------------------------------------- checks
# check_socialgate URL ENDPOINT KEY: the answer must be a 200 of the right shape.
check_socialgate() {
    local url=$1 endpoint=$2 key=$3 body code
    body=$WORK/check-$endpoint.json
    code=$(curl -sS --max-time 10 -o "$body" -w '%{http_code}' -H "X-API-Key: $key" "$url") ||
        die "socialgate $endpoint: no answer from $url"
    [[ $code == 200 ]] ||
        die "socialgate $endpoint answered HTTP $code, not 200: $(head -c 400 "$body")"
    python3 "$SRC/tools.py" check "$endpoint" "$body" "$COMMENTS_COUNT" ||
        die "socialgate $endpoint: wrong answer"
}

# check_upstream URL LABEL: 200 with Content-Type application/json.
check_upstream() {
    local url=$1 label=$2 headers code
    headers=$WORK/check-headers.txt
    code=$(curl -sS --max-time 10 -D "$headers" -o /dev/null -w '%{http_code}' \
        -H "X-Api-Key: $SHORTVIDEO_PRIMARY_KEY" "$url") || die "$label: no answer from $url"
    [[ $code == 200 ]] || die "$label: HTTP $code from $url"
    grep -qi '^content-type: application/json' "$headers" ||
        die "$label: $url is not served as application/json"
}

# ------------------------------------------------------------------- wrk
# run_wrk SECTION TARGET ENDPOINT CONNS ROUND URL HEADER: one recorded run.
run_wrk() {
    local section=$1 target=$2 endpoint=$3 conns=$4 round=$5 url=$6 header=$7
    local out=$WORK/wrk/$section-$target-$endpoint-c$conns-r$round.txt line
    local rps p50 p99 non2xx errors trouble=""
    wrk -t1 -c"$conns" -d"${DURATION}s" --latency --timeout 10s -s "$SRC/report.lua" \
        -H "$header" "$url" >"$out" 2>&1 || die "wrk failed: $(tail -n 3 "$out")"
    line=$(python3 "$SRC/tools.py" wrk-line "$out") || die "cannot read $out"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$section" "$target" "$endpoint" "$conns" "$round" \
        "$line" >>"$WORK/results.tsv"
    # rps p50 p99 requests non2xx errors
    read -r rps p50 p99 _ non2xx errors <<<"$line"
    ((non2xx + errors == 0)) || trouble="  non-2xx $non2xx, socket errors $errors"
    printf '  %-6s %-17s %-8s c=%-5s %8.0f req/s  p50 %8s ms  p99 %8s ms%s\n' \
        "$section" "$target" "$endpoint" "$conns" "$rps" "$(us_to_ms "$p50")" \
        "$(us_to_ms "$p99")" "$trouble"
}

us_to_ms() { awk -v us="$1" 'BEGIN { printf "%.2f", us / 1000 }'; }

warm() {
    wrk -t1 -c32 -d"${WARMUP}s" -H "$2" "$1" >/dev/null 2>&1 || die "warm-up failed on $1"
}

# --------------------------------------------------------------- phases
declare -A UP_PATH SG_PATH
UP_PATH[profile]="/v1/user/profile?unique_id=$USERNAME"
UP_PATH[post]="/v1/aweme/detail?aweme_id=$POST_ID"
SG_PATH[profile]="/v1/shortvideo/profile?username=$USERNAME"
SG_PATH[post]="/v1/shortvideo/post?id=$POST_ID"
SG_PATH[comments]="/v1/shortvideo/comments?id=$POST_ID&count=$COMMENTS_COUNT"
ENDPOINTS=(profile post comments)

side_by_side() {
    local round endpoint conns
    local up_hdr="X-Api-Key: $SHORTVIDEO_PRIMARY_KEY" sg_hdr="X-API-Key: $MAIN_KEY"
    log "warm-up: ${WARMUP}s per target and endpoint"
    for endpoint in "${ENDPOINTS[@]}"; do
        warm "$UPSTREAM_URL${UP_PATH[$endpoint]}" "$up_hdr"
        warm "$PROXY_URL${UP_PATH[$endpoint]}" "$up_hdr"
        warm "$MAIN_URL${SG_PATH[$endpoint]}" "$sg_hdr"
    done
    for ((round = 1; round <= ROUNDS; round++)); do
        log "side by side, round $round/$ROUNDS"
        for endpoint in "${ENDPOINTS[@]}"; do
            for conns in $CONNS; do
                run_wrk main static "$endpoint" "$conns" "$round" \
                    "$UPSTREAM_URL${UP_PATH[$endpoint]}" "$up_hdr"
                run_wrk main proxy "$endpoint" "$conns" "$round" \
                    "$PROXY_URL${UP_PATH[$endpoint]}" "$up_hdr"
                run_wrk main socialgate "$endpoint" "$conns" "$round" \
                    "$MAIN_URL${SG_PATH[$endpoint]}" "$sg_hdr"
            done
        done
    done
}

growth() {
    local round conns
    warm "$BIG_URL${SG_PATH[profile]}" "X-API-Key: $BIG_KEY"
    for ((round = 1; round <= ROUNDS; round++)); do
        log "growth, round $round/$ROUNDS"
        for conns in $GROWTH_CONNS; do
            run_wrk growth socialgate profile "$conns" "$round" \
                "$MAIN_URL${SG_PATH[profile]}" "X-API-Key: $MAIN_KEY"
        done
        # Keys are compared at the checked connection count; the 10-key
        # figure comes from the same round, just before.
        [[ " $GROWTH_CONNS " == *" $CHECK_CONNS "* ]] ||
            run_wrk growth socialgate profile "$CHECK_CONNS" "$round" \
                "$MAIN_URL${SG_PATH[profile]}" "X-API-Key: $MAIN_KEY"
        run_wrk growth socialgate-keys profile "$CHECK_CONNS" "$round" \
            "$BIG_URL${SG_PATH[profile]}" "X-API-Key: $BIG_KEY"
    done
}

# A fresh server's RSS at idle, with IDLE_CONNS idle keep-alive connections,
# and after they are closed.
idle_memory() {
    local dir=$WORK/sg-idle key out release i opened still
    # hyper's header_read_timeout also runs while a kept-alive connection
    # waits for its next request, so with the default header_timeout_ms
    # (10 s) the server would close them while we measure: raise it here.
    write_config "$dir" "header_timeout_ms = 600000" "$CACHE_OFF"
    key=$(issue_key "$dir" bench)
    start_socialgate sg-idle
    check_socialgate "$SG_URL${SG_PATH[profile]}" profile "$key" >/dev/null
    sleep 1
    record_rss "fresh server: idle (1 request served)" "$SG_PID"
    out=$dir/idle_conns.out
    release=$dir/idle_conns.release
    log "opening $IDLE_CONNS idle keep-alive connections"
    python3 "$SRC/idle_conns.py" 127.0.0.1 "${SG_URL##*:}" "$IDLE_CONNS" "$release" \
        --max-hold 120 >"$out" 2>&1 &
    local py=$!
    PIDS+=("$py")
    for ((i = 0; i < 1800; i++)); do
        grep -q '^OPEN ' "$out" && break
        kill -0 "$py" 2>/dev/null || break
        sleep 0.1
    done
    grep -q '^OPEN ' "$out" || die "idle_conns.py did not open its connections: $(cat "$out")"
    opened=$(sed -n 's/^OPEN ok=\([0-9]*\).*/\1/p' "$out")
    log "$(grep '^OPEN ' "$out")"
    sleep 2 # let the server settle with them all open
    record_rss "fresh server: $(fmt_int "$opened") idle keep-alive connections open" "$SG_PID"
    touch "$release"
    for ((i = 0; i < 300; i++)); do
        kill -0 "$py" 2>/dev/null || break
        sleep 0.1
    done
    { wait "$py"; } 2>/dev/null || true
    forget_pid "$py"
    still=$(sed -n 's/^STILL_OPEN n=\([0-9]*\).*/\1/p' "$out")
    log "$(grep '^STILL_OPEN ' "$out" || echo "STILL_OPEN missing: $(cat "$out")")"
    sleep 2
    record_rss "fresh server: 2 s after they closed" "$SG_PID"
    IDLE_NOTE="Idle connections: $(fmt_int "$opened") of $(fmt_int "$IDLE_CONNS") opened with \`bench/idle_conns.py\` (one \`GET /healthz\` each, then idle), $(fmt_int "${still:-?}") still open when released; the server for this row runs with \`header_timeout_ms = 600000\` because with the default (10 s) it closes keep-alive connections idle for that long. Default \`max_concurrent_requests\` (1024) counts requests in flight, not connections."
    stop_pid "$SG_PID"
    forget_pid "$SG_PID"
}

# ---------------------------------------------------------------- cache
# The response cache (issue 10) is configured by a top-level [cache] table,
# on by default. A build without it refuses that table ("unknown field"), so
# the binary is asked: `socialgate check` on a config with the table.
CACHE_OFF_TABLE=$'[cache]\nenabled = false'
CACHE_OFF=""          # tables of the uncached instances: $CACHE_OFF_TABLE or ""
CACHE_BUILD=""        # supported | unsupported
CACHE_RUN=""          # run | forced | skipped | off
CACHE_ENFORCED=0      # 1: the cache scenarios' targets decide the exit status

detect_cache() {
    local dir=$WORK/cache-probe
    # The plain config first, so a failure below can only be the table.
    write_config "$dir"
    "$SG" check --config "$dir/platforms.toml" >"$dir/check.out" 2>&1 ||
        die "socialgate check refuses the plain bench config: $(tail -n 3 "$dir/check.out")"
    write_config "$dir" "" "$CACHE_OFF_TABLE"
    if "$SG" check --config "$dir/platforms.toml" >"$dir/check.out" 2>&1; then
        CACHE_BUILD=supported
        # Keeps the side-by-side, growth and memory figures those of the
        # server without its cache, as they were before it existed.
        CACHE_OFF=$CACHE_OFF_TABLE
        log "cache: this build HAS the response cache; the side-by-side, growth and idle instances run with [cache] enabled = false"
    else
        CACHE_BUILD=unsupported
        CACHE_OFF=""
        log "cache: this build has NO response cache (check refuses [cache]: $(tail -n 1 "$dir/check.out")); every instance runs without a [cache] table"
    fi
    case $CACHE_MODE/$CACHE_BUILD in
    0/*) CACHE_RUN=off ;;
    */supported) CACHE_RUN=run CACHE_ENFORCED=1 ;;
    force/unsupported) CACHE_RUN=forced ;;
    *) CACHE_RUN=skipped ;;
    esac
    case $CACHE_RUN in
    run) log "cache scenarios: run, targets enforced" ;;
    forced) log "cache scenarios: BENCH_CACHE=force on a build without the cache: run, nothing enforced" ;;
    skipped) log "cache scenarios: will be skipped: this build has no cache" ;;
    off) log "cache scenarios: will be skipped (BENCH_CACHE=0)" ;;
    esac
}

# A miss that should have been a hit: fatal when the build has the cache,
# only noted when forced on one without it.
cache_check_failed() {
    if ((CACHE_ENFORCED)); then
        die "$1"
    fi
    log "note: $1 (expected: this build has no cache)"
}

# check_nginx_hit URL: nginx's second answer for URL must come from its cache.
check_nginx_hit() {
    local url=$1 headers=$WORK/check-pcache-headers.txt code
    code=$(curl -sS --max-time 10 -D "$headers" -o /dev/null -w '%{http_code}' \
        -H "X-Api-Key: $SHORTVIDEO_PRIMARY_KEY" "$url") || die "proxy_cache: no answer from $url"
    [[ $code == 200 ]] || die "proxy_cache: HTTP $code from $url"
    grep -qi '^x-cache-status: HIT' "$headers" ||
        die "proxy_cache: not a cache hit: $(grep -i '^x-cache-status' "$headers" || echo 'no X-Cache-Status')"
    log "proxy_cache: 200, X-Cache-Status: HIT"
}

# check_socialgate_hit URL KEY: socialgate's answer must be a 200 from its
# cache: `Cache-Status` with the `hit` parameter and `"cached": true` in meta.
check_socialgate_hit() {
    local url=$1 key=$2 headers=$WORK/check-cached-headers.txt body=$WORK/check-cached.json
    local code verdict
    code=$(curl -sS --max-time 10 -D "$headers" -o "$body" -w '%{http_code}' \
        -H "X-API-Key: $key" "$url") || die "socialgate cached: no answer from $url"
    [[ $code == 200 ]] || die "socialgate cached: HTTP $code: $(head -c 400 "$body")"
    python3 "$SRC/tools.py" check profile "$body" >/dev/null || die "socialgate cached: wrong answer"
    if verdict=$(python3 "$SRC/tools.py" check-hit "$headers" "$body"); then
        log "socialgate cached: $verdict"
    else
        cache_check_failed "socialgate cached: not a hit: $verdict"
    fi
}

# Scenario 1: `profile` answered from socialgate's cache, from nginx's
# proxy_cache, and by nginx from the static file, interleaved each round at
# the checked connection count.
cache_vs_proxy_cache() {
    local up_hdr="X-Api-Key: $SHORTVIDEO_PRIMARY_KEY" key url round pcache_pid sg_pid
    local pcache_url=http://127.0.0.1:$PCACHE_PORT
    start_nginx nginx-proxy-cache "$SRC/nginx-proxy-cache.conf.in" "$PCACHE_PORT" \
        -e "s|@UPSTREAM_PORT@|$UPSTREAM_PORT|g"
    pcache_pid=$NGINX_PID
    # The first request fills nginx's cache, the second must be a hit.
    check_upstream "$pcache_url${UP_PATH[profile]}" "proxy_cache profile"
    check_nginx_hit "$pcache_url${UP_PATH[profile]}"

    # socialgate with the cache at its defaults: no [cache] table at all.
    write_config "$WORK/sg-cache"
    key=$(issue_key "$WORK/sg-cache" bench)
    start_socialgate sg-cache
    sg_pid=$SG_PID
    url=$SG_URL${SG_PATH[profile]}
    check_socialgate "$url" profile "$key" >/dev/null # fills the cache
    check_socialgate_hit "$url" "$key"

    log "cache: warm-up ${WARMUP}s per target"
    warm "$UPSTREAM_URL${UP_PATH[profile]}" "$up_hdr"
    warm "$pcache_url${UP_PATH[profile]}" "$up_hdr"
    warm "$url" "X-API-Key: $key"
    for ((round = 1; round <= ROUNDS; round++)); do
        log "cache: cached profile, round $round/$ROUNDS"
        run_wrk cache static profile "$CHECK_CONNS" "$round" "$UPSTREAM_URL${UP_PATH[profile]}" "$up_hdr"
        run_wrk cache proxy-cache profile "$CHECK_CONNS" "$round" "$pcache_url${UP_PATH[profile]}" "$up_hdr"
        run_wrk cache socialgate-cached profile "$CHECK_CONNS" "$round" "$url" "X-API-Key: $key"
    done
    # What nginx answered profile from, by its access log (one fill, then hits).
    PCACHE_STATUSES=$(awk 'index($0, "\"GET /v1/user/profile?") {n[$NF]++}
        END {for (s in n) printf "%s %d, ", s, n[s]}' \
        "$WORK/nginx-proxy-cache/access.log" | sed 's/, $//')
    log "proxy_cache access log by cache status: $PCACHE_STATUSES"
    stop_pid "$sg_pid"
    forget_pid "$sg_pid"
    stop_pid "$pcache_pid"
    forget_pid "$pcache_pid"
}

# Profile requests the upstream logged on its trace port (one line each).
trace_upstream_count() {
    local f=$WORK/nginx-upstream/trace.log
    [[ -f $f ]] || {
        echo 0
        return
    }
    awk 'index($1, "/v1/user/profile?") == 1 {n++} END {print n + 0}' "$f"
}

# Scenario 2: a seeded Zipf trace of `profile` requests replayed once
# through a fresh instance (cache at its defaults) by bench/replay.py; the
# upstream's access log says how many requests reached it.
zipf_replay() {
    local dir=$WORK/sg-trace key before after prev i sg_pid
    mkdir -p "$WORK/trace"
    TRACE_LINE=$(python3 "$SRC/tools.py" zipf-trace "$WORK/trace/trace.txt" "$TRACE_REQUESTS" \
        "$TRACE_USERS" "$TRACE_S" "$TRACE_SEED") || die "cannot write the trace"
    log "$TRACE_LINE"
    # socialgate -> the upstream's trace port, which logs every request.
    write_config "$dir" "" "" "$TRACE_PORT"
    key=$(issue_key "$dir" bench)
    start_socialgate sg-trace
    sg_pid=$SG_PID
    before=$(trace_upstream_count)
    log "replay: $(fmt_int "$TRACE_REQUESTS") requests, $TRACE_CONNS connections, once through"
    python3 "$SRC/replay.py" 127.0.0.1 "${SG_URL##*:}" "$key" "$WORK/trace/trace.txt" \
        "$WORK/trace/replay.json" --conns "$TRACE_CONNS" --max-seconds 600 \
        >"$WORK/trace/replay.out" 2>&1 || die "replay.py failed: $(tail -n 5 "$WORK/trace/replay.out")"
    log "$(grep '^REPLAY ' "$WORK/trace/replay.out")"
    # nginx logs a request once it has answered it; wait (bounded) until the
    # count stops moving.
    prev=-1
    for ((i = 0; i < 20; i++)); do
        after=$(trace_upstream_count)
        ((after == prev)) && break
        prev=$after
        sleep 0.1
    done
    TRACE_UPSTREAM=$((after - before))
    log "replay: the upstream received $(fmt_int "$TRACE_UPSTREAM") profile requests"
    stop_pid "$sg_pid"
    forget_pid "$sg_pid"
}

cache_scenarios() {
    case $CACHE_RUN in
    run | forced)
        cache_vs_proxy_cache
        zipf_replay
        ;;
    skipped) log "cache scenarios: skipped: this build has no cache" ;;
    off) log "cache scenarios: skipped (BENCH_CACHE=0)" ;;
    esac
}

# ----------------------------------------------------------- shared state
# The same instance on "local" and on "redis", on the same upstream with
# the same state work per request (a rate limit that never refuses, billing
# enforced with credits that never run out, cache off as in the
# side-by-side). Each redis instance has a redis-server of its own, AOF on,
# one per appendfsync mode in BENCH_REDIS_FSYNC (the first is the one the
# targets judge). A request of a redis instance costs a reservation (the
# bucket and the credit together, in one script shared with the
# reservations asked at the same moment) and a share of the settling batch.
start_redis() {
    local mode=$1 dir=$WORK/redis-$1 port i
    mkdir -p "$dir"
    port=$(python3 "$SRC/tools.py" free-ports 1)
    redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --appendonly yes \
        --appendfsync "$mode" --save "" --daemonize no >"$dir/redis.log" 2>&1 &
    REDIS_PID=$!
    PIDS+=("$REDIS_PID")
    for ((i = 0; i < 100; i++)); do
        [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] && break
        sleep 0.1
    done
    [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] ||
        die "redis-server did not start: $(tail -n 3 "$dir/redis.log")"
    REDIS_URL=redis://127.0.0.1:$port/0
    log "shared state: redis-server pid $REDIS_PID on 127.0.0.1:$port, appendfsync $mode"
}

shared_state() {
    if [[ $REDIS_MODE != 1 ]]; then
        log "shared state: skipped (BENCH_REDIS=0)"
        return
    fi
    local tables round conns mode name pid i
    local -A url key
    local -a names pids
    tables=$STATE_WORK_TABLES$CACHE_OFF
    write_config "$WORK/sg-state-local" 'cursor_key_env = "BENCH_CURSOR_KEY"' "$tables"
    key[local]=$(issue_key "$WORK/sg-state-local" bench)
    start_socialgate sg-state-local
    url[local]=$SG_URL${SG_PATH[profile]}
    names=(local)
    pids=("$SG_PID")
    for mode in $REDIS_FSYNC; do
        start_redis "$mode"
        pids+=("$REDIS_PID")
        name=redis-$mode
        export "SOCIALGATE_REDIS_URL_${mode^^}=$REDIS_URL"
        write_config "$WORK/sg-state-$name" 'cursor_key_env = "BENCH_CURSOR_KEY"' \
            "$tables"$'\n\n[state]\nbackend = "redis"\nurl_env = "SOCIALGATE_REDIS_URL_'"${mode^^}"'"'
        key[$name]=$(issue_key "$WORK/sg-state-$name" bench)
        start_socialgate "sg-state-$name"
        url[$name]=$SG_URL${SG_PATH[profile]}
        names+=("$name")
        pids+=("$SG_PID")
    done
    for name in "${names[@]}"; do
        check_socialgate "${url[$name]}" profile "${key[$name]}" >/dev/null
    done
    log "shared state: warm-up ${WARMUP}s per instance"
    for name in "${names[@]}"; do
        warm "${url[$name]}" "X-API-Key: ${key[$name]}"
    done
    for ((round = 1; round <= ROUNDS; round++)); do
        log "shared state, round $round/$ROUNDS"
        for conns in 1 "$CHECK_CONNS"; do
            for name in "${names[@]}"; do
                run_wrk state "$name" profile "$conns" "$round" "${url[$name]}" "X-API-Key: ${key[$name]}"
            done
        done
    done
    REDIS_VERSION=$(redis-server --version | sed -n 's/.* v=\([0-9.]*\).*/\1/p')
    # Latest first, as they were started.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        pid=${pids[$i]}
        stop_pid "$pid"
        forget_pid "$pid"
    done
}

write_meta() {
    local commit cpu
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    [[ -z $(git -C "$ROOT" status --porcelain 2>/dev/null) ]] || commit="$commit (with local changes)"
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    local sizes
    sizes=$(sed -n 's/^"[0-9]*:\([0-9]*\):[0-9]*".*/\1/p' "$WORK/nginx-upstream/comments.map")
    {
        printf 'date\t%s\n' "$(date -u +%Y-%m-%d)"
        printf 'machine\t%s cores (%s), %s GiB RAM, Linux %s, %s, %s\n' "$(nproc)" "${cpu:-cpu?}" \
            "$(awk '/^MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)" "$(uname -r)" \
            "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')" "$(wrk -v 2>&1 | head -n 1 | cut -d' ' -f1-2)"
        printf 'load\t%s\n' "$LOAD_AT_START"
        printf 'seconds\t%s\nrounds\t%s\n' "$DURATION" "$ROUNDS"
        printf 'commit\t%s\nlog\tSOCIALGATE_LOG=%s\n' "$commit" "$LOG_LEVEL"
        printf 'target_ratio\t%s\np99_factor\t%s\ncheck_conns\t%s\n' "$TARGET_RATIO" "$P99_FACTOR" "$CHECK_CONNS"
        printf 'keys_small\t%s\nkeys_large\t%s\n' "$KEYS_SMALL" "$KEYS_LARGE"
        printf 'comments_count\t%s\n' "$COMMENTS_COUNT"
        printf 'comments_upstream\t%s\n' "/v1/comment/list?aweme_id=…&count=$(head -n 1 <<<"$sizes")&cursor=0"
        printf 'comments_pages\t%s\n' "$(wc -l <<<"$sizes")"
        printf 'comments_sizes\t%s\n' "$(paste -sd+ <<<"$sizes" | sed 's/+/ + /g')"
        printf 'idle_note\t%s\n' "${IDLE_NOTE:-}"
        printf 'cache_build\t%s\ncache_run\t%s\ncache_enforced\t%s\n' \
            "$CACHE_BUILD" "$CACHE_RUN" "$CACHE_ENFORCED"
        printf 'cache_proxy_ratio\t%s\ncache_static_ratio\t%s\n' \
            "$CACHE_PROXY_RATIO" "$CACHE_STATIC_RATIO"
        printf 'pcache_statuses\t%s\n' "${PCACHE_STATUSES:-}"
        printf 'trace\t%s\ntrace_conns\t%s\ntrace_upstream\t%s\n' \
            "${TRACE_LINE:-}" "$TRACE_CONNS" "${TRACE_UPSTREAM:-}"
        printf 'redis_mode\t%s\nredis_ratio\t%s\nredis_p50_ms\t%s\nredis_fsync\t%s\nredis_version\t%s\n' \
            "$REDIS_MODE" "$REDIS_RATIO" "$REDIS_P50_MS" "$REDIS_FSYNC" "${REDIS_VERSION:-}"
        printf 'pgo\t%s\npgo_train_seconds\t%s\nbolt\t%s\nbolt_version\t%s\n' \
            "$PGO_MODE" "$PGO_TRAIN_SECONDS" "$BOLT_MODE" "${BOLT_VERSION:-}"
        printf 'floor_mode\t%s\nfloor_cores\t%s\nclock_ticks\t%s\n' \
            "$FLOOR_MODE" "${FLOOR_CORES:-}" "$(getconf CLK_TCK)"
        printf 'instr_mode\t%s\ninstr_seconds\t%s\ninstr_valgrind\t%s\n' \
            "$INSTR_MODE" "$INSTR_SECONDS" "${INSTR_VALGRIND:-}"
        printf 'replay_json\t%s\n' "$([[ -f $WORK/trace/replay.json ]] && echo "$WORK/trace/replay.json")"
    } >"$WORK/meta.tsv"
}

# ------------------------------------------------------------------ PGO
# The build measured when BENCH_PGO=1: socialgate and its plugins built with
# rustc's profile-guided optimization. An instrumented build (in
# target/pgo-train) serves a training mix against the upstream double,
# writing how often each branch and call ran; llvm-profdata merges that into
# a profile, and the release build in target/pgo is laid out and inlined by
# it. The mix is every kind of request the double can answer, not only the
# one measured, in each configuration a deployment runs (pgo_train). The
# plain release build stays in target/release, measured beside it in the
# floor's table.

pgo_build() {
    [[ $PGO_MODE == 1 ]] || return 0
    local triple
    triple=$(host_triple)
    if [[ $SKIP_BUILD == 1 && -x $TARGET_DIR/pgo/$triple/release/socialgate ]]; then
        log "BENCH_SKIP_BUILD=1: using the existing PGO build"
    else
        local raw=$WORK/pgo/raw plain_sg=$SG plain_plugins=$PLUGIN_DIR
        rm -rf "$raw"
        pgo_cargo pgo-train "-Cprofile-generate=$raw"
        SG=$TARGET_DIR/pgo-train/$triple/release/socialgate
        PLUGIN_DIR=$TARGET_DIR/pgo-train/$triple/release
        pgo_train PGO
        SG=$plain_sg PLUGIN_DIR=$plain_plugins
        compgen -G "$raw/*.profraw" >/dev/null || die "PGO: the training wrote no profile"
        "$PROFDATA" merge -o "$WORK/pgo/merged.profdata" "$raw"/*.profraw ||
            die "PGO: llvm-profdata merge failed"
        # Named by its content: cargo rebuilds when RUSTFLAGS change, and
        # would not notice a new profile under the same name.
        local profile
        profile=$WORK/pgo/$(sha256sum "$WORK/pgo/merged.profdata" | cut -c1-16).profdata
        mv "$WORK/pgo/merged.profdata" "$profile"
        # BOLT rewrites a file only with the relocations the linker resolved
        # kept in it: they are how it finds every reference to code it moves.
        local relocations=""
        [[ $BOLT_MODE == 1 ]] && relocations=" -Clink-arg=-Wl,--emit-relocs"
        pgo_cargo pgo "-Cprofile-use=$profile$relocations"
    fi
    PLAIN_SG=$SG PLAIN_PLUGIN_DIR=$PLUGIN_DIR
    SG=$TARGET_DIR/pgo/$triple/release/socialgate
    PLUGIN_DIR=$TARGET_DIR/pgo/$triple/release
    [[ -x $SG && -f $PLUGIN_DIR/libshortvideo_primary.so ]] || die "PGO: $SG or its plugin missing"
}

host_triple() { rustc -vV | sed -n 's/^host: //p'; }

# pgo_cargo DIR FLAG: the server and its plugins, release, built with FLAG
# into target/DIR. For the host triple named, so that RUSTFLAGS reach the
# crates built, not the build scripts and macros that build them.
pgo_cargo() {
    log "PGO: cargo build --release ($2) into $TARGET_DIR/$1"
    (cd "$ROOT" && RUSTFLAGS="${RUSTFLAGS:-} $2" cargo build --release --target "$(host_triple)" \
        --target-dir "$TARGET_DIR/$1" -p socialgate -p shortvideo-primary -p shortvideo-fallback) ||
        die "PGO: build into target/$1 failed"
}

# pgo_train LABEL: the training mix through the instrumented build, on each
# of the configurations a deployment runs: cache off (what is measured),
# with rate limits and enforced billing on local state, with the cache on,
# and with that state on Redis when redis-server is installed. Each server
# writes its counts when it exits. LABEL (PGO or BOLT) names it in the log.
pgo_train() {
    local label=$1 name tables key path redis=0
    local -a names=(plain limits)
    [[ $CACHE_BUILD == supported ]] && names+=(cached)
    command -v redis-server >/dev/null && names+=(redis)
    for name in "${names[@]}"; do
        case $name in
        plain) tables=$CACHE_OFF ;;
        limits) tables=$STATE_WORK_TABLES$CACHE_OFF ;;
        cached) tables="" ;;
        redis)
            start_redis everysec
            redis=$REDIS_PID
            export SOCIALGATE_REDIS_URL_TRAIN=$REDIS_URL
            tables=$STATE_WORK_TABLES$CACHE_OFF$'\n\n[state]\nbackend = "redis"\nurl_env = "SOCIALGATE_REDIS_URL_TRAIN"'
            ;;
        esac
        # A folder per training (pgo-plain, bolt-plain...): each issues its
        # own key.
        name=${label,,}-$name
        write_config "$WORK/$name" 'cursor_key_env = "BENCH_CURSOR_KEY"' "$tables"
        key=$(issue_key "$WORK/$name" train) || die "$label: keys issue failed for $name"
        start_socialgate "$name"
        log "$label: training $name (${PGO_TRAIN_SECONDS}s a request kind)"
        for path in "${SG_PATH[@]}" "/v1/shortvideo/posts?username=$USERNAME" \
            "/v1/shortvideo/profile" "/v1/shortvideo/nothing?username=$USERNAME"; do
            wrk -t1 -c16 -d"${PGO_TRAIN_SECONDS}s" -H "X-API-Key: $key" "$SG_URL$path" >/dev/null
        done
        wrk -t1 -c16 -d"${PGO_TRAIN_SECONDS}s" "$SG_URL${SG_PATH[profile]}" >/dev/null
        stop_pid "$SG_PID"
        forget_pid "$SG_PID"
    done
    TRAINED=${#names[@]}
    if ((redis)); then
        stop_pid "$redis"
        forget_pid "$redis"
        # The shared-state scenario starts its own, on a fresh folder.
        rm -rf "$WORK/redis-everysec"
    fi
}

# ------------------------------------------------------------------ BOLT
# Unless BENCH_BOLT=0, the PGO build measured is laid out again by BOLT,
# LLVM's post-link optimizer, as rustc's own releases are. A request runs
# once through much code (hyper, tokio, serde, the host, the plugin), so it
# runs cold: where that code sits decides how much of it the caches and the
# TLB hold. BOLT instruments copies of the linked server and plugins, the
# same training runs through them (pgo_train), and each file is rewritten
# with its hot blocks together, its functions ordered by calls and its cold
# code split off. Into target/pgo-bolt; the PGO build as linked stays in
# target/pgo, measured beside it in the floor's table.

# What BOLT does with the profile: the set LLVM's documentation recommends.
BOLT_FLAGS=(-reorder-blocks=ext-tsp -reorder-functions=cdsort -split-functions
    -split-all-cold -split-eh -icf=1 -use-gnu-stack)
# The files rewritten: the server and the plugin the training calls.
BOLT_FILES=(socialgate libshortvideo_primary.so)
# Copied as the PGO build made them: the training never calls the fallback
# plugin (the benchmark's chain names the primary alone).
BOLT_COPIED=(libshortvideo_fallback.so)
# Functions left uninstrumented: those named by 1,000 characters or more (a
# regex; bounds go to 255). The instrumented file writes a function's name
# into a fixed buffer and aborts past it, and a few generic drop glues of
# the Redis client's parser are named by over 5,000. They are never hot.
BOLT_SKIP='-skip-funcs=.{250}.{250}.{250}.{250}.*'

bolt_build() {
    [[ $BOLT_MODE == 1 ]] || return 0
    local out=$TARGET_DIR/pgo-bolt profiles=$WORK/bolt file name inputs
    local instrumented=$out/instrumented
    # What a BOLT build was made from: the PGO files, BOLT's version and
    # flags. Written last, so a build cut short is never reused.
    inputs=$(cd "$PLUGIN_DIR" && sha256sum "${BOLT_FILES[@]}" "${BOLT_COPIED[@]}" &&
        echo "LLVM $BOLT_VERSION ${BOLT_FLAGS[*]} $BOLT_SKIP")
    if [[ $SKIP_BUILD == 1 && -x $out/socialgate && -f $out/inputs &&
        $(<"$out/inputs") == "$inputs" ]]; then
        log "BENCH_SKIP_BUILD=1: using the existing BOLT build (of this PGO build)"
    else
        if [[ $SKIP_BUILD == 1 ]]; then log "BOLT: no BOLT build of this PGO build to reuse; making one"; fi
        rm -rf "$out" "$profiles"
        mkdir -p "$instrumented" "$profiles"
        for file in "${BOLT_FILES[@]}"; do
            name=${file%.so}
            # One profile file per process (append-pid): each training
            # server, and each `keys issue`, writes its own at exit.
            "$BOLT" "$PLUGIN_DIR/$file" -instrument -o "$instrumented/$file" "$BOLT_SKIP" \
                "--instrumentation-file=$profiles/$name.fdata" --instrumentation-file-append-pid \
                >"$profiles/$name.instrument.log" 2>&1 ||
                die "BOLT: instrumenting $file failed (a PGO build without relocations? rebuild without BENCH_SKIP_BUILD): $(tail -n 2 "$profiles/$name.instrument.log")"
        done
        local pgo_sg=$SG pgo_plugins=$PLUGIN_DIR
        SG=$instrumented/socialgate PLUGIN_DIR=$instrumented
        pgo_train BOLT
        SG=$pgo_sg PLUGIN_DIR=$pgo_plugins
        # Only the serving processes load the primary plugin: one profile
        # each, or a server died or was killed before writing its counts.
        local written
        written=$(compgen -G "$profiles/libshortvideo_primary.fdata.*" | wc -l)
        ((written == TRAINED)) ||
            die "BOLT: $written of the $TRAINED training servers wrote their counts (see $WORK/bolt-*/logs)"
        for file in "${BOLT_COPIED[@]}"; do cp "$PLUGIN_DIR/$file" "$out/$file"; done
        for file in "${BOLT_FILES[@]}"; do
            name=${file%.so}
            "${BOLT%/*}/merge-fdata" "$profiles/$name.fdata".* >"$profiles/$name.fdata" \
                2>"$profiles/$name.merge.log" || die "BOLT: merge-fdata of $file failed"
            "$BOLT" "$PLUGIN_DIR/$file" -o "$out/$file" "-data=$profiles/$name.fdata" \
                "${BOLT_FLAGS[@]}" >"$profiles/$name.optimize.log" 2>&1 ||
                die "BOLT: optimizing $file failed: $(tail -n 2 "$profiles/$name.optimize.log")"
            log "BOLT: $file: $(grep -m1 'have non-empty execution profile' "$profiles/$name.optimize.log" | sed 's/^BOLT-INFO: //')"
        done
        rm -rf "$instrumented"
        printf '%s\n' "$inputs" >"$out/inputs"
    fi
    PGO_SG=$SG PGO_PLUGIN_DIR=$PLUGIN_DIR
    SG=$out/socialgate
    PLUGIN_DIR=$out
    [[ -x $SG && -f $PLUGIN_DIR/libshortvideo_primary.so ]] || die "BOLT: $SG or its plugin missing"
}

# ---------------------------------------------------------------- floor
# What the stack costs without socialgate's work, for information (no
# target): `profile` at CHECK_CONNS connections, interleaved within each
# round, with the CPU each server used per request:
#   proxy          the nginx proxy of the side by side
#   floor-Kw       bench/floor: socialgate's serving threads, HTTP server
#                  and upstream client forwarding, none of its work; on 1
#                  thread, one per core (N), and N + 1 (socialgate's count)
#   socialgate     the main instance (N + 1 serving threads: one per core,
#                  each pinned to its core, and one standing by for when
#                  another is held by a plugin call)
#   socialgate-plain  the same, built without PGO (when BENCH_PGO=1)
#   socialgate-pgo    the same, the PGO build without BOLT (when BENCH_BOLT=1)
#   socialgate-1w  socialgate on one serving thread
#                  (SOCIALGATE_SERVING_THREADS=1): none standing by, so a
#                  stuck plugin would stall it until the watchdog gives the
#                  thread up; measured, never a setting to serve with.
#   socialgate-unbatched  the main build with each socket write its own
#                  system call (SOCIALGATE_BATCH_WRITES=0), where socialgate
#                  sends a serving thread's writes a turn at a time
# Beside each, the upstream's CPU and wake-ups per request: on one machine the
# upstream double shares the cores with the server in front of it, and what
# it costs depends on how that server hands it work.

# cpu_ticks PID: the user and system clock ticks the process has used.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# wakeups PID: how often the process has slept and been woken since it
# started (its voluntary context switches).
wakeups() { awk '/^voluntary_ctxt_switches/ { print $2 }' "/proc/$1/status"; }

# worker_of NGINX_PID: the one worker process, which does the work (the
# master only waits).
worker_of() {
    local children
    children=$(cat "/proc/$1/task/$1/children" 2>/dev/null || true)
    children=${children%% *}
    [[ -n $children ]] || die "no worker process under nginx $1"
    echo "$children"
}

# start_floor THREADS; sets FLOOR_PID and FLOOR_URL.
start_floor() {
    local out=$WORK/floor-$1w.out
    : >"$out"
    "$FLOOR" "$UPSTREAM_URL" "$1" >"$out" 2>&1 &
    FLOOR_PID=$!
    PIDS+=("$FLOOR_PID")
    FLOOR_URL=$(listening_url "$out" "$FLOOR_PID")
    [[ -n $FLOOR_URL ]] || die "floor-proxy ($1 threads) did not start: $(tail -n 3 "$out")"
    log "floor-$1w: floor-proxy pid $FLOOR_PID on $FLOOR_URL"
}

# floor_build TARGET SERVER PLUGIN_DIR: one more row of floor()'s, for a
# build other than the one measured (the plain release build, the PGO build
# without BOLT), configured as the main instance. It adds to the caller's
# targets, url, pid and header.
floor_build() {
    local target=$1 measured_sg=$SG measured_plugins=$PLUGIN_DIR key
    SG=$2 PLUGIN_DIR=$3
    write_config "$WORK/sg-$target" "" "$CACHE_OFF"
    key=$(issue_key "$WORK/sg-$target" bench)
    start_socialgate "sg-$target"
    SG=$measured_sg PLUGIN_DIR=$measured_plugins
    targets+=("$target")
    url[$target]=$SG_URL${SG_PATH[profile]} pid[$target]=$SG_PID
    header[$target]="X-API-Key: $key"
    check_socialgate "${url[$target]}" profile "$key"
}

# floor_variant TARGET NAME SETTING: one more row of floor()'s, the main
# build configured as the main instance and started with the environment
# SETTING. It adds to the caller's targets, url, pid and header.
floor_variant() {
    local target=$1 name=$2 key
    write_config "$WORK/$name" "" "$CACHE_OFF"
    key=$(issue_key "$WORK/$name" bench)
    SG_WRAP=(env "$3")
    start_socialgate "$name"
    SG_WRAP=()
    targets+=("$target")
    url[$target]=$SG_URL${SG_PATH[profile]} pid[$target]=$SG_PID
    header[$target]="X-API-Key: $key"
    check_socialgate "${url[$target]}" profile "$key"
}

floor() {
    [[ $FLOOR_MODE == 1 ]] || return 0
    local cores round target before after threads upstream
    local up_before up_after woke_before woke_after
    cores=$(nproc)
    local up_hdr="X-Api-Key: $SHORTVIDEO_PRIMARY_KEY"
    local targets=(proxy) floors=(1)
    ((cores > 1)) && floors+=("$cores")
    floors+=($((cores + 1)))
    declare -A url pid header
    url[proxy]=$PROXY_URL${UP_PATH[profile]} header[proxy]=$up_hdr
    pid[proxy]=$(worker_of "$PROXY_PID")
    upstream=$(worker_of "$UPSTREAM_PID")
    for threads in "${floors[@]}"; do
        start_floor "$threads"
        target=floor-${threads}w
        targets+=("$target")
        url[$target]=$FLOOR_URL${UP_PATH[profile]} pid[$target]=$FLOOR_PID header[$target]=$up_hdr
        check_upstream "${url[$target]}" "$target profile"
    done
    targets+=(socialgate)
    url[socialgate]=$MAIN_URL${SG_PATH[profile]} pid[socialgate]=$MAIN_PID
    header[socialgate]="X-API-Key: $MAIN_KEY"
    floor_variant socialgate-1w sg-one-thread SOCIALGATE_SERVING_THREADS=1
    floor_variant socialgate-unbatched sg-unbatched SOCIALGATE_BATCH_WRITES=0
    if [[ $PGO_MODE == 1 ]]; then
        floor_build socialgate-plain "$PLAIN_SG" "$PLAIN_PLUGIN_DIR"
    fi
    if [[ $BOLT_MODE == 1 ]]; then
        floor_build socialgate-pgo "$PGO_SG" "$PGO_PLUGIN_DIR"
    fi
    for target in "${targets[@]}"; do warm "${url[$target]}" "${header[$target]}"; done
    for ((round = 1; round <= ROUNDS; round++)); do
        log "floor, round $round/$ROUNDS"
        for target in "${targets[@]}"; do
            before=$(cpu_ticks "${pid[$target]}")
            up_before=$(cpu_ticks "$upstream") woke_before=$(wakeups "$upstream")
            run_wrk floor "$target" profile "$CHECK_CONNS" "$round" "${url[$target]}" \
                "${header[$target]}"
            after=$(cpu_ticks "${pid[$target]}")
            up_after=$(cpu_ticks "$upstream") woke_after=$(wakeups "$upstream")
            printf '%s\t%s\t%s\t%s\t%s\n' "$target" "$round" "$((after - before))" \
                "$((up_after - up_before))" "$((woke_after - woke_before))" >>"$WORK/cpu.tsv"
        done
    done
    for target in "${targets[@]}"; do
        # The proxy and the main instance serve on; the rest were the floor's.
        [[ $target == proxy || $target == socialgate ]] && continue
        stop_pid "${pid[$target]}"
        forget_pid "${pid[$target]}"
    done
    FLOOR_CORES=$cores
}

# ------------------------------------------------------------ instructions
# User-space instructions per uncached `profile` request, socialgate's and
# the nginx proxy's, each counted by callgrind in a server of its own run
# under valgrind (nginx with `master_process off`, so that one process does
# all its work), each while answering `wrk -t1 -c4`. Rates move with the
# machine's load from run to run; this count does not, so it shows a change
# to the request path that their noise would hide. Not a target.

# callgrind_command NAME FLAG PID: `callgrind_control FLAG PID`, which exits
# 0 even when it found no such run: its output says whether it did.
callgrind_command() {
    local out
    out=$(callgrind_control "$2" "$3" 2>&1) || true
    [[ $out != *Error* && $out != *"No active callgrind runs"* ]] ||
        die "$1: callgrind_control $2 failed: $out"
}

# count_instructions NAME PID URL HEADER: one row of instructions.tsv.
count_instructions() {
    local name=$1 pid=$2 url=$3 hdr=$4 requests dump total
    wrk -t1 -c4 -d2s -H "$hdr" "$url" >/dev/null
    callgrind_command "$name" -z "$pid"
    requests=$(wrk -t1 -c4 -d"${INSTR_SECONDS}s" -H "$hdr" "$url" |
        awk '/requests in/ {print $1}') || true
    callgrind_command "$name" -d "$pid"
    # The first dump asked for; the one at exit is callgrind.out itself.
    dump=$WORK/callgrind-$name/callgrind.out.1
    [[ -f $dump ]] || die "$name: callgrind wrote no dump ($dump)"
    total=$(callgrind_annotate "$dump" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}') ||
        true
    is_uint "$requests" && is_uint "$total" && ((requests > 0)) ||
        die "$name: no count (requests '$requests', instructions '$total')"
    printf '%s\t%s\t%s\n' "$name" "$requests" "$total" >>"$WORK/instructions.tsv"
    log "instructions: $name: $requests requests, $((total / requests)) instructions each"
}

instructions() {
    if [[ $INSTR_MODE != 1 ]]; then
        log "instructions: skipped (BENCH_INSTRUCTIONS=0)"
        return
    fi
    local port key up_hdr="X-Api-Key: $SHORTVIDEO_PRIMARY_KEY"
    mkdir -p "$WORK/callgrind-socialgate" "$WORK/callgrind-proxy"
    write_config "$WORK/sg-counted" "" "$CACHE_OFF"
    key=$(issue_key "$WORK/sg-counted" bench)
    SG_WRAP=(valgrind --tool=callgrind "--log-file=$WORK/callgrind-socialgate/valgrind.log"
        "--callgrind-out-file=$WORK/callgrind-socialgate/callgrind.out")
    start_socialgate sg-counted
    SG_WRAP=()
    check_socialgate "$SG_URL${SG_PATH[profile]}" profile "$key" >/dev/null
    count_instructions socialgate "$SG_PID" "$SG_URL${SG_PATH[profile]}" "X-API-Key: $key"
    stop_pid "$SG_PID"
    forget_pid "$SG_PID"

    port=$(python3 "$SRC/tools.py" free-ports 1)
    NGINX_WRAP=(valgrind --tool=callgrind "--log-file=$WORK/callgrind-proxy/valgrind.log"
        "--callgrind-out-file=$WORK/callgrind-proxy/callgrind.out")
    start_nginx nginx-proxy-counted "$SRC/nginx-proxy.conf.in" "$port" \
        -e "s|@UPSTREAM_PORT@|$UPSTREAM_PORT|g" -e 's|^daemon off;|daemon off;\nmaster_process off;|'
    NGINX_WRAP=()
    check_upstream "http://127.0.0.1:$port${UP_PATH[profile]}" "counted proxy profile"
    count_instructions proxy "$NGINX_PID" "http://127.0.0.1:$port${UP_PATH[profile]}" "$up_hdr"
    stop_pid "$NGINX_PID"
    forget_pid "$NGINX_PID"
    INSTR_VALGRIND=$(valgrind --version)
}

main() {
    validate_knobs
    ensure_tools
    build
    rm -rf "$WORK"
    mkdir -p "$WORK/wrk"
    : >"$WORK/results.tsv"
    : >"$WORK/memory.tsv"
    : >"$WORK/cpu.tsv"
    raise_nofile
    LOAD_AT_START=$(cut -d' ' -f1-3 /proc/loadavg)
    log "load average before starting: $LOAD_AT_START"
    log "working files: $WORK; socialgate logging: SOCIALGATE_LOG=$LOG_LEVEL to server.log files"

    # TRACE_PORT: the upstream's second, logged port; PCACHE_PORT: nginx proxy_cache.
    read -r UPSTREAM_PORT PROXY_PORT TRACE_PORT PCACHE_PORT <<<"$(python3 "$SRC/tools.py" free-ports 4)"
    UPSTREAM_URL=http://127.0.0.1:$UPSTREAM_PORT
    PROXY_URL=http://127.0.0.1:$PROXY_PORT
    start_upstream
    UPSTREAM_PID=$NGINX_PID
    start_proxy
    PROXY_PID=$NGINX_PID
    detect_cache
    pgo_build
    bolt_build
    if [[ $BUILD_ONLY == 1 ]]; then
        log "BENCH_BUILD_ONLY=1: built $SG, and its plugins in $PLUGIN_DIR"
        exit 0
    fi

    # The main instance: 10 keys issued by the CLI, the first one used.
    write_config "$WORK/sg-main" "" "$CACHE_OFF"
    MAIN_KEY=$(issue_key "$WORK/sg-main" bench)
    for ((i = 2; i <= KEYS_SMALL; i++)); do issue_key "$WORK/sg-main" "bench-$i" >/dev/null; done
    start_socialgate sg-main
    MAIN_URL=$SG_URL MAIN_PID=$SG_PID

    # The big-keys instance: one key from the CLI, the rest generated.
    if [[ $GROWTH == 1 ]]; then
        write_config "$WORK/sg-keys" "" "$CACHE_OFF"
        BIG_KEY=$(issue_key "$WORK/sg-keys" bench)
        python3 "$SRC/tools.py" add-keys "$WORK/sg-keys/keys.toml" $((KEYS_LARGE - 1))
        start_socialgate sg-keys
        BIG_URL=$SG_URL BIG_PID=$SG_PID
        # The log line is written by the log thread, a moment later.
        for ((i = 0; i < 100; i++)); do
            grep -q "keys=$KEYS_LARGE" "$WORK/sg-keys/logs/server.log" && break
            kill -0 "$BIG_PID" 2>/dev/null || break
            sleep 0.1
        done
        grep -q "keys=$KEYS_LARGE" "$WORK/sg-keys/logs/server.log" ||
            die "sg-keys did not load $KEYS_LARGE keys: $(grep -m1 'configuration loaded' "$WORK/sg-keys/logs/server.log")"
    fi

    log "checks: every target answers 200 with the expected payload"
    local endpoint
    for endpoint in profile post; do
        check_upstream "$UPSTREAM_URL${UP_PATH[$endpoint]}" "upstream $endpoint"
        check_upstream "$PROXY_URL${UP_PATH[$endpoint]}" "proxy $endpoint"
    done
    check_upstream "$UPSTREAM_URL${UP_PATH[comments]}" "upstream comments"
    check_upstream "$PROXY_URL${UP_PATH[comments]}" "proxy comments"
    for endpoint in "${ENDPOINTS[@]}"; do
        check_socialgate "$MAIN_URL${SG_PATH[$endpoint]}" "$endpoint" "$MAIN_KEY"
    done
    if [[ $GROWTH == 1 ]]; then
        check_socialgate "$BIG_URL${SG_PATH[profile]}" profile "$BIG_KEY" >/dev/null
    fi
    sleep 1
    record_rss "main server, $KEYS_SMALL keys: idle after start-up and the checks" "$MAIN_PID"
    if [[ $GROWTH == 1 ]]; then
        record_rss "keys server, $(fmt_int "$KEYS_LARGE") keys: idle after start-up and the check" "$BIG_PID"
    fi

    side_by_side
    floor
    cache_scenarios
    shared_state
    instructions
    if [[ $GROWTH == 1 ]]; then
        growth
        sleep 1
        record_rss "main server, $KEYS_SMALL keys: idle after all the load above" "$MAIN_PID"
        stop_pid "$BIG_PID"
        forget_pid "$BIG_PID"
        idle_memory
    fi

    write_meta
    log "done; figures below (also in $WORK/report.md)"
    echo
    if python3 "$SRC/tools.py" report "$WORK/results.tsv" "$WORK/memory.tsv" "$WORK/meta.tsv"; then
        exit 0
    else
        exit 1
    fi
}

main "$@"
