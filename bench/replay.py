#!/usr/bin/env python3
"""Replays a request trace against socialgate, exactly once through.

    replay.py HOST PORT KEY TRACE OUT_JSON [--conns 32] [--timeout 10]
              [--max-seconds 600] [--path '/v1/shortvideo/profile?username={}']

TRACE has one username a line; request i asks for PATH with line i. CONNS
threads each hold one keep-alive `http.client.HTTPConnection` and take the
next request from a shared index, so every request is sent once and at most
CONNS are in flight. Each answer's status, `Cache-Status` header (RFC 9211),
body `meta.cached` and latency (send to last body byte) are recorded.

Prints one line `REPLAY key=value ...` and writes the summary to OUT_JSON.
Bounded: a request that fails is recorded (status 0) and not retried; the
replay stops taking requests after --max-seconds. Python standard library
only; with the GIL the replayer itself caps the throughput (a few thousand
requests a second), which is why that figure is for information only.
"""

import argparse
import http.client
import json
import math
import sys
import threading
import time
import urllib.parse


def parse_cache_status(value):
    """RFC 9211: a list of `cache-name; param; param=value` members, the
    outermost cache last. Returns the params of the last member as a dict
    (bare params map to True), or None when the header is absent."""
    if value is None:
        return None
    members = [m.strip() for m in value.split(",") if m.strip()]
    if not members:
        return {}
    params = {}
    for part in members[-1].split(";")[1:]:
        part = part.strip()
        if not part:
            continue
        k, sep, v = part.partition("=")
        params[k.strip().lower()] = v.strip().strip('"') if sep else True
    return params


class Replay:
    def __init__(self, args, names):
        self.args = args
        self.names = names
        self.next = 0
        self.lock = threading.Lock()
        self.deadline = time.monotonic() + args.max_seconds
        n = len(names)
        # Per request, filled by whichever thread sent it.
        self.status = [None] * n
        self.latency_us = [None] * n
        self.cache_status = [None] * n
        self.cached = [None] * n
        self.errors = []

    def take(self):
        with self.lock:
            if self.next >= len(self.names) or time.monotonic() > self.deadline:
                return None
            i = self.next
            self.next += 1
            return i

    def connect(self):
        return http.client.HTTPConnection(self.args.host, self.args.port,
                                          timeout=self.args.timeout)

    def worker(self):
        conn = self.connect()
        headers = {"X-API-Key": self.args.key}
        try:
            while True:
                i = self.take()
                if i is None:
                    return
                path = self.args.path.format(urllib.parse.quote(self.names[i], safe=""))
                t0 = time.perf_counter()
                try:
                    conn.request("GET", path, headers=headers)
                    resp = conn.getresponse()
                    body = resp.read()
                except (OSError, http.client.HTTPException) as e:
                    # Recorded, not retried: the next request gets a new connection.
                    self.status[i] = 0
                    with self.lock:
                        if len(self.errors) < 20:
                            self.errors.append(f"request {i} ({self.names[i]}): {e!r}")
                    conn.close()
                    conn = self.connect()
                    continue
                self.latency_us[i] = (time.perf_counter() - t0) * 1e6
                self.status[i] = resp.status
                self.cache_status[i] = resp.getheader("Cache-Status")
                try:
                    self.cached[i] = json.loads(body).get("meta", {}).get("cached") is True
                except (ValueError, AttributeError):
                    self.cached[i] = False
                if resp.will_close:
                    conn.close()
                    conn = self.connect()
        finally:
            conn.close()

    def run(self):
        threads = [threading.Thread(target=self.worker, daemon=True)
                   for _ in range(self.args.conns)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            # Bounded: every request has its own timeout, and take() stops
            # handing out work after the deadline.
            t.join(self.args.max_seconds + 2 * self.args.timeout + 5)
        self.seconds = time.perf_counter() - t0
        self.stuck = sum(t.is_alive() for t in threads)


def percentile(sorted_values, p):
    """Nearest rank."""
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def summarize(r):
    sent = [i for i, s in enumerate(r.status) if s is not None]
    statuses = {}
    for i in sent:
        statuses[str(r.status[i])] = statuses.get(str(r.status[i]), 0) + 1
    hits = collapsed = stored = no_header = cached_body = 0
    fwd = {}
    forms = {}
    for i in sent:
        raw = r.cache_status[i]
        params = parse_cache_status(raw)
        if params is None:
            no_header += 1
            continue
        # A compact form of the header without the changing ttl, to show
        # which kinds of answers came back.
        form = "; ".join(k if v is True else f"{k}={v}" for k, v in params.items() if k != "ttl")
        forms[form] = forms.get(form, 0) + 1
        hits += params.get("hit") is True
        collapsed += params.get("collapsed") is True
        stored += params.get("stored") is True
        if "fwd" in params:
            fwd[str(params["fwd"])] = fwd.get(str(params["fwd"]), 0) + 1
    cached_body = sum(1 for i in sent if r.cached[i])
    lat = sorted(v for v in r.latency_us if v is not None)
    n = len(sent)
    return {
        "requests": len(r.names),
        "sent": n,
        "distinct": len(set(r.names)),
        "seconds": round(r.seconds, 3),
        "rps": round(n / r.seconds, 1) if r.seconds else 0.0,
        "statuses": statuses,
        "non200": n - statuses.get("200", 0),
        "not_sent": len(r.names) - n,
        "hits": hits,
        "hit_ratio": round(hits / n, 4) if n else 0.0,
        "collapsed": collapsed,
        "stored": stored,
        "fwd": fwd,
        "no_cache_status": no_header,
        "cached_in_body": cached_body,
        "cache_status_forms": dict(sorted(forms.items(), key=lambda kv: -kv[1])[:10]),
        "p50_us": round(percentile(lat, 50)),
        "p99_us": round(percentile(lat, 99)),
        "max_us": round(lat[-1]) if lat else 0,
        "conns": r.args.conns,
        "stuck_threads": r.stuck,
        "errors": r.errors,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("key")
    ap.add_argument("trace")
    ap.add_argument("out_json")
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--path", default="/v1/shortvideo/profile?username={}")
    args = ap.parse_args()
    with open(args.trace, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()]
    if not names or args.conns < 1:
        sys.exit("replay.py: empty trace or no connections")
    r = Replay(args, names)
    r.run()
    s = summarize(r)
    with open(args.out_json, "w", encoding="utf-8") as f:
        json.dump(s, f, indent=1)
        f.write("\n")
    print("REPLAY " + " ".join(f"{k}={s[k]}" for k in (
        "sent", "distinct", "non200", "not_sent", "hits", "collapsed", "stored",
        "no_cache_status", "cached_in_body", "rps", "p50_us", "p99_us", "seconds")))
    for e in s["errors"]:
        print(f"  error: {e}", file=sys.stderr)
    # Exit 0 whenever the replay ran: the caller judges the figures.
    return 0


if __name__ == "__main__":
    sys.exit(main())
