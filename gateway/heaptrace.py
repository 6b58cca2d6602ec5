"""Opt-in tracemalloc sampling for a long-running service, to tell a Python leak from
allocator growth: if traced bytes stay flat while RSS grows, the growth is outside the
Python heap (glibc arenas, gRPC core), not an object something keeps.

Off unless `--tracemalloc-dir` (or `GATEWAY_TRACEMALLOC_DIR`, which launched children
inherit) is given; off, nothing is started and tracemalloc is not imported. On, tracing
starts at once and a daemon thread appends one JSON line per sample to
`<dir>/<prog>-<pid>.jsonl`: a baseline after `warmup_s`, then one every `interval_s`, and a
final one at shutdown. Each line holds RSS (anonymous / file-backed), traced bytes, tracemalloc's own overhead and the
top allocation sites by growth since the baseline (by size at the baseline itself), plus
glibc's malloc totals, which see what tracemalloc cannot (memory C extensions allocate).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tracemalloc

ENV_DIR = "GATEWAY_TRACEMALLOC_DIR"
ENV_INTERVAL = "GATEWAY_TRACEMALLOC_INTERVAL_S"
ENV_WARMUP = "GATEWAY_TRACEMALLOC_WARMUP_S"
ENV_PROGS = "GATEWAY_TRACEMALLOC_PROGS"  # comma-separated: which services the env turns on
TOP_N = 15


def add_tracemalloc_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(tracemalloc_prog=parser.prog)
    progs = os.environ.get(ENV_PROGS)
    wanted = progs is None or parser.prog in progs.split(",")
    group = parser.add_argument_group("heap tracing (diagnostics; off by default)")
    group.add_argument(
        "--tracemalloc-dir",
        type=Path,
        default=(os.environ.get(ENV_DIR) or None) if wanted else None,
        help=f"trace Python allocations and write snapshot statistics here (env {ENV_DIR}, for the "
        f"services named in {ENV_PROGS} if set)",
    )
    group.add_argument(
        "--tracemalloc-interval-s",
        type=float,
        default=float(os.environ.get(ENV_INTERVAL) or 300),
        help=f"seconds between samples (env {ENV_INTERVAL})",
    )
    group.add_argument(
        "--tracemalloc-warmup-s",
        type=float,
        default=float(os.environ.get(ENV_WARMUP) or 60),
        help=f"seconds before the baseline snapshot (env {ENV_WARMUP})",
    )


_STATUS_FIELDS = {"VmRSS:": "rss_kib", "RssAnon:": "rss_anon_kib", "RssFile:": "rss_file_kib"}


def memory_kib(pid: int | str = "self") -> dict[str, int]:
    """Resident set, split into anonymous (heap, arenas) and file-backed (mapped libraries:
    grows as code pages are first touched, not a leak) pages, from Linux /proc."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = _STATUS_FIELDS.get(line.split(maxsplit=1)[0]) if line else None
        if key:
            out[key] = int(line.split()[1])
    return out


@functools.cache
def _mallinfo2() -> Any:
    """glibc's mallinfo2(), loaded on first use (ctypes is not imported while tracing is off)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        ]

    try:
        fn = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return None
    fn.restype = MallInfo2
    return fn


def malloc_kib() -> dict[str, int]:
    """glibc malloc, all arenas: bytes handed out (C extensions too: gRPC core, protobuf) and
    bytes freed but kept by the allocator. Empty off glibc (< 2.33)."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return {}
    info = mallinfo2()
    return {
        "malloc_in_use_kib": (info.uordblks + info.hblkhd) // 1024,
        "malloc_free_kib": info.fordblks // 1024,
    }


class HeapTracer:
    """Samples the traced heap on a daemon thread; `stop()` writes the final sample."""

    def __init__(self, directory: Path, prog: str, *, interval_s: float, warmup_s: float) -> None:
        import tracemalloc

        self._tm = tracemalloc
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{prog.replace('.', '-')}-{os.getpid()}.jsonl"
        self._prog = prog
        self._interval_s = interval_s
        self._warmup_s = warmup_s
        self._started = time.monotonic()
        self._baseline: tracemalloc.Snapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        tracemalloc.start(1)
        self._thread = threading.Thread(target=self._run, name="heaptrace", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self._warmup_s):
            return
        self.sample("baseline")
        while not self._stop.wait(self._interval_s):
            self.sample("sample")

    def _snapshot(self) -> tracemalloc.Snapshot:
        tm = self._tm
        return self._tm.take_snapshot().filter_traces(
            (tm.Filter(False, tm.__file__), tm.Filter(False, "<frozen importlib._bootstrap*>"))
        )

    def sample(self, kind: str) -> dict[str, Any]:
        """Take a snapshot and append its line; the first one becomes the baseline."""
        with self._lock:
            snap = self._snapshot()
            current, peak = self._tm.get_traced_memory()
            if self._baseline is None:
                self._baseline = snap
                top = [
                    {"where": _where(s.traceback), "size_kib": round(s.size / 1024, 1), "count": s.count}
                    for s in snap.statistics("lineno")[:TOP_N]
                ]
            else:
                top = [
                    {
                        "where": _where(d.traceback),
                        "size_diff_kib": round(d.size_diff / 1024, 1),
                        "count_diff": d.count_diff,
                        "size_kib": round(d.size / 1024, 1),
                    }
                    for d in sorted(snap.compare_to(self._baseline, "lineno"), key=_growth)[:TOP_N]
                ]
            record = {
                "kind": kind,
                "prog": self._prog,
                "pid": os.getpid(),
                "unix_time": round(time.time(), 1),
                "t_s": round(time.monotonic() - self._started, 1),
                **memory_kib(),
                **malloc_kib(),
                "traced_kib": round(current / 1024, 1),
                "traced_peak_kib": round(peak / 1024, 1),
                "tracemalloc_overhead_kib": round(self._tm.get_tracemalloc_memory() / 1024, 1),
                "threads": len(os.listdir("/proc/self/task")),
                "top": top,
            }
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            return record

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample("final")
        self._tm.stop()


def _growth(diff: tracemalloc.StatisticDiff) -> int:
    return -diff.size_diff


def _where(tb: tracemalloc.Traceback) -> str:
    """`file:line`, relative to the installation (site-packages, stdlib, working directory)."""
    frame = tb[0]
    name = frame.filename
    for prefix in _prefixes():
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return f"{name}:{frame.lineno}"


@functools.cache
def _prefixes() -> tuple[str, ...]:
    import sysconfig

    paths = {p.rstrip("/") + "/" for p in (*sysconfig.get_paths().values(), os.getcwd()) if p}
    return tuple(sorted(paths, key=len, reverse=True))


def start_from_arguments(args: argparse.Namespace) -> HeapTracer | None:
    """The tracer `add_tracemalloc_arguments` asked for, or None (the default: off)."""
    if getattr(args, "tracemalloc_dir", None) is None:
        return None
    return HeapTracer(
        args.tracemalloc_dir,
        args.tracemalloc_prog,
        interval_s=args.tracemalloc_interval_s,
        warmup_s=args.tracemalloc_warmup_s,
    )
