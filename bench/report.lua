-- wrk script for bench/run.sh: defines only done(), so wrk's request path
-- stays the fast built-in one. Prints one machine-readable line with the
-- same figures wrk's own summary shows (latencies in microseconds).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH rps=%.2f p50_us=%d p99_us=%d requests=%d non2xx=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99),
    summary.requests, e.status, e.connect, e.read, e.write, e.timeout))
end
