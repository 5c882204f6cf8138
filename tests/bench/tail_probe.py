"""Tail probes on the CPU stack: what a hung worker, an infeasible request and hedging cost clients.

Starts two real CPU workers (the bundled MiniLM) and a gateway, as `WORKERS=2 make run` does, and
drives them with `--clients` closed-loop clients of one short query each (loadgen.py: keep-alive
connections in processes of their own, exact per-request timestamps):
- `steady`: `--seconds` of load with the gateway's defaults, then again with hedging off
  (`--hedge-after-s 0`): the hedged share and whether p50/p99 differ;
- `stop-N`: one worker SIGSTOPped for N s (each of `--stop-s`) mid-load, then SIGCONT: requests over
  2 s, failures, worst; when the gateway first showed it not serving, when it rejoined;
- `infeasible`: 2048 texts of 3,900 characters (8 MB) at the default 60 s deadline, alone: the
  status and how long the answer took.
Not part of `make test` (minutes); prints a table for docs/reliability.md.

    .venv/bin/python -P tests/bench/tail_probe.py --stop-s 20 75
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadgen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(name: str, args: list[str], log_dir: Path) -> subprocess.Popen[bytes]:
    log = (log_dir / f"{name}.log").open("wb")
    return subprocess.Popen([sys.executable, "-P", "-m", *args], stdout=log, stderr=subprocess.STDOUT)


def wait_serving(url: str, num_workers: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            workers = httpx.get(f"{url}/info", timeout=2).json()["workers"]
            if sum(w["serving"] for w in workers) == num_workers:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.25)
    raise SystemExit("the stack did not start: see the logs")


class Stack:
    def __init__(self, log_dir: Path, gateway_flags: list[str], worker_flags: list[str]) -> None:
        self.workers = []
        addresses = []
        for i in range(2):
            port = free_port()
            args = ["kembed.worker", "--port", str(port), "--metrics-port", "0", *worker_flags]
            self.workers.append(start(f"worker{i}", args, log_dir))
            addresses += ["--worker", f"127.0.0.1:{port}"]
        port = free_port()
        self.gateway = start(
            "gateway", ["kembed.gateway", "--port", str(port), *addresses, *gateway_flags], log_dir
        )
        self.url, self.port = f"http://127.0.0.1:{port}", port
        wait_serving(self.url, 2)

    def stop(self) -> None:
        for proc in [*self.workers, self.gateway]:
            with_signal(proc, signal.SIGCONT)
            proc.terminate()
        for proc in [*self.workers, self.gateway]:
            proc.wait(30)


def with_signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, sig)


def bodies(num: int = 512) -> list[bytes]:
    return [json.dumps({"input": f"a short query about topic {i}"}).encode() for i in range(num)]


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def summary(result: loadgen.LoadResult) -> str:
    times = result.latencies_ns / 1e9
    return (
        f"{result.num_requests} requests, {result.num_errors} failed, {int((times > 2).sum())} over 2 s; "
        f"p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, worst {result.max_ms:.0f} ms"
    )


def stop_probe(stack: Stack, clients: int, stop_s: float) -> str:
    """One worker SIGSTOPped 2 s into the measured phase for `stop_s`, then SIGCONT; the gateway's
    /info read every 50 ms on a thread meanwhile."""
    victim, seen = stack.workers[0], {}

    def stop_and_resume() -> None:
        time.sleep(1.0 + 2.0)  # loadgen's warm-up, then 2 s of the measured phase
        with_signal(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        while time.monotonic() - stopped < stop_s:
            if (
                "down" not in seen
                and not httpx.get(f"{stack.url}/info", timeout=5).json()["workers"][0]["serving"]
            ):
                seen["down"] = time.monotonic() - stopped
            time.sleep(0.05)
        with_signal(victim, signal.SIGCONT)
        resumed = time.monotonic()
        while time.monotonic() - resumed < 10:
            if httpx.get(f"{stack.url}/info", timeout=5).json()["workers"][0]["serving"]:
                seen["back"] = time.monotonic() - resumed
                break
            time.sleep(0.05)

    thread = threading.Thread(target=stop_and_resume)
    thread.start()
    result = loadgen.run(
        stack.port, bodies(), connections=clients, warmup_s=1.0, duration_s=2.0 + stop_s + 5.0
    )
    thread.join()
    return (
        f"stop {stop_s:g} s: {summary(result)}; not serving after {seen.get('down', float('nan')):.2f} s, "
        f"serving again {seen.get('back', float('nan')):.2f} s after SIGCONT"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30, help="each steady run")
    parser.add_argument("--stop-s", type=float, nargs="*", default=[20.0, 75.0])
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/kembed-tail-probe"))
    parser.add_argument("--device", default="cpu", help="the workers' --device")
    parser.add_argument("--model", default="", help="model directory (default: the bundled MiniLM)")
    parser.add_argument("--no-infeasible", action="store_true", help="skip the infeasible request")
    parser.add_argument("--worker-flags", default="", help="more worker flags, e.g. '--prewarm none'")
    args = parser.parse_args()
    worker_flags = ["--device", args.device] + (["--model", args.model] if args.model else [])
    worker_flags += shlex.split(args.worker_flags)
    gateway_model = ["--model", args.model] if args.model else []
    args.log_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for label, flags in (("hedging on (defaults)", []), ("hedging off", ["--hedge-after-s", "0"])):
        stack = Stack(args.log_dir, [*flags, *gateway_model], worker_flags)
        try:
            loadgen.run(stack.port, bodies(), connections=args.clients, warmup_s=1.0, duration_s=3.0)  # warm
            before = metric(stack.url, "kembed_gateway_hedges_total")
            result = loadgen.run(
                stack.port, bodies(), connections=args.clients, warmup_s=1.0, duration_s=args.seconds
            )
            hedges = metric(stack.url, "kembed_gateway_hedges_total") - before
            share = hedges / max(1, result.num_requests)
            lines.append(f"steady, {label}: {summary(result)}; hedged {hedges:.0f} ({share:.2%})")
            print(lines[-1], flush=True)
            if not flags:
                for stop_s in args.stop_s:
                    lines.append(stop_probe(stack, args.clients, stop_s))
                    print(lines[-1], flush=True)
            if not flags and not args.no_infeasible:
                texts = ["lorem ipsum dolor sit amet " * 144] * 2048
                started = time.monotonic()
                response = httpx.post(f"{stack.url}/v1/embeddings", json={"input": texts}, timeout=120)
                took = time.monotonic() - started
                lines.append(
                    f"infeasible 2048 x 3,900 characters: {response.status_code} in {took:.2f} s: "
                    f"{response.text[:240]}"
                )
                print(lines[-1], flush=True)
        finally:
            stack.stop()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
