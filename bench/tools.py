#!/usr/bin/env python3
"""Helpers for bench/run.sh (Python 3 standard library only).

Subcommands:
  free-ports N                  print N free TCP ports on 127.0.0.1
  comment-pages FIXTURE DOCROOT MAPFILE AWEME_ID COUNT
                                write the primary's P4 comment pages the plugin
                                asks for when a caller wants COUNT comments,
                                and the nginx `map` lines that pick them
  add-keys KEYSFILE N           append N random key records to a keys file
  zipf-trace OUT REQUESTS USERS S SEED
                                write a seeded trace of REQUESTS usernames drawn
                                from USERS with Zipf(S) popularity, one a line
  check ENDPOINT BODYFILE [N]   check one socialgate answer (N: comments wanted)
  check-hit HEADERS BODYFILE    exit 0 when a socialgate answer came from its
                                cache (Cache-Status `hit`, meta.cached true)
  wrk-line FILE                 the BENCH line of a wrk run as tab-separated values
  report RESULTS MEMORY META    print the tables; exit 1 when a target is missed
"""

import base64
import bisect
import datetime
import hashlib
import json
import itertools
import os
import random
import secrets
import socket
import statistics
import sys

# The plugin asks P4 for at most this many comments a call
# (plugins/shortvideo-primary/src/lib.rs, COMMENTS_PER_CALL).
COMMENTS_PER_CALL = 50


def free_ports(n):
    # Bind them all at once so the N ports differ; closed before nginx binds.
    socks = []
    try:
        for _ in range(int(n)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        print(" ".join(str(s.getsockname()[1]) for s in socks))
    finally:
        for s in socks:
            s.close()


def comment_pages(fixture, docroot, mapfile, aweme_id, count):
    """Pages as tests/src/upstream.rs `primary_comments_page` builds them:
    generated comments from the fixture's first one, `cursor` = next offset,
    `has_more` while below the fixture's `total`. Only the (offset, size)
    pairs the plugin requests for `count` are written: any other request gets
    nginx's "no route" 500, like the test doubles' guard."""
    with open(fixture, encoding="utf-8") as f:
        base = json.load(f)
    total = int(base["total"])
    template = base["comments"][0]
    os.makedirs(os.path.join(docroot, "comments"), exist_ok=True)
    lines = []
    offset, want = 0, int(count)
    # Bounded: each step moves forward by at least one comment.
    while want > 0 and offset < total:
        size = min(want, COMMENTS_PER_CALL)
        n = min(size, total - offset)
        items = []
        for i in range(offset, offset + n):
            c = dict(template)
            c["cid"] = str(7_314_000_000_000_000_000 + i)
            c["text"] = f"comment #{i} \U0001f4ac"
            c["aweme_id"] = aweme_id
            c["digg_count"] = i
            items.append(c)
        page = dict(base)
        page["comments"] = items
        page["cursor"] = offset + n
        page["has_more"] = 1 if offset + n < total else 0
        name = f"/comments/{aweme_id}_{offset}_{size}.json"
        with open(docroot + name, "w", encoding="utf-8") as f:
            json.dump(page, f, ensure_ascii=False, separators=(",", ":"))
        # Key: "$arg_aweme_id:$arg_count:$arg_cursor" (see nginx-upstream.conf.in).
        lines.append(f'"{aweme_id}:{size}:{offset}" {name};')
        offset += n
        want -= n
    with open(mapfile, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} upstream page(s) of comments for count={count}: "
          + ", ".join(l.split()[0] for l in lines))


def add_keys(path, n):
    """Appends N `[[key]]` records in the format `socialgate keys issue`
    writes (host/src/auth.rs): name, lowercase hex SHA-256 of a
    `sg_` + base64url(32 random bytes) key, creation time. The keys
    themselves are thrown away: they only make the key store big."""
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for i in range(int(n)):
        key = "sg_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        digest = hashlib.sha256(key.encode()).hexdigest()
        out.append(f'\n[[key]]\nname = "bench-filler-{i:06d}"\nsha256 = "{digest}"\n'
                   f'created = "{created}"\n')
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(out))


def zipf_trace(out, requests, users, s, seed):
    """The cache scenario's trace: REQUESTS draws over USERS usernames
    (user0000.., valid profile usernames), the k-th most popular with
    weight 1/k**S. Fixed by SEED: `random.Random(seed).random()` is the same
    sequence on every Python 3, and the draw is cumulative weights + bisect,
    nothing version-dependent. Prints one `TRACE key=value ...` line."""
    requests, users, s, seed = int(requests), int(users), float(s), int(seed)
    if requests < 1 or users < 1 or s < 0:
        sys.exit("zipf-trace: REQUESTS and USERS must be >= 1, S >= 0")
    width = max(4, len(str(users - 1)))
    names = [f"user{k:0{width}d}" for k in range(users)]  # rank k+1 = names[k]
    cumulative = list(itertools.accumulate(1.0 / (k ** s) for k in range(1, users + 1)))
    total = cumulative[-1]
    rng = random.Random(seed)
    trace = [names[min(bisect.bisect_right(cumulative, rng.random() * total), users - 1)]
             for _ in range(requests)]
    text = "\n".join(trace) + "\n"
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    counts = {}
    for n in trace:
        counts[n] = counts.get(n, 0) + 1
    top = max(counts.values())
    once = sum(1 for c in counts.values() if c == 1)
    print(f"TRACE requests={requests} users={users} s={s:g} seed={seed} "
          f"distinct={len(counts)} top1_share={top / requests:.4f} seen_once={once} "
          f"sha256={hashlib.sha256(text.encode()).hexdigest()[:16]}")


def check(endpoint, bodyfile, wanted=None):
    with open(bodyfile, encoding="utf-8") as f:
        body = json.load(f)
    data = body.get("data")
    if body.get("success") is not True:
        sys.exit(f"{endpoint}: not a success: {json.dumps(body)[:300]}")
    if endpoint == "profile":
        ok = data.get("username") == "lunabakes"
        what = f"username={data.get('username')}"
    elif endpoint == "post":
        ok = data.get("id") == "7312345678901234567"
        what = f"id={data.get('id')}"
    elif endpoint == "comments":
        ok = isinstance(data, list) and len(data) == int(wanted)
        what = f"{len(data)} comments, next_cursor={body['meta'].get('next_cursor') is not None}"
    else:
        sys.exit(f"unknown endpoint {endpoint}")
    if not ok:
        sys.exit(f"{endpoint}: unexpected answer ({what}): {json.dumps(body)[:300]}")
    print(f"{endpoint}: 200, {what}")


def check_hit(headers_file, bodyfile):
    """A hit is both: the `Cache-Status` header's last member (RFC 9211) has
    the bare `hit` parameter, e.g. `socialgate; hit; ttl=297`, and the body's
    `meta.cached` is JSON true."""
    sys.dont_write_bytecode = True  # no bench/__pycache__ in the tree
    from replay import parse_cache_status  # bench/ is on sys.path
    value = None
    with open(headers_file, encoding="utf-8", errors="replace") as f:
        for line in f:
            name, sep, v = line.partition(":")
            if sep and name.strip().lower() == "cache-status":
                value = v.strip()
    params = parse_cache_status(value)
    with open(bodyfile, encoding="utf-8") as f:
        meta = json.load(f).get("meta") or {}
    cached = meta.get("cached")
    seen = f"Cache-Status: {value if value is not None else '(none)'}; meta.cached: {json.dumps(cached)}"
    if params is not None and params.get("hit") is True and cached is True:
        print(f"200, a hit ({seen})")
        return
    print(seen)
    sys.exit(1)


def wrk_line(path):
    """The `BENCH ...` line bench/report.lua prints, as
    rps p50_us p99_us requests non2xx socket_errors."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("BENCH "):
                kv = dict(p.split("=", 1) for p in line.split()[1:])
                errors = sum(int(kv[k]) for k in ("connect", "read", "write", "timeout"))
                print("\t".join([kv["rps"], kv["p50_us"], kv["p99_us"], kv["requests"],
                                 kv["non2xx"], str(errors)]))
                return
    sys.exit(f"{path}: no BENCH line (did wrk run?)")


# ---------------------------------------------------------------- report

def fmt_ms(us):
    return f"{us / 1000:.2f} ms" if us < 100_000 else f"{us / 1000:.0f} ms"


def fmt_rps(rps):
    return f"{rps:,.0f}"


def fmt_kib(kib):
    return f"{kib / 1024:.1f} MiB"


class Results:
    def __init__(self, path):
        self.rows = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                section, target, endpoint, conns, rnd, rps, p50, p99, reqs, non2xx, errs = \
                    line.rstrip("\n").split("\t")
                self.rows.append(dict(section=section, target=target, endpoint=endpoint,
                                      conns=int(conns), round=int(rnd), rps=float(rps),
                                      p50=float(p50), p99=float(p99), requests=int(reqs),
                                      non2xx=int(non2xx), errors=int(errs)))

    def get(self, section, target, endpoint, conns):
        """Medians over rounds, each figure on its own; errors summed."""
        rows = [r for r in self.rows if (r["section"], r["target"], r["endpoint"], r["conns"])
                == (section, target, endpoint, conns)]
        if not rows:
            return None
        return dict(rps=statistics.median(r["rps"] for r in rows),
                    p50=statistics.median(r["p50"] for r in rows),
                    p99=statistics.median(r["p99"] for r in rows),
                    non2xx=sum(r["non2xx"] for r in rows),
                    errors=sum(r["errors"] for r in rows),
                    rounds=len(rows))

    def keys(self, section, field):
        seen = []
        for r in self.rows:
            if r["section"] == section and r[field] not in seen:
                seen.append(r[field])
        return seen


def cells(m):
    if m is None:
        return ["-", "-", "-"]
    flag = ""
    if m["non2xx"] or m["errors"]:
        flag = f" ⚠{m['non2xx']}/{m['errors']}"
    return [fmt_rps(m["rps"]) + flag, fmt_ms(m["p50"]), fmt_ms(m["p99"])]


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


CACHE_BUILD_TEXT = {
    "supported": "this build has the response cache; the side-by-side, growth and "
                 "memory instances run with `[cache] enabled = false`, the cache "
                 "scenarios' with the cache at its defaults.",
    "unsupported": "this build has no response cache (its config refuses `[cache]`); "
                   "every instance runs without a `[cache]` table.",
}


def cache_report(out, res, meta, failures, notes):
    """The two cache scenarios' tables; returns the lines for the Targets
    list. Their checks fail the run only when meta cache_enforced is 1."""
    run = meta.get("cache_run", "off")
    enforced = meta.get("cache_enforced") == "1"
    targets = []
    title1 = "#### Cached `profile`: socialgate's cache vs nginx `proxy_cache`"
    title2 = "#### Zipf trace replayed through socialgate's cache"
    if run in ("skipped", "off"):
        why = ("skipped: this build has no cache" if run == "skipped"
               else "skipped (BENCH_CACHE=0)")
        for title in (title1, title2):
            out += ["", title, "", why + "."]
        targets.append(f"- cache scenarios: {why}")
        return targets
    if not enforced:
        out += ["", "Cache scenarios forced (`BENCH_CACHE=force`) on a build without the "
                "cache: figures are the \"before\", checks are printed, nothing is enforced."]

    def judge(ok, line, failure):
        targets.append(f"- {line}: {'ok' if ok else ('FAIL' if enforced else 'missed (not enforced)')}")
        if not ok and enforced:
            failures.append(failure)

    # Scenario 1.
    conns = int(meta["check_conns"])
    st = res.get("cache", "static", "profile", conns)
    pc = res.get("cache", "proxy-cache", "profile", conns)
    sg = res.get("cache", "socialgate-cached", "profile", conns)
    has_cache = meta.get("cache_build") == "supported"
    out += ["", f"{title1} ({conns} connections)", ""]
    rows = []
    for name, m in (("nginx static (the upstream's file)", st),
                    ("nginx proxy_cache (hits)", pc),
                    ("socialgate cached (hits)" if has_cache
                     else "socialgate (no cache in this build)", sg)):
        rows.append([name] + cells(m))
        if m and (m["non2xx"] or m["errors"]):
            notes.append(f"{name} (cache scenario): {m['non2xx']} non-2xx, "
                         f"{m['errors']} socket errors/timeouts")
            if m["non2xx"]:
                failures.append(f"{name} answered {m['non2xx']} non-2xx during the measurement")
    out.append(table(["target", "req/s", "p50", "p99"], rows))
    out.append("")
    sg_checked = ("socialgate's (after one request filled its cache) a `Cache-Status` with "
                  "`hit` and `\"cached\": true`" if has_cache else
                  "socialgate's was not a hit (no cache in this build)")
    out.append("Same upstream double and rounds as above; the three interleaved within each "
               "round. Before measuring: nginx's second answer had `X-Cache-Status: HIT`, "
               f"{sg_checked}. nginx proxy_cache, `profile` requests in its access log by "
               f"cache status: {meta.get('pcache_statuses') or '?'} (the MISS: the fill).")
    if sg and pc and st:
        r_pc = sg["rps"] / pc["rps"]
        r_st = sg["rps"] / st["rps"]
        lim_pc, lim_st = float(meta["cache_proxy_ratio"]), float(meta["cache_static_ratio"])
        out += ["", f"socialgate cached / nginx proxy_cache: {r_pc:.2f}x; "
                f"socialgate cached / nginx static: {r_st:.2f}x."]
        judge(r_pc >= lim_pc, f"cached profile @{conns}: socialgate/proxy_cache throughput "
              f"{r_pc:.2f} (target >= {lim_pc:.2f})",
              f"cached profile: socialgate is {r_pc:.2f}x nginx proxy_cache, under {lim_pc:.2f}x")
        judge(r_st >= lim_st, f"cached profile @{conns}: socialgate/static throughput "
              f"{r_st:.2f} (target >= {lim_st:.2f})",
              f"cached profile: socialgate is {r_st:.2f}x nginx static, under {lim_st:.2f}x")
    else:
        failures.append("the cached profile scenario was not measured")

    # Scenario 2.
    trace = dict(kv.split("=", 1) for kv in meta.get("trace", "").split()[1:] if "=" in kv)
    path = meta.get("replay_json")
    if not path or not os.path.exists(path) or not trace:
        failures.append("the Zipf trace replay did not run")
        return targets
    with open(path, encoding="utf-8") as f:
        rp = json.load(f)
    upstream = int(meta.get("trace_upstream") or -1)
    distinct = int(trace["distinct"])
    sent = rp["sent"]
    out += ["", f"{title2} ({sent:,} `profile` requests, {meta['trace_conns']} connections, "
            "once through)", ""]
    best = 1 - distinct / sent if sent else 0
    out.append(table(["figure", "value"], [
        ["requests sent", f"{sent:,}" + (f" ({rp['not_sent']:,} not sent: time limit)"
                                         if rp["not_sent"] else "")],
        ["distinct usernames in the trace", f"{distinct:,} of {int(trace['users']):,}"],
        ["upstream requests received", f"{upstream:,}"],
        ["hits (Cache-Status `hit`)", f"{rp['hits']:,}"],
        ["hit ratio (hits / requests)", f"{rp['hit_ratio']:.4f} (at best {best:.4f})"],
        ["collapsed (Cache-Status `collapsed`)", f"{rp['collapsed']:,}"],
        ["`meta.cached` true in the body", f"{rp['cached_in_body']:,}"],
        ["answers without Cache-Status", f"{rp['no_cache_status']:,}"],
        ["non-200 answers", f"{rp['non200']:,}" + (f" ({rp['statuses']})" if rp["non200"] else "")],
        ["latency p50 / p99", f"{fmt_ms(rp['p50_us'])} / {fmt_ms(rp['p99_us'])}"],
        ["throughput (for information)", f"{fmt_rps(rp['rps'])} req/s over {rp['seconds']:.1f} s"],
    ]))
    out.append("")
    out.append(f"Trace: `bench/tools.py zipf-trace`, seed {trace['seed']}, Zipf s = {trace['s']}, "
               f"user0000.. by popularity (the most popular is {float(trace['top1_share']):.1%} "
               f"of the requests; {int(trace['seen_once']):,} usernames requested once), "
               f"sha256 {trace['sha256']}…. Replayed by `bench/replay.py` (Python threads, one "
               f"keep-alive connection each; the replayer caps the throughput). Upstream "
               f"requests: profile lines of the upstream's access log on its trace port. "
               "Cache-Status forms seen (parameters of socialgate's member, without ttl): "
               + (", ".join(f"`{form}` {n:,}" for form, n in rp["cache_status_forms"].items())
                  or "none") + ".")
    judge(upstream == distinct, f"Zipf trace: upstream requests {upstream:,}, distinct "
          f"keys {distinct:,} (must be equal)", f"Zipf trace: the upstream got {upstream:,} requests for "
          f"{distinct:,} distinct keys")
    judge(rp["non200"] == 0 and rp["not_sent"] == 0,
          f"Zipf trace: every answer 200 ({rp['non200']:,} not, {rp['not_sent']:,} not sent)",
          f"Zipf trace: {rp['non200']:,} answers were not 200, {rp['not_sent']:,} not sent")
    return targets


def state_report(out, res, meta, failures):
    """The shared-state scenario's table; returns the lines for the Targets
    list. Its targets (judged on the first appendfsync mode) are enforced
    when it ran."""
    title = "#### Shared state: one instance on `redis` vs the same on `local`"
    if meta.get("redis_mode") != "1":
        out += ["", title, "", "skipped (BENCH_REDIS=0)."]
        return ["- shared state: skipped (BENCH_REDIS=0)"]
    modes = meta.get("redis_fsync", "").split()
    out += ["", title, "",
            f"Both with a rate limit that never refuses and billing enforced with credits that "
            f"never run out, cache off: per request a redis instance makes a reservation (the "
            f"bucket and the credit together, in one script shared with the reservations "
            f"asked at the same moment) on Redis {meta.get('redis_version', '?')}, "
            f"plus a share of the settling batch every 0.1 s. Each redis instance has a "
            f"redis-server of its own, AOF on, `appendfsync` as named; all on the same cores "
            f"as the rest.", ""]
    rows, targets = [], []
    check_conns = int(meta["check_conns"])
    for conns in sorted(res.keys("state", "conns")):
        lo = res.get("state", "local", "profile", conns)
        if not lo:
            continue
        rows.append(["local", str(conns)] + cells(lo) + ["", ""])
        for i, mode in enumerate(modes):
            rd = res.get("state", f"redis-{mode}", "profile", conns)
            if not rd:
                continue
            ratio = rd["rps"] / lo["rps"] if lo["rps"] else float("nan")
            added = (rd["p50"] - lo["p50"]) / 1000
            rows.append([f"redis, appendfsync {mode}", str(conns)] + cells(rd)
                        + [f"{ratio:.2f}x", f"{added:+.2f} ms"])
            if rd["non2xx"] or lo["non2xx"]:
                failures.append(f"shared state {mode} @{conns}: non-2xx answers")
            if i > 0:
                continue
            if conns == check_conns:
                want = float(meta["redis_ratio"])
                ok = ratio >= want
                targets.append(f"- shared state @{conns} (appendfsync {mode}): redis/local "
                               f"throughput {ratio:.2f} (target >= {want:.2f}): "
                               f"{'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"redis ({mode}) throughput is {ratio:.2f}x local's, "
                                    f"under {want:.2f}x")
            if conns == 1:
                want = float(meta["redis_p50_ms"])
                ok = added < want
                targets.append(f"- shared state @1 (appendfsync {mode}): p50 added by redis "
                               f"{added:+.2f} ms (target < {want:.2f} ms): "
                               f"{'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"redis ({mode}) adds {added:.2f} ms to p50 at 1 "
                                    f"connection, over {want:.2f} ms")
    out.append(table(["instance", "connections", "req/s", "p50", "p99", "vs local req/s",
                      "p50 added"], rows))
    if not rows:
        failures.append("shared state: nothing measured")
    return targets


def build_text(meta):
    """How the socialgate measured was built."""
    if meta.get("pgo") != "1":
        return "release build"
    trained = f"{meta.get('pgo_train_seconds', '?')} s a request kind"
    if meta.get("bolt") == "1":
        version = meta.get("bolt_version") or "?"
        return (f"release build with profile-guided optimization, laid out again by BOLT "
                f"(LLVM {version}; both trained by bench/run.sh, {trained}; the plain release "
                f"build and the PGO build without BOLT are in the floor's table)")
    return (f"release build with profile-guided optimization (trained by bench/run.sh, "
            f"{trained}; the plain release build is in the floor's table)")


def floor_report(out, res, cpu_path, meta, notes):
    """The floor's table (informational: no target)."""
    title = "#### The floor: the stack without socialgate's work (`profile`)"
    if meta.get("floor_mode") != "1":
        out += ["", title, "", "skipped (BENCH_FLOOR=0)."]
        return
    conns = int(meta["check_conns"])
    # target, round -> (server ticks, upstream ticks, upstream wake-ups)
    used = {}
    if os.path.exists(cpu_path):
        with open(cpu_path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    target, rnd, *counts = line.rstrip("\n").split("\t")
                    used[(target, int(rnd))] = [int(c) for c in counts]
    clock = float(meta.get("clock_ticks") or 100)

    def per_request(target, column, scale, fmt):
        """Median over rounds of one cpu.tsv column per answered request."""
        per = [used[(target, r["round"])][column] * scale / r["requests"]
               for r in res.rows
               if (r["section"], r["target"]) == ("floor", target)
               and len(used.get((target, r["round"]), ())) > column and r["requests"]]
        return fmt.format(statistics.median(per)) if per else "-"

    def cpu_per_request(target, column):
        return per_request(target, column, 1e6 / clock, "{:.0f} µs")

    cores = int(meta["floor_cores"]) if meta.get("floor_cores", "").isdigit() else None

    def label(target):
        if target == "proxy":
            return "nginx proxy, 1 worker"
        if target == "socialgate":
            count = f"{cores + 1} threads" if cores else "its default threads"
            return f"socialgate, {count} (its default: one per core, and one more standing by)"
        if target == "socialgate-1w":
            return "socialgate, 1 thread (none standing by for its runaway defence)"
        if target == "socialgate-unbatched":
            return "socialgate, its default threads, each socket write its own system call"
        if target == "socialgate-plain":
            return "socialgate, its default threads, plain release build (no PGO)"
        if target == "socialgate-pgo":
            return "socialgate, its default threads, PGO build without BOLT"
        threads = int(target[len("floor-"):-1])
        text = f"floor, {threads} thread{'s' if threads > 1 else ''}"
        if cores and threads == cores + 1:
            text += " (socialgate's count)"
        elif cores and threads == cores and cores > 1:
            text += " (one per core)"
        return text

    proxy = res.get("floor", "proxy", "profile", conns)
    rows = []
    for target in res.keys("floor", "target"):
        m = res.get("floor", target, "profile", conns)
        if m is None:
            continue
        if m["non2xx"] or m["errors"]:
            notes.append(f"{target} profile @{conns} (floor): {m['non2xx']} non-2xx, "
                         f"{m['errors']} socket errors/timeouts")
        vs = (f"{m['rps'] / proxy['rps']:.2f}x", f"{m['p99'] / proxy['p99']:.1f}x") \
            if proxy and proxy["rps"] and proxy["p99"] else ("-", "-")
        rows.append([label(target)] + cells(m) + list(vs)
                    + [cpu_per_request(target, 0), cpu_per_request(target, 1),
                       per_request(target, 2, 1, "{:.2f}")])
    out += ["", title, "",
            f"bench/floor forwards each request with socialgate's runtime, HTTP server and "
            f"upstream client, and none of its work (no key, plugin, parse or log line). "
            f"Interleaved with the nginx proxy and socialgate at {conns} connections, same "
            f"rounds; CPU is the server process's user and system time over the run, per "
            f"request answered, and the upstream's is its nginx worker's over the same run; "
            f"its wake-ups are the times it went to sleep with nothing to do and was woken "
            f"(voluntary context switches), per request. For information; no target.", ""]
    out.append(table(["server", "req/s", "p50", "p99", "req/s vs proxy", "p99 vs proxy",
                      "CPU per request", "upstream CPU per request",
                      "upstream wake-ups per request"], rows))


def instructions_report(out, path, meta):
    """The instruction count's table (informational: no target)."""
    title = "#### User-space instructions per uncached `profile` request (callgrind)"
    if meta.get("instr_mode") != "1":
        out += ["", title, "", "skipped (BENCH_INSTRUCTIONS=0)."]
        return
    rows, per = [], {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                name, requests, total = line.rstrip("\n").split("\t")
                per[name] = int(total) / int(requests)
                label = {"socialgate": "socialgate", "proxy": "nginx proxy"}.get(name, name)
                rows.append([label, f"{int(requests):,}", f"{int(total):,}",
                             f"{per[name]:,.0f}"])
    out += ["", title, "",
            f"Each server run alone under {meta.get('instr_valgrind') or 'valgrind'} "
            f"`--tool=callgrind` (nginx with `master_process off`), counted from a zeroing to a "
            f"dump around `wrk -t1 -c4 -d{meta.get('instr_seconds', '?')}s`; the kernel's "
            f"share is not counted. Unlike the rates, the count does not move with the "
            f"machine's load.", ""]
    out.append(table(["server", "requests counted", "instructions", "per request"], rows))
    if "socialgate" in per and "proxy" in per:
        out += ["", f"socialgate / nginx proxy: {per['socialgate'] / per['proxy']:.2f}x the "
                    f"instructions per request (for information; no target)."]


def report(results_path, memory_path, meta_path):
    meta = {}
    with open(meta_path, encoding="utf-8") as f:
        for line in f:
            if "\t" in line:
                k, v = line.rstrip("\n").split("\t", 1)
                meta[k] = v
    memory = []
    if os.path.exists(memory_path):
        with open(memory_path, encoding="utf-8") as f:
            memory = [l.rstrip("\n").split("\t") for l in f if l.strip()]
    res = Results(results_path)
    target_ratio = float(meta["target_ratio"])
    p99_factor = float(meta["p99_factor"])
    check_conns = int(meta["check_conns"])
    out = []
    out.append(f"### socialgate vs nginx, {meta['date']}")
    out.append("")
    out.append(f"Cache: {CACHE_BUILD_TEXT.get(meta.get('cache_build'), '?')}")
    out.append("")
    out.append(f"{meta['machine']}; load average before the run {meta['load']}. All on 127.0.0.1, one shared upstream (nginx, 1 worker, "
               f"serving the contract's sample payloads). `wrk -t1 -cN -d{meta['seconds']}s "
               f"--latency`, median of {meta['rounds']} round(s), targets interleaved within "
               f"each round. socialgate: {build_text(meta)}, `{meta['commit']}`, log level "
               f"`{meta['log']}` written to a file; proxy: nginx 1 worker, upstream keepalive, "
               f"access log to a file.")
    out.append("")
    rows, failures, notes = [], [], []
    for endpoint in res.keys("main", "endpoint"):
        for conns in sorted({r["conns"] for r in res.rows
                             if r["section"] == "main" and r["endpoint"] == endpoint}):
            st = res.get("main", "static", endpoint, conns)
            px = res.get("main", "proxy", endpoint, conns)
            sg = res.get("main", "socialgate", endpoint, conns)
            ratio = sg["rps"] / px["rps"] if sg and px and px["rps"] else float("nan")
            rows.append([endpoint, str(conns)] + cells(st) + cells(px) + cells(sg)
                        + [f"{ratio:.2f}x"])
            for name, m in (("nginx static", st), ("nginx proxy", px), ("socialgate", sg)):
                if m and (m["non2xx"] or m["errors"]):
                    notes.append(f"{name} {endpoint} @{conns}: {m['non2xx']} non-2xx answers, "
                                 f"{m['errors']} socket errors/timeouts")
                    if m["non2xx"]:
                        failures.append(f"{name} {endpoint} @{conns} answered {m['non2xx']} "
                                        f"non-2xx during the measurement")
    out.append(table(["endpoint", "conns", "nginx static req/s", "p50", "p99",
                      "nginx proxy req/s", "p50", "p99", "socialgate req/s", "p50", "p99",
                      "socialgate/proxy"], rows))
    out.append("")
    out.append(f"Upstream paths: profile `/v1/user/profile?unique_id=lunabakes`, post "
               f"`/v1/aweme/detail?aweme_id=…`, comments `{meta['comments_upstream']}` "
               f"(socialgate's `comments?count={meta['comments_count']}` makes "
               f"{meta['comments_pages']} upstream requests: {meta['comments_sizes']}; "
               f"nginx rows fetch the first page only).")

    # Growth figures.
    if res.keys("growth", "conns"):
        out.append("")
        out.append("#### socialgate `profile` by connections")
        out.append("")
        grows = []
        for conns in sorted(res.keys("growth", "conns")):
            m = res.get("growth", "socialgate", "profile", conns)
            if m:
                grows.append([str(conns)] + cells(m))
                if m["non2xx"] or m["errors"]:
                    notes.append(f"socialgate profile @{conns} (growth): {m['non2xx']} non-2xx, "
                                 f"{m['errors']} socket errors/timeouts")
        out.append(table(["connections", "req/s", "p50", "p99"], grows))
        small = res.get("growth", "socialgate", "profile", check_conns)
        large = res.get("growth", "socialgate-keys", "profile", check_conns)
        if small and large:
            out.append("")
            out.append(f"#### socialgate `profile` by keys issued ({check_conns} connections)")
            out.append("")
            out.append(table(["keys", "req/s", "p50", "p99"], [
                [meta["keys_small"]] + cells(small),
                [f"{int(meta['keys_large']):,}"] + cells(large)]))
            kr = large["rps"] / small["rps"]
            out.append("")
            verdict = "met" if kr >= 0.9 else "MISSED (not enforced)"
            out.append(f"Throughput {int(meta['keys_large']):,} keys / {meta['keys_small']} keys: "
                       f"{kr:.2f} (target: within 10%, i.e. >= 0.90: {verdict}).")
    if memory:
        out.append("")
        out.append("#### socialgate memory (VmRSS of the server process)")
        out.append("")
        out.append(table(["state", "RSS"], [[label, fmt_kib(float(kib))] for label, kib in memory]))
    if meta.get("idle_note"):
        out.append("")
        out.append(meta["idle_note"])

    cache_failures = []
    cache_targets = cache_report(out, res, meta, cache_failures, notes)
    state_failures = []
    state_targets = state_report(out, res, meta, state_failures)
    floor_report(out, res, os.path.join(os.path.dirname(results_path), "cpu.tsv"), meta, notes)
    instructions_report(out, os.path.join(os.path.dirname(results_path), "instructions.tsv"),
                        meta)

    # The enforced targets.
    out.append("")
    out.append("#### Targets")
    out.append("")
    sg = res.get("main", "socialgate", "profile", check_conns)
    px = res.get("main", "proxy", "profile", check_conns)
    if not sg or not px:
        failures.append(f"profile at {check_conns} connections was not measured")
    else:
        ratio = sg["rps"] / px["rps"]
        ok = ratio >= target_ratio
        out.append(f"- profile @{check_conns}: socialgate/proxy throughput {ratio:.2f} "
                   f"(target >= {target_ratio:.2f}): {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(f"profile throughput at {check_conns} connections is {ratio:.2f}x "
                            f"the proxy's, under the target {target_ratio:.2f}x")
        limit = p99_factor * px["p99"]
        ok = sg["p99"] <= limit
        out.append(f"- profile @{check_conns}: socialgate p99 {fmt_ms(sg['p99'])} vs "
                   f"{p99_factor:g}x proxy p99 = {fmt_ms(limit)}: {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(f"profile p99 at {check_conns} connections is {fmt_ms(sg['p99'])}, "
                            f"over {p99_factor:g}x the proxy's ({fmt_ms(px['p99'])})")
    out += cache_targets
    failures += cache_failures
    out += state_targets
    failures += state_failures
    if notes:
        out.append("")
        out.append("Errors seen (⚠ non-2xx/socket errors in the tables):")
        out += [f"- {n}" for n in notes]
    text = "\n".join(out) + "\n"
    print(text)
    with open(os.path.join(os.path.dirname(results_path), "report.md"), "w",
              encoding="utf-8") as f:
        f.write(text)
    if failures:
        print("BENCHMARK FAILED:")
        for f_ in failures:
            print(f"  - {f_}")
        sys.exit(1)
    print("BENCHMARK PASSED: every enforced target met.")


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    commands = {"free-ports": free_ports, "comment-pages": comment_pages,
                "add-keys": add_keys, "zipf-trace": zipf_trace, "check": check, "check-hit": check_hit, "wrk-line": wrk_line, "report": report}
    if cmd not in commands:
        sys.exit(__doc__)
    commands[cmd](*args)


if __name__ == "__main__":
    main(sys.argv)
