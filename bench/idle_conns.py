#!/usr/bin/env python3
"""Opens N keep-alive connections to an HTTP/1.1 server and holds them idle.

On each connection it sends one valid keep-alive request (`GET /healthz` by
default) and reads the whole answer, so the server has accepted, served and
is now keeping the connection for a next request. Then it prints

    OPEN ok=N failed=F seconds=T

and holds every connection until RELEASE_FILE exists (or --max-hold seconds
pass), so the caller can read the server's memory meanwhile. Last it counts
how many connections the server closed during the hold:

    STILL_OPEN n=M of=N

Exit status 0 only when all N were opened and all were still open.
Standard library only; raises its own RLIMIT_NOFILE as far as allowed.

usage: idle_conns.py HOST PORT N RELEASE_FILE [--max-hold S] [--path P]
"""

import argparse
import os
import resource
import select
import socket
import sys
import time

BATCH = 250  # connections in flight while opening


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 64
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return soft


def read_answer(sock):
    """Reads one HTTP/1.1 answer with a Content-Length body; returns
    (status, keeps_alive)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the answer's head")
        data += chunk
        if len(data) > 65536:
            raise ConnectionError("answer head too large")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    return status, headers.get("connection") != "close"


def main():
    p = argparse.ArgumentParser(usage=__doc__)
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("count", type=int)
    p.add_argument("release_file")
    p.add_argument("--max-hold", type=float, default=120.0)
    p.add_argument("--path", default="/healthz")
    a = p.parse_args()

    limit = raise_nofile(a.count)
    if limit < a.count + 16:
        print(f"RLIMIT_NOFILE is {limit}: cannot hold {a.count} connections", file=sys.stderr)
    request = (f"GET {a.path} HTTP/1.1\r\nHost: {a.host}:{a.port}\r\n"
               f"Connection: keep-alive\r\n\r\n").encode()

    held, failed, first_error = [], 0, None
    started = time.monotonic()
    # Batches: connect and send a batch, then read its answers; bounded by count.
    for start in range(0, a.count, BATCH):
        batch = []
        for _ in range(min(BATCH, a.count - start)):
            try:
                s = socket.create_connection((a.host, a.port), timeout=10)
                s.sendall(request)
                batch.append(s)
            except OSError as e:
                failed += 1
                first_error = first_error or repr(e)
        for s in batch:
            try:
                status, keep = read_answer(s)
                if status != 200 or not keep:
                    raise ConnectionError(f"status {status}, keep-alive {keep}")
                held.append(s)
            except (OSError, ValueError, IndexError) as e:
                failed += 1
                first_error = first_error or repr(e)
                s.close()
    took = time.monotonic() - started
    print(f"OPEN ok={len(held)} failed={failed} seconds={took:.1f}"
          + (f" first_error={first_error}" if first_error else ""), flush=True)

    deadline = time.monotonic() + a.max_hold
    while not os.path.exists(a.release_file) and time.monotonic() < deadline:
        time.sleep(0.1)

    # An idle connection that polls readable has been closed by the server
    # (or got unasked-for bytes): either way it is no longer held.
    poller = select.poll()
    for s in held:
        poller.register(s.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
    closed = {fd for fd, _ in poller.poll(0)}
    still = len(held) - len(closed)
    print(f"STILL_OPEN n={still} of={a.count}", flush=True)
    for s in held:
        s.close()
    sys.exit(0 if still == a.count else 1)


if __name__ == "__main__":
    main()
