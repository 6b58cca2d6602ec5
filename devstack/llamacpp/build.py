"""`make llama-server`: llama.cpp's HTTP server built from source, offline, once.

The PyPI sdist of `llama-cpp-python` vendors llama.cpp's full tree (`vendor/llama.cpp`,
`tools/server` included), so a pinned, hash-checked download from the ordinary package index
gives a reproducible engine source. Only the `llama-server` target is compiled (CPU, Release,
portable x86-64-v3 instructions rather than `-march=native`, no curl/OpenSSL, no web-UI
download), into `.cache/llama.cpp/` (git-ignored); a present build whose record matches the
pinned version is reused. `build-info.json` beside it records the engine's own version string
and how long the download and the build took.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDORED = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp"
# The sdist carries the submodule's HEAD but no git objects, so llama.cpp's own build-info
# step says "commit unknown"; the commit is read from here instead.
VENDORED_HEAD = f"llama_cpp_python-{SDIST_VERSION}/.git/modules/vendor/llama.cpp/HEAD"

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO_ROOT / ".cache" / "llama.cpp"

# Everything that could reach the network at build or run time is off: no libcurl model
# downloads, no OpenSSL (https model URLs), no web UI fetched from a bucket or built with npm.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


def server_binary(cache: Path = DEFAULT_CACHE) -> Path:
    return cache / "build" / "bin" / "llama-server"


def build_info_path(cache: Path = DEFAULT_CACHE) -> Path:
    return cache / "build-info.json"


def read_build_info(cache: Path = DEFAULT_CACHE) -> dict[str, Any] | None:
    """The record of a finished build of the pinned version, or None (absent, stale, partial)."""
    try:
        info: dict[str, Any] = json.loads(build_info_path(cache).read_text())
    except (OSError, ValueError):
        return None
    if info.get("sdist_version") != SDIST_VERSION or not server_binary(cache).is_file():
        return None
    return info


def engine_version(binary: Path) -> str:
    """`llama-server --version`'s own line, e.g. `version: 0.5.0-dev (commit 0c1e570)`."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("version:")]
    return lines[0].removeprefix("version:").strip() if lines else "unknown"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(cache: Path) -> Path:
    """The pinned sdist in `cache/dist`, downloaded by pip when absent; its hash checked."""
    dist = cache / "dist"
    archive = dist / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not archive.is_file():
        dist.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--no-binary", ":all:", f"{SDIST_NAME}=={SDIST_VERSION}", "--dest", str(dist),
            ],
            check=True,
        )  # fmt: skip
    actual = _sha256(archive)
    if actual != SDIST_SHA256:
        archive.unlink()
        raise SystemExit(f"{archive.name}: sha256 {actual}, expected {SDIST_SHA256} (removed; rerun)")
    return archive


def extract_vendored(archive: Path, cache: Path) -> Path:
    """Only `vendor/llama.cpp` out of the sdist, into `cache/src` (replaced whole)."""
    src = cache / "src"
    shutil.rmtree(src, ignore_errors=True)
    staging = cache / "src.partial"
    shutil.rmtree(staging, ignore_errors=True)
    prefix = VENDORED + "/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(staging, members=members, filter="data")
    (staging / VENDORED).rename(src)
    shutil.rmtree(staging)
    return src


def vendored_commit(archive: Path) -> str:
    """The llama.cpp commit the sdist vendors (its submodule HEAD), or "unknown"."""
    with tarfile.open(archive) as tar:
        try:
            head = tar.extractfile(VENDORED_HEAD)
        except KeyError:
            return "unknown"
        return head.read().decode().strip() if head is not None else "unknown"


def build(cache: Path, jobs: int) -> dict[str, Any]:
    """Download, extract, configure and compile; returns (and writes) the build record."""
    started = time.monotonic()
    archive = fetch_sdist(cache)
    fetched = time.monotonic()
    src = extract_vendored(archive, cache)
    out = cache / "build"
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), *CMAKE_FLAGS], check=True, env=env)
    configured = time.monotonic()
    subprocess.run(
        ["cmake", "--build", str(out), "--target", "llama-server", "-j", str(jobs)], check=True, env=env
    )
    done = time.monotonic()
    info = {
        "sdist": f"{SDIST_NAME}=={SDIST_VERSION}",
        "sdist_version": SDIST_VERSION,
        "sdist_sha256": SDIST_SHA256,
        "engine_version": engine_version(server_binary(cache)),
        "llama_cpp_commit": vendored_commit(archive),
        "cmake_flags": list(CMAKE_FLAGS),
        "jobs": jobs,
        "cpus": os.cpu_count(),
        "fetch_s": round(fetched - started, 1),
        "configure_s": round(configured - fetched, 1),
        "compile_s": round(done - configured, 1),
        "total_s": round(done - started, 1),
    }
    build_info_path(cache).write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="devstack.llamacpp.build", description=__doc__)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the build goes")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile jobs")
    parser.add_argument("--force", action="store_true", help="rebuild even when a build is present")
    args = parser.parse_args(argv)
    info = None if args.force else read_build_info(args.cache)
    if info is not None:
        print(f"llama-server {info['engine_version']} already built: {server_binary(args.cache)}")
        return
    info = build(args.cache, args.jobs)
    print(json.dumps(info, indent=2))
    print(f"llama-server {info['engine_version']}: {server_binary(args.cache)}")


if __name__ == "__main__":
    main()
