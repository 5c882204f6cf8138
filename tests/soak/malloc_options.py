"""What the CPU worker's heap does under many batch shapes, per glibc setting and with the engine's
token padding: `python -P tests/soak/malloc_options.py` (minutes; not part of `make test`).

For each row, a fresh process loads the bundled model's eager engine and runs the same stream of
random ragged batches (1-64 sequences of 1-256 tokens, up to the 2048-token budget: the many shapes
a real worker sees) on one thread, then reports the median CPU time of a step, minor page faults
per step, RSS after the stream, and RSS after malloc_trim(0) (what glibc held free). glibc's
settings reach the child as its environment variables, so each row starts from a fresh heap; the
rows other than the engine's own run with its padding off (CPU_TOKEN_MULTIPLE 1). CPU time rather
than wall time: on a shared machine the wall clock measures the neighbours.
"""

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

UNPADDED = {"KEMBED_BENCH_MULTIPLE": "1"}
SETTINGS = {
    "unpadded, glibc default": UNPADDED,
    "unpadded, MALLOC_ARENA_MAX=2": {"MALLOC_ARENA_MAX": "2", **UNPADDED},
    "unpadded, MALLOC_ARENA_MAX=1": {"MALLOC_ARENA_MAX": "1", **UNPADDED},
    "unpadded, MALLOC_TRIM_THRESHOLD_=128K": {"MALLOC_TRIM_THRESHOLD_": "131072", **UNPADDED},
    "unpadded, MALLOC_MMAP_THRESHOLD_=128K": {"MALLOC_MMAP_THRESHOLD_": "131072", **UNPADDED},
    "unpadded, MALLOC_MMAP_THRESHOLD_=1M": {"MALLOC_MMAP_THRESHOLD_": "1048576", **UNPADDED},
    "unpadded, MALLOC_MMAP_THRESHOLD_=4M": {"MALLOC_MMAP_THRESHOLD_": "4194304", **UNPADDED},
    "unpadded, malloc_trim(0) every 2 s": {"KEMBED_BENCH_TRIM_S": "2", **UNPADDED},
    "kembed: tokens padded to 64s": {},
}


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def trim_every(interval_s: float) -> None:
    malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    while True:
        time.sleep(interval_s)
        malloc_trim(0)


def child(num_batches: int, seed: int) -> None:
    import numpy as np

    from kembed.worker.config import WorkerConfig, bundled_model_dir
    from kembed.worker.engine import engine as engine_module
    from kembed.worker.engine import load_engine

    if "KEMBED_BENCH_MULTIPLE" in os.environ:  # the padding off: what the engine did before it
        engine_module.CPU_TOKEN_MULTIPLE = int(os.environ["KEMBED_BENCH_MULTIPLE"])
    if "KEMBED_BENCH_TRIM_S" in os.environ:
        threading.Thread(
            target=trim_every, args=(float(os.environ["KEMBED_BENCH_TRIM_S"]),), daemon=True
        ).start()
    engine = load_engine(WorkerConfig(model=bundled_model_dir(), device="cpu", num_threads=1))
    rng = np.random.default_rng(seed)
    loaded = rss_mib()
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(num_batches):
        lengths = rng.integers(1, 257, size=int(rng.integers(1, 65)))
        lengths = lengths[np.cumsum(lengths) <= 2048]
        ids = rng.integers(1000, 30000, size=int(lengths.sum())).astype(np.int32)
        started = time.process_time()
        engine.step(engine.pack(ids, lengths.astype(np.int32))).wait()
        times.append(time.process_time() - started)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    after = rss_mib()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    result = {
        "median_ms": statistics.median(times) * 1000,
        "total_s": sum(times),
        "faults_per_step": faults / num_batches,
        "rss_loaded": loaded,
        "rss_after": after,
        "rss_trimmed": rss_mib(),
    }
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="run the rows whose name contains this")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.batches, args.seed)
        return
    print(
        f"{'row':40} {'step CPU':>10} {'total':>8} {'faults/step':>11} "
        f"{'RSS loaded':>11} {'after':>8} {'trimmed':>8}"
    )
    for name, env in SETTINGS.items():
        if args.only not in name:
            continue
        out = subprocess.run(
            [
                sys.executable,
                "-P",
                __file__,
                "--child",
                "--batches",
                str(args.batches),
                "--seed",
                str(args.seed),
            ],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"{name:40} {r['median_ms']:7.1f} ms {r['total_s']:6.1f} s {r['faults_per_step']:11.0f} "
            f"{r['rss_loaded']:7.0f} MiB {r['rss_after']:4.0f} MiB {r['rss_trimmed']:4.0f} MiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
