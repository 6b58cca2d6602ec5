direct to stub (no proxy) c=1 1 KB: p50 8.09 ms, 126 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=1 32 KB: p50 12.03 ms, 76 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=1 256 KB: p50 15.23 ms, 69 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=32 1 KB: p50 544.28 ms, 39 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=32 32 KB: p50 482.48 ms, 41 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=32 256 KB: p50 581.19 ms, 37 req/s, cpu None ms/req, errors 0
Envoy round-robin c=1 1 KB: p50 6.17 ms, 100 req/s, cpu 1.0 ms/req, errors 0
Envoy round-robin c=1 32 KB: p50 6.58 ms, 147 req/s, cpu 1.0999999999999999 ms/req, errors 0
Envoy round-robin c=1 256 KB: p50 7.62 ms, 109 req/s, cpu 1.3 ms/req, errors 0
Envoy round-robin c=32 1 KB: p50 470.25 ms, 45 req/s, cpu 1.2333333333333334 ms/req, errors 0
Envoy round-robin c=32 32 KB: p50 367.00 ms, 53 req/s, cpu 1.2333333333333334 ms/req, errors 0
Envoy round-robin c=32 256 KB: p50 588.38 ms, 34 req/s, cpu 1.6333333333333333 ms/req, errors 0
Envoy + no-op ext_proc c=1 1 KB: p50 19.08 ms, 48 req/s, cpu 5.6 ms/req, errors 0
Envoy + no-op ext_proc c=1 32 KB: p50 12.80 ms, 73 req/s, cpu 4.6 ms/req, errors 0
Envoy + no-op ext_proc c=1 256 KB: p50 10.01 ms, 62 req/s, cpu 6.899999999999995 ms/req, errors 0
Envoy + no-op ext_proc c=32 1 KB: p50 288.51 ms, 66 req/s, cpu 4.466666666666669 ms/req, errors 0
Envoy + no-op ext_proc c=32 32 KB: p50 350.68 ms, 59 req/s, cpu 4.266666666666665 ms/req, errors 0
Envoy + no-op ext_proc c=32 256 KB: p50 559.34 ms, 38 req/s, cpu 6.899999999999999 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=1 1 KB: p50 9.85 ms, 98 req/s, cpu 7.999999999999997 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=1 32 KB: p50 11.24 ms, 72 req/s, cpu 8.500000000000002 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=1 256 KB: p50 23.19 ms, 38 req/s, cpu 16.2 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=32 1 KB: p50 381.06 ms, 50 req/s, cpu 7.700000000000002 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=32 32 KB: p50 487.52 ms, 46 req/s, cpu 10.133333333333331 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=32 256 KB: p50 607.80 ms, 31 req/s, cpu 16.066666666666666 ms/req, errors 0
headers only (trailers SKIP) c=8 1 KB: p50 155.83 ms, 35 req/s, cpu 4.8 ms/req, errors 0
headers + trailers (SEND) c=8 1 KB: p50 165.14 ms, 36 req/s, cpu 5.366666666666666 ms/req, errors 0
every body chunk (STREAMED) c=8 1 KB: p50 116.12 ms, 50 req/s, cpu 8.266666666666666 ms/req, errors 0
## Gateway overhead

Measured with `python -m bench.overhead_gateway --requests 100`: one stub pod answering at once (4 SSE tokens), a closed-loop
HTTP/1.1 client (Python, httpx) on the same 2-core machine; Envoy runs with `--concurrency 1`.
Added = this setup's latency minus direct-to-stub at the same concurrency and body size.
CPU = utime+stime of the gateway's processes (Envoy, ext_proc services) over the run, per request;
req/s per core = 1 s / that CPU (the client and the stub are not counted).
1-minute load average before/after: 10.0 / 9.9 (shared machine).

| setup | concurrency | body | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | gateway CPU ms/req | req/s per core | errors |
|---|---|---|---|---|---|---|---|---|---|---|
| direct to stub (no proxy) | 1 | 1 KB | 8.09 | 12.92 |  |  | 126 |  |  | 0 |
| direct to stub (no proxy) | 1 | 32 KB | 12.03 | 23.77 |  |  | 76 |  |  | 0 |
| direct to stub (no proxy) | 1 | 256 KB | 15.23 | 24.56 |  |  | 69 |  |  | 0 |
| direct to stub (no proxy) | 32 | 1 KB | 544.28 | 3565.61 |  |  | 39 |  |  | 0 |
| direct to stub (no proxy) | 32 | 32 KB | 482.48 | 3595.22 |  |  | 41 |  |  | 0 |
| direct to stub (no proxy) | 32 | 256 KB | 581.19 | 3643.23 |  |  | 37 |  |  | 0 |
| Envoy round-robin | 1 | 1 KB | 6.17 | 73.65 | -1.92 | +60.73 | 100 | 1.00 | 1,000 | 0 |
| Envoy round-robin | 1 | 32 KB | 6.58 | 12.94 | -5.45 | -10.83 | 147 | 1.10 | 909 | 0 |
| Envoy round-robin | 1 | 256 KB | 7.62 | 23.21 | -7.61 | -1.35 | 109 | 1.30 | 769 | 0 |
| Envoy round-robin | 32 | 1 KB | 470.25 | 2839.39 | -74.03 | -726.22 | 45 | 1.23 | 811 | 0 |
| Envoy round-robin | 32 | 32 KB | 367.00 | 2812.17 | -115.48 | -783.06 | 53 | 1.23 | 811 | 0 |
| Envoy round-robin | 32 | 256 KB | 588.38 | 4148.13 | +7.19 | +504.90 | 34 | 1.63 | 612 | 0 |
| Envoy + no-op ext_proc | 1 | 1 KB | 19.08 | 88.72 | +10.99 | +75.80 | 48 | 5.60 | 179 | 0 |
| Envoy + no-op ext_proc | 1 | 32 KB | 12.80 | 36.27 | +0.78 | +12.49 | 73 | 4.60 | 217 | 0 |
| Envoy + no-op ext_proc | 1 | 256 KB | 10.01 | 34.96 | -5.23 | +10.40 | 62 | 6.90 | 145 | 0 |
| Envoy + no-op ext_proc | 32 | 1 KB | 288.51 | 2201.34 | -255.76 | -1364.27 | 66 | 4.47 | 224 | 0 |
| Envoy + no-op ext_proc | 32 | 32 KB | 350.68 | 2240.22 | -131.80 | -1355.01 | 59 | 4.27 | 234 | 0 |
| Envoy + no-op ext_proc | 32 | 256 KB | 559.34 | 3521.27 | -21.84 | -121.96 | 38 | 6.90 | 145 | 0 |
| full gateway (Envoy + BBR + EPP) | 1 | 1 KB | 9.85 | 14.71 | +1.76 | +1.79 | 98 | 8.00 | 125 | 0 |
| full gateway (Envoy + BBR + EPP) | 1 | 32 KB | 11.24 | 69.49 | -0.78 | +45.72 | 72 | 8.50 | 118 | 0 |
| full gateway (Envoy + BBR + EPP) | 1 | 256 KB | 23.19 | 50.19 | +7.96 | +25.63 | 38 | 16.20 | 62 | 0 |
| full gateway (Envoy + BBR + EPP) | 32 | 1 KB | 381.06 | 2691.27 | -163.22 | -874.34 | 50 | 7.70 | 130 | 0 |
| full gateway (Envoy + BBR + EPP) | 32 | 32 KB | 487.52 | 3311.78 | +5.04 | -283.44 | 46 | 10.13 | 99 | 0 |
| full gateway (Envoy + BBR + EPP) | 32 | 256 KB | 607.80 | 4568.88 | +26.61 | +925.65 | 31 | 16.07 | 62 | 0 |

What the ext_proc sees of the response (Envoy + the no-op ext_proc, 200-token streamed
answers, 1 KB requests, concurrency 8). The EPP's pool routes ask for headers + trailers,
which holds the stream (the in-flight slot) to the response's end.

| ext_proc sees | requests | p50 ms | req/s | Envoy + ext_proc CPU ms/req (median, range) | errors |
|---|---|---|---|---|---|
| headers only (trailers SKIP) | 300 | 155.83 | 35 | 4.80 | 0 |
| headers + trailers (SEND) | 300 | 165.14 | 36 | 5.37 | 0 |
| every body chunk (STREAMED) | 300 | 116.12 | 50 | 8.27 | 0 |

