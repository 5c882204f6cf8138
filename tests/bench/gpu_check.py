"""One command for a whole GPU check (`make gpu-check`): the `gpu`-marked tests, the engine
benchmarks (latency, scoring, throughput and saturation, each attention backend), the online suite
(short queries end to end against the engine's own pace), concurrency through the gateway and mixed
traffic (interactive queries beside bulk indexing); then a short
summary. Each part's own output streams as it runs; the summary repeats their tables."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = [sys.executable, "-P"]
# each installed attention kernel gets its own rows (flashinfer compiles its kernels on first use)
OPTIONAL = [name for name, module in (("flash-attn", "flash_attn"), ("flashinfer", "flashinfer"))
            if importlib.util.find_spec(module) is not None]  # fmt: skip
PARTS = {
    "GPU tests": [*PY, "-m", "pytest", "-m", "gpu", "tests/worker", "-q", "-p", "no:cacheprovider"],
    "engine benchmarks": [
        *PY, str(HERE / "bench_gpu.py"), "--models", "bge-m3", "qwen3-0.6b",
        "--backends", "auto", "torch-varlen", *OPTIONAL,
    ],
    "online suite": [*PY, str(HERE / "bench_online.py")],
    "concurrency through the gateway": [*PY, str(HERE / "bench_gpu_gateway.py")],
    "mixed traffic": [*PY, str(HERE / "bench_mixed.py"), "--device", "cuda"],
}  # fmt: skip


def run(command: list[str]) -> tuple[int, str]:
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line)
    return proc.returncode, "".join(lines)


def main() -> int:
    summary, failed = [], False
    for name, command in PARTS.items():
        print(f"\n=== {name} ===", flush=True)
        code, output = run(command)
        failed |= code != 0
        if name == "GPU tests":
            counts = re.findall(r"\d+ (?:passed|failed|skipped|error)", output)
            summary.append(f"## {name}: {', '.join(counts) or 'no result'} (exit {code})")
        else:
            tables = [line for line in output.splitlines() if line.startswith("|")]
            summary.append(f"## {name} (exit {code})\n" + "\n".join(tables))
    print("\n=== summary ===\n" + "\n\n".join(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
