"""Bulk requests tokenized in child processes (tokenizer_processes.py) answer exactly as on the
threads, errors included, and the processes start and stop with the gateway."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from gateway_fakes import FakeEmbedder, serving
from local_ports import free_port

from kembed.gateway.tokenizing.tokenization import Tokenization
from kembed.proto.model_files import load_model_spec

LONG = "The quick brown fox jumps over the lazy dog, while 42 onlookers (mostly tourists!) cheer. " * 12
TEXTS = [f"text {i}: {LONG[: 40 * i]} Ünïcödé 中文 😀" for i in range(12)]  # 12 inputs: bulk by count
CASES = {
    # (route, body, headers): each a bulk request, answered alike with and without the processes
    "openai": ("/v1/embeddings", {"input": TEXTS}, {}),
    "openai-ids-and-texts": ("/v1/embeddings", {"input": [*TEXTS, [101, 7592, 102]]}, {}),
    "tei-left": ("/embed", {"inputs": TEXTS, "truncation_direction": "Left"}, {}),
    "tei-untruncated": ("/embed", {"inputs": [t[:300] for t in TEXTS], "truncate": False}, {}),
    "header-bulk": ("/v1/embeddings", {"input": TEXTS[-2:]}, {"X-Kembed-Priority": "bulk"}),
    "over-long-untruncated": ("/embed", {"inputs": [*TEXTS, "word " * 400], "truncate": False}, {}),
    "bad-token-id": ("/v1/embeddings", {"input": [*TEXTS, [1, 99999]]}, {}),
    "empty-ids": ("/embed", {"inputs": [*TEXTS, []]}, {}),
    "bad-prompt": ("/v1/embeddings", {"input": TEXTS, "prompt_name": "nope"}, {}),
}


async def answers(gateway_with, num_processes: int) -> dict[str, tuple[int, object]]:
    """Each case's (status, JSON body) from a gateway with `num_processes` bulk processes, and
    whether the processes were used."""
    found = {}
    async with gateway_with(FakeEmbedder(), bulk_tokenization_processes=num_processes) as client:
        for name, (route, body, headers) in CASES.items():
            response = await client.post(
                route, content=orjson.dumps(body), headers={"Content-Type": "application/json", **headers}
            )
            found[name] = (response.status_code, response.json())
        found["children"] = (0, len(multiprocessing.active_children()))
    return found


async def test_bulk_answers_and_errors_are_the_same_through_the_processes(gateway_with):
    threads, processes = await answers(gateway_with, 0), await answers(gateway_with, 1)
    assert processes.pop("children") == (0, 1)  # the pool's one process started for bulk work
    assert threads.pop("children") == (0, 0)
    assert processes == threads
    statuses = {name: status for name, (status, _) in threads.items()}
    assert statuses == {
        "openai": 200,
        "openai-ids-and-texts": 200,
        "tei-left": 200,
        "tei-untruncated": 200,
        "header-bulk": 200,
        "over-long-untruncated": 413,
        "bad-token-id": 400,
        "empty-ids": 422,
        "bad-prompt": 400,
    }
    assert multiprocessing.active_children() == []  # stopped with the gateway


async def test_queries_and_small_requests_stay_off_the_processes(model_dir: Path):
    tokenization = Tokenization(load_model_spec(model_dir), 1, max_inline_chars=512, num_bulk_processes=1)
    options = {"truncate": True, "direction": None, "prompt_name": None, "vocab_size": 30522}
    try:
        await tokenization.encode(TEXTS, **options)  # large, but interactive
        await tokenization.encode(["a query"], **options, is_bulk=True)  # bulk, but inline-sized
        assert tokenization.num_bulk_in_processes == 0
        assert multiprocessing.active_children() == []  # spawned only when first needed
        left = await tokenization.encode(TEXTS, **options | {"direction": "left"}, is_bulk=True)
        assert tokenization.num_bulk_in_processes == 1
        on_threads = await tokenization.encode(TEXTS, **options | {"direction": "left"})
        assert [ids.tolist() for ids in left] == [ids.tolist() for ids in on_threads]
    finally:
        tokenization.close()


def _descendants(pid: int) -> set[int]:
    """Every live process under `pid` (Linux /proc)."""
    found: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found |= {child, *_descendants(child)}
    return found


def _is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; its parent has not reaped it yet


def _still_alive(pids: set[int], timeout_s: float) -> list[int]:
    """Those of `pids` still running after up to `timeout_s` (an orphan is reparented: polled)."""
    deadline = time.monotonic() + timeout_s
    alive = [pid for pid in pids if _is_alive(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _is_alive(pid)]
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("num_processes", [1, 2], ids=["one-gateway-process", "two-gateway-processes"])
async def test_the_processes_stop_with_the_gateway_on_sigterm(num_processes: int):
    port = free_port()
    async with serving(FakeEmbedder()) as address:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "kembed.gateway", "--worker", address, "--port", str(port),
            "--processes", str(num_processes), "--bulk-tokenization-processes", "1",
            env={**os.environ, "KEMBED_GATEWAY_LOG_LEVEL": "warning"}, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            for _ in range(200):
                try:
                    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                        if (await client.get("/ready")).status_code == 200:
                            break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            # fresh connections, so that the kernel spreads them over the gateway processes
            for _ in range(8 * num_processes):
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                    response = await client.post("/v1/embeddings", json={"input": TEXTS})
                assert response.status_code == 200
                assert len(response.json()["data"]) == len(TEXTS)
            descendants = _descendants(process.pid)
            # each gateway process: its bulk process (and multiprocessing's resource tracker)
            assert len(descendants) >= 2 * num_processes
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode in (0, -15), stderr.decode()
        assert b"Traceback" not in stderr, stderr.decode()
        alive = _still_alive(descendants, timeout_s=10)
        assert alive == [], f"processes left behind after SIGTERM: {alive}"
