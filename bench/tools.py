#!/usr/bin/env python3
"""Helpers for bench/run.sh (Python 3 standard library only).

Subcommands:
  free-ports N                  print N free TCP ports on 127.0.0.1
  comment-pages FIXTURE DOCROOT MAPFILE AWEME_ID COUNT
                                write the primary's P4 comment pages the plugin
                                asks for when a caller wants COUNT comments,
                                and the nginx `map` lines that pick them
  add-keys KEYSFILE N           append N random key records to a keys file
  check ENDPOINT BODYFILE [N]   check one socialgate answer (N: comments wanted)
  wrk-line FILE                 the BENCH line of a wrk run as tab-separated values
  report RESULTS MEMORY META    print the tables; exit 1 when a target is missed
"""

import base64
import datetime
import hashlib
import json
import os
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
    out.append(f"{meta['machine']}; load average before the run {meta['load']}. All on 127.0.0.1, one shared upstream (nginx, 1 worker, "
               f"serving the contract's sample payloads). `wrk -t1 -cN -d{meta['seconds']}s "
               f"--latency`, median of {meta['rounds']} round(s), targets interleaved within "
               f"each round. socialgate: release build, `{meta['commit']}`, log level "
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

    # The two enforced targets.
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
                "add-keys": add_keys, "check": check, "wrk-line": wrk_line, "report": report}
    if cmd not in commands:
        sys.exit(__doc__)
    commands[cmd](*args)


if __name__ == "__main__":
    main(sys.argv)
