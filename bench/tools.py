#!/usr/bin/env python3
"""Helpers for bench/run.sh (Python 3 standard library only).

Subcommands:
  free-ports N                  print N free TCP ports on 127.0.0.1
  add-keys KEYSFILE N           append N random key records to a keys file
  check BODYFILE                check a socialgate `profile` answer
  check-hit HEADERS BODYFILE    exit 0 when a socialgate answer came from its
                                cache (Cache-Status `hit`, meta.cached true)
  wrk-line FILE                 the BENCH line of a wrk run as tab-separated values
  report RESULTS META OUT       print the report, write it to OUT; exit 1 when
                                a floor is missed
"""

import base64
import datetime
import hashlib
import json
import secrets
import socket
import statistics
import sys


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


def check(bodyfile):
    with open(bodyfile, encoding="utf-8") as f:
        body = json.load(f)
    username = (body.get("data") or {}).get("username")
    if body.get("success") is not True or username != "lunabakes":
        sys.exit(f"profile: unexpected answer: {json.dumps(body)[:300]}")


def check_hit(headers_file, bodyfile):
    """A hit is both: the `Cache-Status` header's last member (RFC 9211) has
    the bare `hit` parameter, e.g. `socialgate; hit; ttl=297`, and the body's
    `meta.cached` is JSON true."""
    value = None
    with open(headers_file, encoding="utf-8", errors="replace") as f:
        for line in f:
            name, sep, v = line.partition(":")
            if sep and name.strip().lower() == "cache-status":
                value = v.strip()
    last = (value or "").split(",")[-1]
    hit = "hit" in [p.strip().lower() for p in last.split(";")[1:]]
    with open(bodyfile, encoding="utf-8") as f:
        cached = (json.load(f).get("meta") or {}).get("cached")
    if not (hit and cached is True):
        sys.exit(f"not a hit: Cache-Status: {value}; meta.cached: {json.dumps(cached)}")


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

# The floors of issue 48 (bench/README.md, "Floors").
REAL_RPS = 0.97        # realistic: socialgate / nginx req/s, at least
REAL_P99 = 1.05        # realistic: socialgate / nginx p99, at most
REAL_KB_PER_CONN = 40  # realistic: (RSS under load - idle) / connections, at most
SYNTH_UNCACHED = 0.75  # uncached profile / nginx proxy, at least
SYNTH_CACHED = 2.0     # cached profile / nginx proxy_cache, at least
SYNTH_KEYS = 0.90      # 100,000 keys / 10 keys, at least (within 10%)
# With BENCH_BEFORE: this build / the build before, uncached and cached, at
# least (within 10%); issue 49's floor, informational unless BENCH_BEFORE_FLOOR=1.
BEFORE_MIN = 0.90


def fmt_ms(us):
    return f"{us / 1000:.2f} ms" if us < 100_000 else f"{us / 1000:.0f} ms"


def fmt_mib(kib):
    return f"{kib / 1024:.1f} MiB"


def load_results(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            (section, target, conns, rnd, rps, p50, p99, _reqs, non2xx, errs, idle,
             peak) = line.rstrip("\n").split("\t")
            rows.append(dict(section=section, target=target, conns=int(conns), round=int(rnd),
                             rps=float(rps), p50=float(p50), p99=float(p99),
                             non2xx=int(non2xx), errors=int(errs),
                             idle=None if idle == "-" else int(idle), peak=int(peak)))
    return rows


def median(rows, section, target, conns=None):
    """Each figure the median of its rounds on its own; errors summed."""
    rs = [r for r in rows if r["section"] == section and r["target"] == target
          and (conns is None or r["conns"] == conns)]
    if not rs:
        return None
    m = {k: statistics.median(r[k] for r in rs) for k in ("rps", "p50", "p99", "peak")}
    m.update(conns=rs[0]["conns"], non2xx=sum(r["non2xx"] for r in rs),
             errors=sum(r["errors"] for r in rs))
    if all(r["idle"] is not None for r in rs):
        m["idle"] = statistics.median(r["idle"] for r in rs)
        m["per_conn"] = statistics.median((r["peak"] - r["idle"]) / r["conns"] for r in rs)
    return m


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def report(results_path, meta_path, out_path):
    meta = {}
    with open(meta_path, encoding="utf-8") as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("\t")
            meta[k] = v
    rows = load_results(results_path)
    out, floors, failures, notes = [], [], [], []

    def rps(m):
        flag = f" ⚠{m['non2xx']}/{m['errors']}" if m["non2xx"] or m["errors"] else ""
        return f"{m['rps']:,.0f}{flag}"

    def floor(ok, text, binding=True):
        verdict = "ok" if ok else "MISSED" if binding else "missed (for information)"
        floors.append(f"- {text}: {verdict}")
        if not ok and binding:
            failures.append(text)

    def errors(name, m):
        if m["non2xx"] or m["errors"]:
            notes.append(f"- {name}: {m['non2xx']} non-2xx answers, {m['errors']} socket "
                         "errors or timeouts")
        if m["non2xx"]:
            failures.append(f"{name} answered {m['non2xx']} non-2xx during the measurement")

    out.append(f"### socialgate vs nginx, {meta['date']}")
    out.append("")
    out.append(f"{meta['machine']}; {meta['tools']}; load average before the run "
               f"{meta['load']}. socialgate `{meta['commit']}`, plain `cargo build --release`, "
               f"`SOCIALGATE_LOG={meta['log']}` to a file; nginx 1 worker, access log to a "
               f"file. All on 127.0.0.1: `wrk -t1 -cN -d{meta['seconds']}s --latency` after "
               f"{meta['warmup']} s of warm-up, median of {meta['rounds']} interleaved "
               "round(s), each figure on its own.")
    before = meta.get("before")
    if before:
        out.append("")
        out.append(f"socialgate (before): `{before}`, built the same way in a worktree and a "
                   "target dir of its own, with its own plugins and the same configurations, "
                   "measured in the same rounds.")

    conns_seen = sorted({r["conns"] for r in rows if r["section"] == "realistic"})
    if conns_seen:
        out += ["", f"#### Realistic: the upstream answers after {meta['delay']} s", "",
                "socialgate with its cache off against nginx `proxy_pass`, to the same "
                "upstream; each measurement on a fresh server. RSS: of the process (nginx: "
                "master and worker), idle before the load and the largest sample under "
                "it; per connection: (under load - idle) / connections, in kB as `/proc` "
                "gives it (1,024 bytes).", ""]
        trs = []
        for c in conns_seen:
            sg = median(rows, "realistic", "socialgate", c)
            ng = median(rows, "realistic", "nginx", c)
            if not sg or not ng:
                failures.append(f"realistic at {c:,} connections: not measured for both")
                continue
            errors(f"realistic socialgate @{c:,}", sg)
            errors(f"realistic nginx @{c:,}", ng)
            rr, pr = sg["rps"] / ng["rps"], sg["p99"] / ng["p99"]
            trs.append([f"{c:,}", rps(sg), fmt_ms(sg["p50"]), fmt_ms(sg["p99"]), rps(ng),
                        fmt_ms(ng["p50"]), fmt_ms(ng["p99"]), f"{rr:.2f}x", f"{pr:.2f}x",
                        f"{fmt_mib(sg['idle'])} / {fmt_mib(sg['peak'])}",
                        f"{sg['per_conn']:.1f} kB",
                        f"{fmt_mib(ng['idle'])} / {fmt_mib(ng['peak'])}"])
            floor(rr >= REAL_RPS, f"realistic @{c:,}: throughput {rr:.2f}x nginx's "
                  f"(at least {REAL_RPS})")
            floor(pr <= REAL_P99, f"realistic @{c:,}: p99 {pr:.2f}x nginx's (at most {REAL_P99})")
            floor(sg["per_conn"] <= REAL_KB_PER_CONN,
                  f"realistic @{c:,}: (RSS under load - idle) / connections "
                  f"{sg['per_conn']:.1f} kB (at most {REAL_KB_PER_CONN})")
        out.append(table(["connections", "socialgate req/s", "p50", "p99", "nginx req/s", "p50",
                          "p99", "req/s ratio", "p99 ratio", "socialgate RSS idle / load",
                          "per connection", "nginx RSS idle / load"], trs))
        brs = []
        for c in conns_seen:
            sg, bf = (median(rows, "realistic", t, c) for t in ("socialgate", "socialgate-before"))
            ng = median(rows, "realistic", "nginx", c)
            if not sg or not bf or not ng:
                continue
            errors(f"realistic socialgate (before) @{c:,}", bf)
            brs.append([f"{c:,}", rps(bf), fmt_ms(bf["p50"]), fmt_ms(bf["p99"]),
                        f"{bf['rps'] / ng['rps']:.2f}x", f"{bf['p99'] / ng['p99']:.2f}x",
                        f"{fmt_mib(bf['idle'])} / {fmt_mib(bf['peak'])}",
                        f"{bf['per_conn']:.1f} kB", f"{sg['rps'] / bf['rps']:.2f}x",
                        f"{sg['per_conn'] - bf['per_conn']:+.1f} kB"])
        if brs:
            out += ["", f"socialgate (before), `{before}`, in the same rounds; ratios to the "
                    "same nginx, and this build against it:", ""]
            out.append(table(["connections", "socialgate (before) req/s", "p50", "p99",
                              "req/s ratio", "p99 ratio", "RSS idle / load", "per connection",
                              "req/s after / before", "per connection after - before"], brs))

    synth = [("uncached `profile`", "synthetic", "socialgate", "nginx proxy", "proxy",
              SYNTH_UNCACHED, "uncached `profile` / nginx proxy"),
             ("cached `profile`", "synthetic", "socialgate-cached", "nginx proxy_cache",
              "proxy-cache", SYNTH_CACHED, "cached `profile` / nginx proxy_cache"),
             ("cached `profile`", "synthetic", "socialgate-cached", "nginx, the file", "static",
              None, None),
             (f"{int(meta['keys_large']):,} keys issued", "synthetic", "socialgate-100k-keys",
              f"socialgate, {meta['keys_small']} keys", "socialgate", SYNTH_KEYS,
              f"{int(meta['keys_large']):,} keys / {meta['keys_small']} keys"),
             ("rate limit and billing on Redis", "redis", "redis-state", "the same, local state",
              "local-state", None, None),
             # With BENCH_BEFORE: the build before against the same references, then
             # this build against it.
             ("uncached `profile`, socialgate (before)", "synthetic", "socialgate-before",
              "nginx proxy", "proxy", None, None),
             ("cached `profile`, socialgate (before)", "synthetic", "socialgate-cached-before",
              "nginx proxy_cache", "proxy-cache", None, None),
             ("uncached `profile`", "synthetic", "socialgate", "socialgate (before)",
              "socialgate-before", BEFORE_MIN, "uncached `profile` / the build before"),
             ("cached `profile`", "synthetic", "socialgate-cached", "socialgate (before)",
              "socialgate-cached-before", BEFORE_MIN, "cached `profile` / the build before")]
    srs = []
    for label, section, target, ref_label, ref, least, what in synth:
        sg, ref_m = median(rows, section, target), median(rows, section, ref)
        if not sg or not ref_m:
            continue
        errors(f"{section} {target}", sg)
        errors(f"{section} {ref}", ref_m)
        ratio = sg["rps"] / ref_m["rps"]
        srs.append([label, f"{sg['conns']:,}", rps(sg), fmt_ms(sg["p50"]), fmt_ms(sg["p99"]),
                    ref_label, rps(ref_m), fmt_ms(ref_m["p50"]), fmt_ms(ref_m["p99"]),
                    f"{ratio:.2f}x", fmt_mib(sg["peak"])])
        if ref.endswith("-before"):
            floor(ratio >= least, f"{what}: {ratio:.2f}x (within 10% of the build before: "
                  f"at least {least}; issue 49)", binding=meta.get("before_floor") == "1")
        elif least is not None:
            floor(ratio >= least, f"{what}: {ratio:.2f}x (at least {least})")
    if srs:
        out += ["", "#### Synthetic (CPU efficiency): the upstream answers at once", "",
                "socialgate and the reference each on its long-lived server; the ratio is "
                "of req/s. The upstream is an nginx serving the fixture's profile; "
                f"proxy_cache answered {meta['pcache'] or '?'}.", ""]
        out.append(table(["scenario", "connections", "socialgate req/s", "p50", "p99",
                          "reference", "req/s", "p50", "p99", "ratio",
                          "socialgate RSS under load"], srs))

    heading = "issue 48, and issue 49's against the build before" if before else "issue 48"
    out += ["", f"#### Floors ({heading})", ""] + (floors or ["- none measured"])
    # A target can be in several rows (as measured and as reference).
    notes, failures = list(dict.fromkeys(notes)), list(dict.fromkeys(failures))
    if notes:
        out += ["", "Errors (⚠ non-2xx/socket errors in the tables):"] + notes
    text = "\n".join(out) + "\n"
    print(text)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(text)
    if failures:
        print("FLOORS MISSED:")
        for f_ in failures:
            print(f"  - {f_}")
        sys.exit(1)
    print("FLOORS HOLD: every floor measured is met.")


def main(argv):
    commands = {"free-ports": free_ports, "add-keys": add_keys, "check": check,
                "check-hit": check_hit, "wrk-line": wrk_line, "report": report}
    if len(argv) < 2 or argv[1] not in commands:
        sys.exit(__doc__)
    commands[argv[1]](*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
