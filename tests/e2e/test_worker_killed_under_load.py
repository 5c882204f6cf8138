"""A worker killed (SIGKILL) or stopped (SIGTERM: it drains) while its data-port connection carries
requests: every request is answered, by it or by the other replica, none is lost or hangs. Real
processes, real sockets."""

import asyncio
import signal
import time

import httpx
import numpy as np
import pytest
from processes import start_stack


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_requests_in_flight_on_a_worker_that_goes_are_answered(log_dir, sig):
    stack = start_stack(log_dir, num_workers=2)
    try:
        workers = httpx.get(f"{stack.url}/info", timeout=10).json()["workers"]
        assert [w["transport"] for w in workers] == ["frames", "frames"]
        victim = stack.processes[0]

        async def load() -> list[int]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:

                async def client(index: int) -> list[int]:
                    statuses = []
                    for i in range(12):
                        texts = [f"client {index} request {i} text {k}" for k in range(16)]
                        response = await http.post("/v1/embeddings", json={"input": texts})
                        statuses.append(response.status_code)
                        if response.status_code == 200:
                            rows = [d["embedding"] for d in response.json()["data"]]
                            assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-4)
                    return statuses

                async def kill_soon() -> None:
                    await asyncio.sleep(1.0)  # clients are mid-flight on both workers
                    victim.popen.send_signal(sig)

                results = await asyncio.gather(*(client(c) for c in range(8)), kill_soon())
                return [status for statuses in results[:-1] for status in statuses]

        started = time.monotonic()
        statuses = asyncio.run(load())
        assert victim.popen.wait(20) is not None
        assert statuses == [200] * 96  # nothing lost, nothing failed
        assert time.monotonic() - started < 60
        metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
        retries = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("kembed_gateway_upstream_retries_total")
        )
        if sig == signal.SIGKILL:  # it held requests: they were sent again, to the other
            assert retries > 0
    finally:
        for proc in stack.processes:
            proc.stop()
