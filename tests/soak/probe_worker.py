"""The worker under a memory probe, for `make soak --probe-dir`: `python -P probe_worker.py ARGS`.

It serves exactly as `python -m kembed.worker ARGS` does, plus a thread that writes a JSON line to
DIR/probe.jsonl every KEMBED_SOAK_PROBE_S seconds: RSS, glibc's heap accounting (mallinfo2: bytes in
use against bytes free but still held), the bytes Python allocated (tracemalloc, when
KEMBED_SOAK_TRACEMALLOC=1; it slows the worker) and the live object count. With tracemalloc on, a
snapshot is also dumped to DIR/snapshot-<seconds>.pickle at each probe, for `tracemalloc` diffs.
A file DIR/trim appearing makes the probe call malloc_trim(0) and record RSS before and after:
memory that comes back is free memory glibc held, not live objects.

A debugging aid of the soak only; nothing here is part of the worker.
"""

import ctypes
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _Mallinfo2
_libc.malloc_trim.argtypes = [ctypes.c_size_t]


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def probe(out_dir: Path, interval_s: float, is_tracing: bool) -> None:
    started = time.monotonic()
    with (out_dir / "probe.jsonl").open("a") as out:
        while True:
            time.sleep(interval_s)
            elapsed = time.monotonic() - started
            info = _libc.mallinfo2()
            record = {
                "t": round(elapsed, 1),
                "rss": rss_bytes(),
                "heap_arena": info.arena,  # sbrk'd main heap plus the other arenas' heaps
                "heap_mmap": info.hblkhd,  # blocks served by mmap directly
                "heap_in_use": info.uordblks,
                "heap_free": info.fordblks,  # free chunks glibc keeps (fragmentation shows here)
                "objects": len(gc.get_objects()),
            }
            if is_tracing:
                record["python_traced"] = tracemalloc.get_traced_memory()[0]
                tracemalloc.take_snapshot().dump(str(out_dir / f"snapshot-{int(elapsed):05d}.pickle"))
            trim = out_dir / "trim"
            if trim.exists():
                record["rss_before_trim"] = record["rss"]
                _libc.malloc_trim(0)
                record["rss_after_trim"] = rss_bytes()
                trim.unlink()
            out.write(json.dumps(record) + "\n")
            out.flush()


def main() -> None:
    out_dir = Path(os.environ["KEMBED_SOAK_PROBE_DIR"])
    out_dir.mkdir(parents=True, exist_ok=True)
    is_tracing = os.environ.get("KEMBED_SOAK_TRACEMALLOC") == "1"
    if is_tracing:
        tracemalloc.start(12)
    interval_s = float(os.environ.get("KEMBED_SOAK_PROBE_S", "30"))
    threading.Thread(target=probe, args=(out_dir, interval_s, is_tracing), daemon=True).start()
    from kembed.worker.__main__ import main as worker_main

    worker_main(sys.argv[1:])


if __name__ == "__main__":
    main()
