direct to stub (no proxy) c=1 1 KB: p50 13.71 ms, 73 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=1 32 KB: p50 11.90 ms, 79 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=1 256 KB: p50 12.89 ms, 75 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=32 1 KB: p50 574.76 ms, 41 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=32 32 KB: p50 260.74 ms, 70 req/s, cpu None ms/req, errors 0
direct to stub (no proxy) c=32 256 KB: p50 394.97 ms, 52 req/s, cpu None ms/req, errors 0
Envoy round-robin c=1 1 KB: p50 3.91 ms, 179 req/s, cpu 0.7 ms/req, errors 0
Envoy round-robin c=1 32 KB: p50 10.45 ms, 89 req/s, cpu 1.0 ms/req, errors 0
Envoy round-robin c=1 256 KB: p50 13.41 ms, 75 req/s, cpu 1.3 ms/req, errors 0
Envoy round-robin c=32 1 KB: p50 468.15 ms, 40 req/s, cpu 1.2666666666666666 ms/req, errors 0
Envoy round-robin c=32 32 KB: p50 484.07 ms, 41 req/s, cpu 1.2666666666666664 ms/req, errors 0
Envoy round-robin c=32 256 KB: p50 320.37 ms, 56 req/s, cpu 1.4333333333333338 ms/req, errors 0
Envoy + no-op ext_proc c=1 1 KB: p50 8.54 ms, 85 req/s, cpu 3.9000000000000012 ms/req, errors 0
Envoy + no-op ext_proc c=1 32 KB: p50 8.11 ms, 91 req/s, cpu 3.399999999999999 ms/req, errors 0
Envoy + no-op ext_proc c=1 256 KB: p50 10.28 ms, 87 req/s, cpu 5.500000000000003 ms/req, errors 0
Envoy + no-op ext_proc c=32 1 KB: p50 311.25 ms, 67 req/s, cpu 4.499999999999998 ms/req, errors 0
Envoy + no-op ext_proc c=32 32 KB: p50 382.10 ms, 54 req/s, cpu 5.166666666666666 ms/req, errors 0
Envoy + no-op ext_proc c=32 256 KB: p50 388.12 ms, 47 req/s, cpu 6.599999999999999 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=1 1 KB: p50 14.54 ms, 43 req/s, cpu 8.500000000000002 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=1 32 KB: p50 12.18 ms, 77 req/s, cpu 7.9 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=1 256 KB: p50 19.57 ms, 42 req/s, cpu 14.2 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=32 1 KB: p50 402.90 ms, 40 req/s, cpu 6.299999999999999 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=32 32 KB: p50 379.66 ms, 56 req/s, cpu 7.06666666666667 ms/req, errors 0
full gateway (Envoy + BBR + EPP) c=32 256 KB: p50 1086.68 ms, 24 req/s, cpu 13.166666666666664 ms/req, errors 0
headers only (trailers SKIP) c=8 1 KB: p50 126.55 ms, 56 req/s, cpu 4.499999999999999 ms/req, errors 0
headers + trailers (SEND) c=8 1 KB: p50 108.33 ms, 69 req/s, cpu 4.366666666666666 ms/req, errors 0
every body chunk (STREAMED) c=8 1 KB: p50 130.27 ms, 56 req/s, cpu 6.766666666666665 ms/req, errors 0
## Gateway overhead

Measured with `python -m bench.overhead_gateway --requests 100`: one stub pod answering at once (4 SSE tokens), a closed-loop
HTTP/1.1 client (Python, httpx) on the same 2-core machine; Envoy runs with `--concurrency 1`.
Added = this setup's latency minus direct-to-stub at the same concurrency and body size.
CPU = utime+stime of the gateway's processes (Envoy, ext_proc services) over the run, per request;
req/s per core = 1 s / that CPU (the client and the stub are not counted).
1-minute load average before/after: 8.6 / 10.0 (shared machine).

| setup | concurrency | body | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | gateway CPU ms/req | req/s per core | errors |
|---|---|---|---|---|---|---|---|---|---|---|
| direct to stub (no proxy) | 1 | 1 KB | 13.71 | 23.93 |  |  | 73 |  |  | 0 |
| direct to stub (no proxy) | 1 | 32 KB | 11.90 | 24.24 |  |  | 79 |  |  | 0 |
| direct to stub (no proxy) | 1 | 256 KB | 12.89 | 24.56 |  |  | 75 |  |  | 0 |
| direct to stub (no proxy) | 32 | 1 KB | 574.76 | 3986.09 |  |  | 41 |  |  | 0 |
| direct to stub (no proxy) | 32 | 32 KB | 260.74 | 2139.98 |  |  | 70 |  |  | 0 |
| direct to stub (no proxy) | 32 | 256 KB | 394.97 | 2506.36 |  |  | 52 |  |  | 0 |
| Envoy round-robin | 1 | 1 KB | 3.91 | 15.42 | -9.81 | -8.52 | 179 | 0.70 | 1,429 | 0 |
| Envoy round-robin | 1 | 32 KB | 10.45 | 18.56 | -1.45 | -5.67 | 89 | 1.00 | 1,000 | 0 |
| Envoy round-robin | 1 | 256 KB | 13.41 | 21.93 | +0.52 | -2.64 | 75 | 1.30 | 769 | 0 |
| Envoy round-robin | 32 | 1 KB | 468.15 | 3708.93 | -106.61 | -277.16 | 40 | 1.27 | 789 | 0 |
| Envoy round-robin | 32 | 32 KB | 484.07 | 2806.19 | +223.32 | +666.21 | 41 | 1.27 | 789 | 0 |
| Envoy round-robin | 32 | 256 KB | 320.37 | 2597.20 | -74.60 | +90.84 | 56 | 1.43 | 698 | 0 |
| Envoy + no-op ext_proc | 1 | 1 KB | 8.54 | 42.18 | -5.18 | +18.25 | 85 | 3.90 | 256 | 0 |
| Envoy + no-op ext_proc | 1 | 32 KB | 8.11 | 43.81 | -3.79 | +19.57 | 91 | 3.40 | 294 | 0 |
| Envoy + no-op ext_proc | 1 | 256 KB | 10.28 | 21.86 | -2.61 | -2.70 | 87 | 5.50 | 182 | 0 |
| Envoy + no-op ext_proc | 32 | 1 KB | 311.25 | 1765.53 | -263.51 | -2220.56 | 67 | 4.50 | 222 | 0 |
| Envoy + no-op ext_proc | 32 | 32 KB | 382.10 | 2265.62 | +121.36 | +125.63 | 54 | 5.17 | 194 | 0 |
| Envoy + no-op ext_proc | 32 | 256 KB | 388.12 | 3417.47 | -6.86 | +911.11 | 47 | 6.60 | 152 | 0 |
| full gateway (Envoy + BBR + EPP) | 1 | 1 KB | 14.54 | 101.42 | +0.83 | +77.49 | 43 | 8.50 | 118 | 0 |
| full gateway (Envoy + BBR + EPP) | 1 | 32 KB | 12.18 | 23.71 | +0.28 | -0.53 | 77 | 7.90 | 127 | 0 |
| full gateway (Envoy + BBR + EPP) | 1 | 256 KB | 19.57 | 78.65 | +6.68 | +54.09 | 42 | 14.20 | 70 | 0 |
| full gateway (Envoy + BBR + EPP) | 32 | 1 KB | 402.90 | 4279.41 | -171.86 | +293.32 | 40 | 6.30 | 159 | 0 |
| full gateway (Envoy + BBR + EPP) | 32 | 32 KB | 379.66 | 2594.54 | +118.91 | +454.56 | 56 | 7.07 | 142 | 0 |
| full gateway (Envoy + BBR + EPP) | 32 | 256 KB | 1086.68 | 4902.26 | +691.71 | +2395.89 | 24 | 13.17 | 76 | 0 |

What the ext_proc sees of the response (Envoy + the no-op ext_proc, 200-token streamed
answers, 1 KB requests, concurrency 8). The EPP's pool routes ask for headers + trailers,
which holds the stream (the in-flight slot) to the response's end.

| ext_proc sees | requests | p50 ms | req/s | Envoy + ext_proc CPU ms/req (median, range) | errors |
|---|---|---|---|---|---|
| headers only (trailers SKIP) | 300 | 126.55 | 56 | 4.50 | 0 |
| headers + trailers (SEND) | 300 | 108.33 | 69 | 4.37 | 0 |
| every body chunk (STREAMED) | 300 | 130.27 | 56 | 6.77 | 0 |

