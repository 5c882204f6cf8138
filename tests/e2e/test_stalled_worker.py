"""A worker process stopped (SIGSTOP: what a wedged driver or a stuck GPU looks like from outside)
under steady clients: its requests move to the other worker within the hedge budget and one missed
probe, none fails or waits for it; the gateway shows it not serving within about a second, and it
rejoins once it runs again (SIGCONT). Real processes, real sockets."""

import asyncio
import os
import signal
import time

import httpx
import numpy as np
import pytest
from processes import start_stack

STOPPED_S = 3.0
MAX_LATENCY_S = 2.0  # the bound: hedge budget (0.25 s) + a missed probe (1 s) + the answer


@pytest.mark.serial  # its bound (MAX_LATENCY_S) is wall time: tests on other workers stretch it
def test_a_stopped_worker_holds_no_request_for_long_and_rejoins(log_dir):
    stack = start_stack(log_dir, num_workers=2)
    victim = stack.processes[0]
    try:

        async def load() -> tuple[list[tuple[int, float]], float, float]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
                end = time.monotonic() + 1.0 + STOPPED_S + 4.0
                marked_down_after = rejoined_after = float("nan")

                async def client(index: int) -> list[tuple[int, float]]:
                    done = []
                    i = 0
                    while time.monotonic() < end:
                        started = time.monotonic()
                        response = await http.post(
                            "/v1/embeddings", json={"input": f"client {index} query {i}"}
                        )
                        done.append((response.status_code, time.monotonic() - started))
                        if response.status_code == 200:
                            row = response.json()["data"][0]["embedding"]
                            assert abs(np.linalg.norm(row) - 1.0) < 1e-4
                        i += 1
                    return done

                async def stop_and_resume() -> None:
                    nonlocal marked_down_after, rejoined_after
                    await asyncio.sleep(1.0)  # clients are mid-flight on both workers
                    os.kill(victim.popen.pid, signal.SIGSTOP)
                    stopped_at = time.monotonic()
                    while time.monotonic() - stopped_at < STOPPED_S:
                        workers = (await http.get("/info")).json()["workers"]
                        if not workers[0]["serving"] and marked_down_after != marked_down_after:
                            marked_down_after = time.monotonic() - stopped_at
                        await asyncio.sleep(0.05)
                    os.kill(victim.popen.pid, signal.SIGCONT)
                    resumed_at = time.monotonic()
                    while time.monotonic() < end:
                        if (await http.get("/info")).json()["workers"][0]["serving"]:
                            rejoined_after = time.monotonic() - resumed_at
                            break
                        await asyncio.sleep(0.05)

                results = await asyncio.gather(*(client(c) for c in range(8)), stop_and_resume())
                return [r for rs in results[:-1] for r in rs], marked_down_after, rejoined_after

        answers, marked_down_after, rejoined_after = asyncio.run(load())
        statuses = {status for status, _ in answers}
        worst = max(latency for _, latency in answers)
        p99 = np.percentile([latency for _, latency in answers], 99)
        print(
            f"{len(answers)} answered, worst {worst:.3f} s, p99 {p99:.3f} s; "
            f"marked down after {marked_down_after:.2f} s, rejoined {rejoined_after:.2f} s after resuming"
        )
        assert statuses == {200}, f"failed: {[a for a in answers if a[0] != 200][:5]}"
        assert worst < MAX_LATENCY_S, f"a request took {worst:.2f} s"
        assert marked_down_after < 2.0, f"marked not serving {marked_down_after:.2f} s after the stop"
        assert rejoined_after < 4.0, f"rejoined {rejoined_after:.2f} s after it resumed"
        metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
        hedges = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("kembed_gateway_hedges_total")
        )
        assert hedges <= 10 + 0.02 * len(answers) + 1  # the throttle held: moves are not hedges
    finally:
        os.kill(victim.popen.pid, signal.SIGCONT)
        for proc in stack.processes:
            proc.stop()
