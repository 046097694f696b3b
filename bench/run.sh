#!/usr/bin/env bash
# bench/run.sh: socialgate side by side with nginx, on 127.0.0.1 only.
#
# realistic  (the headline) upstreams that answer after 0.5 s (nginx's echo
#            module); socialgate, cache off, against nginx proxy_pass to the
#            same upstream, at 1,000 and 4,000 connections; req/s, p50, p99
#            and the RSS of each server idle before the load and under it.
#            Each measurement on a fresh server.
# synthetic  (CPU efficiency) an upstream that answers at once: uncached
#            `profile` against the nginx proxy, cached against nginx
#            proxy_cache (and nginx serving the file), 100,000 keys issued
#            against 10.
# redis      (optional) rate limits and billing on Redis against local state.
#
# BENCH_BEFORE=<revision> adds the build of that revision (a worktree and a
# target dir of its own under target/bench) as a third target in the
# realistic scenario and in synthetic's uncached and cached `profile`, with
# the ratios after / before.
#
# Every figure is the median of BENCH_ROUNDS interleaved rounds (socialgate,
# nginx, socialgate, nginx, ...). The report (markdown, also written to
# target/bench/report.md) ends with whether the issue-48 floors hold.
# Knobs and floors: bench/README.md.
# Exit: 0 the floors hold; 1 one is missed (printed last); 2 the benchmark
# could not run. Everything started here is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/bench
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$TARGET_DIR/bench

DURATION=${BENCH_SECONDS:-10}             # seconds per measured wrk run
WARMUP=${BENCH_WARMUP_SECONDS:-3}         # unrecorded run before each target
ROUNDS=${BENCH_ROUNDS:-3}
SCENARIOS=${BENCH_SCENARIOS:-"realistic synthetic"}
REAL_CONNS=${BENCH_REALISTIC_CONNS:-"1000 4000"}
SYNTH_CONNS=${BENCH_SYNTHETIC_CONNS:-32}
KEYS_SMALL=10
KEYS_LARGE=${BENCH_KEYS_LARGE:-100000}
LOG_LEVEL=${BENCH_LOG:-info}              # SOCIALGATE_LOG of the servers
SKIP_BUILD=${BENCH_SKIP_BUILD:-0}
BEFORE=${BENCH_BEFORE:-}                  # a git revision: its build measured too
BEFORE_FLOOR=${BENCH_BEFORE_FLOOR:-0}     # 1: within 10% of it is a floor
UPSTREAM_DELAY=0.5                        # seconds, the realistic upstream's

USERNAME=lunabakes                        # the fixture's profile
export SHORTVIDEO_PRIMARY_KEY=bench-upstream-key  # socialgate sends it, nginx checks it
SG_PATH="/v1/shortvideo/profile?username=$USERNAME"
UP_PATH="/v1/user/profile?unique_id=$USERNAME"
UP_HDR="X-Api-Key: $SHORTVIDEO_PRIMARY_KEY"

PIDS=() # everything started here, stopped by cleanup()

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() {
    log "ERROR: $*" >&2
    exit 2
}
has() { [[ " $SCENARIOS " == *" $1 "* ]]; }

validate_knobs() {
    local v
    for v in "$DURATION" "$WARMUP" "$ROUNDS" "$KEYS_LARGE" "$SYNTH_CONNS" $REAL_CONNS; do
        [[ $v =~ ^[0-9]+$ ]] || die "not a whole number: '$v' (check the BENCH_* variables)"
    done
    ((DURATION >= 1 && ROUNDS >= 1)) || die "BENCH_SECONDS and BENCH_ROUNDS must be >= 1"
    ((KEYS_LARGE > KEYS_SMALL)) || die "BENCH_KEYS_LARGE must exceed $KEYS_SMALL"
    [[ $BEFORE_FLOOR =~ ^[01]$ ]] || die "BENCH_BEFORE_FLOOR is 0 or 1, not '$BEFORE_FLOOR'"
    if [[ -n $BEFORE ]]; then
        BEFORE_REV=$(git -C "$ROOT" rev-parse --verify --quiet "$BEFORE^{commit}") ||
            die "BENCH_BEFORE: '$BEFORE' is not a revision of $ROOT"
    fi
    for v in $SCENARIOS; do
        [[ $v =~ ^(realistic|synthetic|redis)$ ]] || die "unknown scenario in BENCH_SCENARIOS: $v"
    done
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

forget() {
    local i
    for i in "${!PIDS[@]}"; do
        if [[ ${PIDS[$i]} == "$1" ]]; then unset 'PIDS[i]'; fi
    done
}

# stop PID...: stops them and forgets them.
stop() {
    local pid
    for pid in "$@"; do
        stop_pid "$pid"
        forget "$pid"
    done
}

cleanup() {
    local status=$? i idx=("${!PIDS[@]}")
    trap - EXIT INT TERM
    for ((i = ${#idx[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[${idx[$i]}]}"; done
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# rss_kib PID: VmRSS of the process and its children (nginx's master and
# workers), in kB as /proc gives it (1,024 bytes).
rss_kib() {
    local pid total=0 kib
    for pid in "$1" $(cat "/proc/$1/task/$1/children" 2>/dev/null || true); do
        kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        total=$((total + ${kib:-0}))
    done
    echo "$total"
}

# ------------------------------------------------------------------ set-up
ensure_tools() {
    local missing=() sudo=()
    command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
    [[ -f $ECHO_MODULE ]] || missing+=(libnginx-mod-http-echo)
    command -v wrk >/dev/null || missing+=(wrk)
    command -v curl >/dev/null || missing+=(curl)
    command -v python3 >/dev/null || missing+=(python3)
    if ((${#missing[@]})); then
        ((EUID == 0)) || sudo=(sudo)
        log "installing ${missing[*]}"
        # RUNLEVEL=1: the package must not start the system's nginx on port 80.
        {
            "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get update -q >/dev/null &&
                "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -q "${missing[@]}"
        } || die "cannot install ${missing[*]}"
    fi
    if has redis; then "$ROOT/scripts/install-redis.sh" || die "cannot install redis-server"; fi
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain"
}
ECHO_MODULE=/usr/lib/nginx/modules/ngx_http_echo_module.so

build() {
    if [[ $SKIP_BUILD == 1 ]]; then
        log "BENCH_SKIP_BUILD=1: using the existing release build"
    else
        log "cargo build --release"
        (cd "$ROOT" && cargo build --release) || die "release build failed"
    fi
    SG=$TARGET_DIR/release/socialgate
    PLUGIN_DIR=$TARGET_DIR/release
    [[ -x $SG && -f $PLUGIN_DIR/libshortvideo_primary.so ]] ||
        die "$SG or $PLUGIN_DIR/libshortvideo_primary.so missing"
}

# The build before a change (BENCH_BEFORE): a detached worktree of that
# revision in BEFORE_SRC (kept between runs while it is at that revision)
# built in a target dir of its own, so the main build is untouched. Its
# plugins are the ones its binary loads.
BEFORE_SRC=$WORK/before-src
BEFORE_TARGET=$WORK/before-target
build_before() {
    # A worktree has a .git file; without one, git -C would answer for ROOT.
    if [[ ! -f $BEFORE_SRC/.git || $(git -C "$BEFORE_SRC" rev-parse HEAD 2>/dev/null) != "$BEFORE_REV" ]]; then
        if [[ -e $BEFORE_SRC ]]; then
            git -C "$ROOT" worktree remove --force "$BEFORE_SRC" 2>/dev/null || rm -rf "$BEFORE_SRC"
        fi
        git -C "$ROOT" worktree prune
        log "git worktree add --detach $BEFORE_SRC $BEFORE"
        git -C "$ROOT" worktree add --quiet --detach "$BEFORE_SRC" "$BEFORE_REV" ||
            die "BENCH_BEFORE: cannot make a worktree of $BEFORE"
    fi
    SG_BEFORE=$BEFORE_TARGET/release/socialgate
    PLUGIN_DIR_BEFORE=$BEFORE_TARGET/release
    BEFORE_COMMIT=$(git -C "$BEFORE_SRC" rev-parse --short HEAD)
    # The revision the binary there was built from: a skipped build must be it.
    if [[ $SKIP_BUILD == 1 && -x $SG_BEFORE && $(cat "$BEFORE_TARGET/built-from" 2>/dev/null) == "$BEFORE_REV" ]]; then
        log "BENCH_SKIP_BUILD=1: using the existing build before ($BEFORE_COMMIT)"
    else
        log "cargo build --release of $BEFORE ($BEFORE_COMMIT), into $BEFORE_TARGET"
        (cd "$BEFORE_SRC" && CARGO_TARGET_DIR=$BEFORE_TARGET cargo build --release) ||
            die "release build of $BEFORE failed"
        echo "$BEFORE_REV" >"$BEFORE_TARGET/built-from"
    fi
    [[ -x $SG_BEFORE && -f $PLUGIN_DIR_BEFORE/libshortvideo_primary.so ]] ||
        die "$SG_BEFORE or $PLUGIN_DIR_BEFORE/libshortvideo_primary.so missing"
}

# before CMD...: CMD with the build before as socialgate (its binary, its
# plugins); what CMD sets (SG_PID, SG_URL, SG_KEY) stays set.
before() {
    local SG=$SG_BEFORE PLUGIN_DIR=$PLUGIN_DIR_BEFORE SG_SRC=$BEFORE_SRC
    "$@"
}

# Each realistic server holds a client and an upstream socket per
# connection; children inherit the limit.
raise_nofile() {
    local max=0 c want
    for c in $REAL_CONNS "$SYNTH_CONNS"; do ((c > max)) && max=$c; done
    want=$((2 * max + 1024))
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    [[ $(ulimit -n) == unlimited ]] || (($(ulimit -n) >= want)) ||
        die "open files limit $(ulimit -n) is under the $want that $max connections need (raise the hard limit)"
    NOFILE=$(ulimit -n)
    [[ $NOFILE == unlimited ]] && NOFILE=1048576
    WORKER_CONNECTIONS=$((NOFILE < 65536 ? NOFILE : 65536))
    log "open files limit: $NOFILE"
}

# ------------------------------------------------------------------- nginx
# start_nginx NAME TEMPLATE PORT [sed expressions...]; sets NGINX_PID.
start_nginx() {
    local name=$1 template=$2 port=$3 i
    shift 3
    local dir=$WORK/$name user_line=""
    mkdir -p "$dir/tmp"
    # As root, workers would otherwise run as nobody, who may not read target/.
    ((EUID == 0)) && user_line="user root root;"
    sed -e "s|@DIR@|$dir|g" -e "s|@PORT@|$port|g" -e "s|@USER_LINE@|$user_line|" \
        -e "s|@NOFILE@|$NOFILE|g" -e "s|@WORKER_CONNECTIONS@|$WORKER_CONNECTIONS|g" \
        "$@" "$template" >"$dir/nginx.conf"
    "$NGINX" -q -t -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" ||
        die "$name: nginx refuses its config ($dir/nginx.conf)"
    "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" &
    NGINX_PID=$!
    PIDS+=("$NGINX_PID")
    for ((i = 0; i < 150; i++)); do
        kill -0 "$NGINX_PID" 2>/dev/null || break
        curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$port/" && return 0
        sleep 0.1
    done
    die "$name: nginx did not start (see $dir/error.log)"
}

# One nginx, one worker: the fixture's profile at once on UPSTREAM_PORT, and
# after UPSTREAM_DELAY on SLOW_PORT.
start_upstream() {
    mkdir -p "$WORK/upstream-root"
    cp "$ROOT/fixtures/upstreams/primary/user_profile.json" "$WORK/upstream-root/"
    start_nginx nginx-upstream "$SRC/nginx-upstream.conf.in" "$UPSTREAM_PORT" \
        -e "s|@SLOW_PORT@|$SLOW_PORT|g" -e "s|@DELAY@|$UPSTREAM_DELAY|g" \
        -e "s|@ECHO_MODULE@|$ECHO_MODULE|g" -e "s|@DOCROOT@|$WORK/upstream-root|g" \
        -e "s|@UPSTREAM_KEY@|$SHORTVIDEO_PRIMARY_KEY|g"
    UPSTREAM_PID=$NGINX_PID
}

# start_proxy NAME TEMPLATE UPSTREAM_PORT; sets PROXY_PID and PROXY_URL.
start_proxy() {
    local port
    port=$(python3 "$SRC/tools.py" free-ports 1)
    start_nginx "$1" "$2" "$port" -e "s|@UPSTREAM_PORT@|$3|g"
    PROXY_PID=$NGINX_PID PROXY_URL=http://127.0.0.1:$port
    check_upstream "$PROXY_URL$UP_PATH" "$1"
}

# ------------------------------------------------------------- socialgate
# write_config NAME UPSTREAM_PORT [top-level tables]
# The platform's description is the one of the build's own source (SG_SRC),
# named only where that source's platforms.toml names one: a build from
# before descriptions refuses the key.
write_config() {
    local dir=$WORK/$1 description=""
    mkdir -p "$dir"
    if grep -q '^description = ' "${SG_SRC:-$ROOT}/platforms.toml"; then
        description="description = \"${SG_SRC:-$ROOT}/platforms/shortvideo.toml\""
    fi
    cat >"$dir/platforms.toml" <<EOF
# Written by bench/run.sh.
[server]
listen = "127.0.0.1:0"
admin_listen = "off"
keys_file = "keys.toml"
state_dir = "state"
plugin_dir = "$PLUGIN_DIR"
shutdown_grace_ms = 2000
# Room for the most connections measured, each with a request in flight
# (the defaults are sized for one replica among several).
max_connections = 16384
max_concurrent_requests = 16384
cursor_key_env = "BENCH_CURSOR_KEY"

${3:-}

[platforms.shortvideo]
status = "live"
providers = ["shortvideo-primary"]
$description

[providers.shortvideo-primary]
library = "shortvideo_primary"
base_url = "http://127.0.0.1:$2"
api_key_env = "SHORTVIDEO_PRIMARY_KEY"
max_in_flight = 16384
EOF
}
export BENCH_CURSOR_KEY=bench-cursor-key-shared-by-replicas-0123456789
CACHE_OFF=$'[cache]\nenabled = false'

issue_key() { "$SG" keys issue --name "$2" --config "$WORK/$1/platforms.toml"; }

# start_socialgate NAME; sets SG_PID and SG_URL. Logs at LOG_LEVEL to files
# in a folder of their own (the server watches its config's folder).
start_socialgate() {
    local dir=$WORK/$1 i
    mkdir -p "$dir/logs"
    : >"$dir/logs/stdout.log"
    SOCIALGATE_LOG=$LOG_LEVEL "$SG" serve --config "$dir/platforms.toml" \
        >"$dir/logs/stdout.log" 2>"$dir/logs/server.log" &
    SG_PID=$!
    PIDS+=("$SG_PID")
    SG_URL=""
    for ((i = 0; i < 300; i++)); do
        SG_URL=$(sed -n 's|^listening on \(http://[0-9.:]*\)$|\1|p' "$dir/logs/stdout.log")
        [[ -n $SG_URL ]] && return 0
        kill -0 "$SG_PID" 2>/dev/null || break
        sleep 0.1
    done
    die "$1: socialgate did not start: $(tail -n 5 "$dir/logs/server.log")"
}

# sg_instance NAME UPSTREAM_PORT TABLES [KEYS]: configured with KEYS keys (1:
# the CLI issues up to KEYS_SMALL, the rest are generated), started and
# checked with the first; sets SG_PID, SG_URL and SG_KEY.
sg_instance() {
    local keys=${4:-1} i
    write_config "$1" "$2" "$3"
    SG_KEY=$(issue_key "$1" bench) || die "$1: keys issue failed"
    for ((i = 2; i <= keys && i <= KEYS_SMALL; i++)); do issue_key "$1" "bench-$i" >/dev/null; done
    if ((keys > KEYS_SMALL)); then
        python3 "$SRC/tools.py" add-keys "$WORK/$1/keys.toml" $((keys - KEYS_SMALL))
    fi
    start_socialgate "$1"
    check_socialgate "$SG_URL$SG_PATH" "$SG_KEY"
    # The count is logged (at info) by the log thread, a moment after start.
    for ((i = 0; i < 50; i++)); do
        grep -q 'configuration loaded' "$WORK/$1/logs/server.log" && break
        sleep 0.1
    done
    if grep -q 'configuration loaded' "$WORK/$1/logs/server.log"; then
        grep -q "configuration loaded.*keys=$keys\b" "$WORK/$1/logs/server.log" ||
            die "$1 did not load $keys keys: $(grep -m1 'configuration loaded' "$WORK/$1/logs/server.log")"
    fi
}

# ------------------------------------------------------------------ checks
check_socialgate() {
    local body=$WORK/check.json code
    code=$(curl -sS --max-time 10 -o "$body" -w '%{http_code}' -H "X-API-Key: $2" "$1") ||
        die "no answer from $1"
    [[ $code == 200 ]] || die "$1 answered HTTP $code, not 200: $(head -c 400 "$body")"
    python3 "$SRC/tools.py" check "$body" >/dev/null || die "$1: wrong answer"
}

check_upstream() {
    local headers=$WORK/check-headers.txt code
    code=$(curl -sS --max-time 10 -D "$headers" -o /dev/null -w '%{http_code}' -H "$UP_HDR" "$1") ||
        die "$2: no answer from $1"
    [[ $code == 200 ]] || die "$2: HTTP $code from $1"
    grep -qi '^content-type: application/json' "$headers" || die "$2: $1 is not application/json"
}

# check_hits SG_URL KEY PCACHE_URL: both caches answer the second request.
check_hits() {
    local headers=$WORK/check-headers.txt body=$WORK/check.json
    check_socialgate "$1" "$2"
    curl -sS --max-time 10 -D "$headers" -o "$body" -H "X-API-Key: $2" "$1" || die "no answer from $1"
    python3 "$SRC/tools.py" check-hit "$headers" "$body" || die "socialgate: not a cache hit"
    check_upstream "$3" "proxy_cache"
    curl -sS --max-time 10 -D "$headers" -o /dev/null -H "$UP_HDR" "$3" || die "no answer from $3"
    grep -qi '^x-cache-status: HIT' "$headers" || die "proxy_cache: not a cache hit"
}

# --------------------------------------------------------------------- wrk
warm() { wrk -t1 -c"$3" -d"${WARMUP}s" -H "$2" "$1" >/dev/null 2>&1 || die "warm-up failed on $1"; }

# run_wrk SECTION TARGET CONNS ROUND URL HEADER PID [IDLE_KIB]: one measured
# run; PID's RSS sampled while it lasts (the largest sample is kept).
run_wrk() {
    local section=$1 target=$2 conns=$3 round=$4 url=$5 header=$6 pid=$7 idle=${8:--}
    local out=$WORK/wrk/$section-$target-c$conns-r$round.txt wrk_pid line rss peak=0 i
    wrk -t1 -c"$conns" -d"${DURATION}s" --latency --timeout 10s -s "$SRC/report.lua" \
        -H "$header" "$url" >"$out" 2>&1 &
    wrk_pid=$!
    PIDS+=("$wrk_pid")
    for ((i = 0; i < 4 * (DURATION + 15); i++)); do
        kill -0 "$wrk_pid" 2>/dev/null || break
        rss=$(rss_kib "$pid")
        ((rss > peak)) && peak=$rss
        sleep 0.25
    done
    wait "$wrk_pid" || die "wrk failed: $(tail -n 3 "$out")"
    forget "$wrk_pid"
    line=$(python3 "$SRC/tools.py" wrk-line "$out") || die "cannot read $out"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$section" "$target" "$conns" "$round" "$line" \
        "$idle" "$peak" >>"$WORK/results.tsv"
    local rps p50 p99 non2xx errors trouble=""
    read -r rps p50 p99 _ non2xx errors <<<"$line"
    ((non2xx + errors == 0)) || trouble="  non-2xx $non2xx, socket errors $errors"
    awk -v s="$section" -v t="$target" -v c="$conns" -v r="$rps" -v a="$p50" -v b="$p99" \
        -v i="$idle" -v p="$peak" -v x="$trouble" 'BEGIN {
        printf "  %-9s %-24s c=%-5s %8.0f req/s  p50 %7.2f ms  p99 %7.2f ms  RSS %s -> %s kB%s\n",
            s, t, c, r, a / 1000, b / 1000, i, p, x }'
}

# --------------------------------------------------------------- scenarios
# realistic_one TARGET CONNS ROUND: a fresh server, its RSS once idle, a
# warm-up at CONNS and the measured run.
realistic_one() {
    local target=$1 conns=$2 round=$3 pid url header idle
    if [[ $target == socialgate* ]]; then
        if [[ $target == socialgate-before ]]; then
            before sg_instance sg-realistic "$SLOW_PORT" "$CACHE_OFF"
        else
            sg_instance sg-realistic "$SLOW_PORT" "$CACHE_OFF"
        fi
        pid=$SG_PID url=$SG_URL$SG_PATH header="X-API-Key: $SG_KEY"
    else
        start_proxy nginx-realistic "$SRC/nginx-proxy.conf.in" "$SLOW_PORT"
        pid=$PROXY_PID url=$PROXY_URL$UP_PATH header=$UP_HDR
    fi
    sleep 1
    idle=$(rss_kib "$pid")
    warm "$url" "$header" "$conns"
    run_wrk realistic "$target" "$conns" "$round" "$url" "$header" "$pid" "$idle"
    stop "$pid"
    rm -rf "$WORK/sg-realistic" "$WORK/nginx-realistic"
}

realistic() {
    local round conns target targets=(socialgate ${BEFORE:+socialgate-before} nginx)
    for ((round = 1; round <= ROUNDS; round++)); do
        log "realistic (upstream answers after ${UPSTREAM_DELAY}s), round $round/$ROUNDS"
        for conns in $REAL_CONNS; do
            for target in "${targets[@]}"; do realistic_one "$target" "$conns" "$round"; done
        done
    done
}

# Long-lived servers against the upstream that answers at once.
synthetic() {
    local -A url header pid
    # With BENCH_BEFORE, the build before right after its counterpart.
    local targets=(socialgate ${BEFORE:+socialgate-before} proxy socialgate-cached
        ${BEFORE:+socialgate-cached-before} proxy-cache static socialgate-100k-keys)
    local target round
    # sg_target TARGET: the instance just started is TARGET.
    sg_target() { url[$1]=$SG_URL$SG_PATH header[$1]="X-API-Key: $SG_KEY" pid[$1]=$SG_PID; }
    sg_instance sg-main "$UPSTREAM_PORT" "$CACHE_OFF" "$KEYS_SMALL"
    sg_target socialgate
    sg_instance sg-keys "$UPSTREAM_PORT" "$CACHE_OFF" "$KEYS_LARGE"
    sg_target socialgate-100k-keys
    sg_instance sg-cached "$UPSTREAM_PORT" "" # the cache at its defaults
    sg_target socialgate-cached
    if [[ -n $BEFORE ]]; then
        before sg_instance sg-before "$UPSTREAM_PORT" "$CACHE_OFF" "$KEYS_SMALL"
        sg_target socialgate-before
        before sg_instance sg-before-cached "$UPSTREAM_PORT" ""
        sg_target socialgate-cached-before
    fi
    start_proxy nginx-proxy "$SRC/nginx-proxy.conf.in" "$UPSTREAM_PORT"
    url[proxy]=$PROXY_URL$UP_PATH header[proxy]=$UP_HDR pid[proxy]=$PROXY_PID
    start_proxy nginx-proxy-cache "$SRC/nginx-proxy-cache.conf.in" "$UPSTREAM_PORT"
    url[proxy-cache]=$PROXY_URL$UP_PATH header[proxy-cache]=$UP_HDR pid[proxy-cache]=$PROXY_PID
    url[static]=http://127.0.0.1:$UPSTREAM_PORT$UP_PATH header[static]=$UP_HDR pid[static]=$UPSTREAM_PID
    check_hits "${url[socialgate-cached]}" "${header[socialgate-cached]#X-API-Key: }" "${url[proxy-cache]}"
    if [[ -n $BEFORE ]]; then
        check_hits "${url[socialgate-cached-before]}" "${header[socialgate-cached-before]#X-API-Key: }" \
            "${url[proxy-cache]}"
    fi

    for target in "${targets[@]}"; do warm "${url[$target]}" "${header[$target]}" "$SYNTH_CONNS"; done
    for ((round = 1; round <= ROUNDS; round++)); do
        log "synthetic (upstream answers at once), round $round/$ROUNDS"
        for target in "${targets[@]}"; do
            run_wrk synthetic "$target" "$SYNTH_CONNS" "$round" "${url[$target]}" \
                "${header[$target]}" "${pid[$target]}"
        done
    done
    # How nginx answered: one MISS (the fill), then HITs.
    PCACHE_STATUSES=$(awk 'index($0, "\"GET /v1/user/profile?") {n[$NF]++}
        END {for (s in n) printf "%s %d, ", s, n[s]}' \
        "$WORK/nginx-proxy-cache/access.log" | sed 's/, $//')
    unset 'pid[static]' # the upstream, which the later scenarios use
    stop "${pid[@]}"
}

# Rate limits that never refuse and billing enforced with credits that never
# run out, on local state and on a redis-server of its own (AOF, everysec).
redis_state() {
    local tables round port redis_pid local_url redis_url local_hdr redis_hdr local_pid redis_pid_sg
    tables=$'[rate_limit]\nper_second = 1000000\nburst = 1000000\n\n[billing]\nenforce = true\nfree_credits = 1000000000000\n'$CACHE_OFF
    port=$(python3 "$SRC/tools.py" free-ports 1)
    mkdir -p "$WORK/redis"
    redis-server --bind 127.0.0.1 --port "$port" --dir "$WORK/redis" --appendonly yes \
        --appendfsync everysec --save "" >"$WORK/redis/redis.log" 2>&1 &
    redis_pid=$!
    PIDS+=("$redis_pid")
    for ((round = 0; round < 100; round++)); do
        [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] && break
        sleep 0.1
    done
    [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] ||
        die "redis-server did not start: $(tail -n 3 "$WORK/redis/redis.log")"
    export BENCH_REDIS_URL=redis://127.0.0.1:$port/0
    sg_instance sg-state-local "$UPSTREAM_PORT" "$tables"
    local_url=$SG_URL$SG_PATH local_hdr="X-API-Key: $SG_KEY" local_pid=$SG_PID
    sg_instance sg-state-redis "$UPSTREAM_PORT" "$tables"$'\n\n[state]\nbackend = "redis"\nurl_env = "BENCH_REDIS_URL"'
    redis_url=$SG_URL$SG_PATH redis_hdr="X-API-Key: $SG_KEY" redis_pid_sg=$SG_PID
    warm "$local_url" "$local_hdr" "$SYNTH_CONNS"
    warm "$redis_url" "$redis_hdr" "$SYNTH_CONNS"
    for ((round = 1; round <= ROUNDS; round++)); do
        log "redis state, round $round/$ROUNDS"
        run_wrk redis local-state "$SYNTH_CONNS" "$round" "$local_url" "$local_hdr" "$local_pid"
        run_wrk redis redis-state "$SYNTH_CONNS" "$round" "$redis_url" "$redis_hdr" "$redis_pid_sg"
    done
    stop "$redis_pid_sg" "$local_pid" "$redis_pid"
}

write_meta() {
    local commit cpu
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    [[ -z $(git -C "$ROOT" status --porcelain 2>/dev/null) ]] || commit="$commit (with local changes)"
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    {
        printf 'date\t%s\n' "$(date -u +%Y-%m-%d)"
        printf 'machine\t%s, %s cores, %s GiB RAM, Linux %s\n' "${cpu:-unknown CPU}" "$(nproc)" \
            "$(awk '/^MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)" "$(uname -r)"
        printf 'tools\t%s, %s\n' "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')" \
            "$(wrk -v 2>&1 | head -n 1 | cut -d' ' -f1-2)"
        printf 'load\t%s\nseconds\t%s\nwarmup\t%s\nrounds\t%s\n' "$LOAD_AT_START" "$DURATION" "$WARMUP" "$ROUNDS"
        printf 'commit\t%s\nlog\t%s\ndelay\t%s\n' "$commit" "$LOG_LEVEL" "$UPSTREAM_DELAY"
        printf 'before\t%s\nbefore_floor\t%s\n' "${BEFORE_COMMIT:-}" "$BEFORE_FLOOR"
        printf 'keys_small\t%s\nkeys_large\t%s\npcache\t%s\n' "$KEYS_SMALL" "$KEYS_LARGE" "${PCACHE_STATUSES:-}"
    } >"$WORK/meta.tsv"
}

main() {
    validate_knobs
    ensure_tools
    build
    if [[ -n $BEFORE ]]; then build_before; fi
    # Everything but the build before, kept for the next run.
    mkdir -p "$WORK"
    find "$WORK" -mindepth 1 -maxdepth 1 ! -name before-src ! -name before-target -exec rm -rf {} +
    mkdir -p "$WORK/wrk"
    : >"$WORK/results.tsv"
    raise_nofile
    LOAD_AT_START=$(cut -d' ' -f1-3 /proc/loadavg)
    log "load average: $LOAD_AT_START; working files: $WORK"
    read -r UPSTREAM_PORT SLOW_PORT <<<"$(python3 "$SRC/tools.py" free-ports 2)"
    start_upstream
    check_upstream "http://127.0.0.1:$UPSTREAM_PORT$UP_PATH" upstream
    check_upstream "http://127.0.0.1:$SLOW_PORT$UP_PATH" "slow upstream"
    if has realistic; then realistic; fi
    if has synthetic; then synthetic; fi
    if has redis; then redis_state; fi
    write_meta
    log "done; the report below is also in $WORK/report.md"
    echo
    python3 "$SRC/tools.py" report "$WORK/results.tsv" "$WORK/meta.tsv" "$WORK/report.md" || exit 1
}

main "$@"
