"""docs/metrics-pinned-memory-gpu.png from the trace the GPU metrics test writes
(`KEMBED_PINNED_TRACE=trace.json pytest -m gpu tests/worker/test_gpu_worker_metrics.py`): the worker's
pinned-memory gauges, as /metrics reports them, under load on the CUDA engine and after it.
`python -P tests/bench/plot_pinned_gpu.py trace.json docs/metrics-pinned-memory-gpu.png`"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(trace_path: str, out_path: str) -> None:
    trace = json.loads(Path(trace_path).read_text())
    t, in_use, reserved, queued = zip(*trace["samples"], strict=True)
    kib = 1 << 10
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    top.step(t, [v / kib for v in in_use], where="post", label="in_use")
    top.plot(t, [v / kib for v in reserved], linestyle="--", label="reserved (the ring's slots)")
    top.set_ylim(0, max(reserved) / kib * 1.3)
    limit = trace["limit"] / (1 << 20)
    note = f"limit (max_pinned_bytes): {limit:.0f} MiB, off this scale"
    top.text(0.01, 0.92, note, transform=top.transAxes)
    top.set_ylabel("KiB")
    device = trace["device"]
    top.set_title(f"kembed_worker_pinned_memory_bytes on {device}: 6 clients x 30 requests, then idle")
    top.legend(loc="lower right")
    bottom.plot(t, queued, color="tab:green")
    bottom.set_ylabel("queued tokens")
    bottom.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
