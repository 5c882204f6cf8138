"""/tokenize is bounded by tokens, not characters, and built a piece at a time: its answer is exactly
the whole texts' (three tokenizer families), a request past the token cap is refused having
tokenized little more than the cap, and a real gateway process answering CJK /tokenize requests
(about a token a character) stays within its memory bound and gives the memory back."""

import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time

import httpx
import orjson
import pytest
from gateway_fakes import BUNDLED_MODEL_DIR, unused_address
from local_ports import free_port
from test_truncation_window import bert, corpus, trained
from tokenizers import Tokenizer

from kembed.gateway.tokenizing.heap import HeapTrim
from kembed.gateway.tokenizing.tokenize_answer import PIECE_CHARS, SpecialRows, TooManyTokens, describe_tokens


def whole_answer(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool) -> list:
    """The answer as it was built before: each text encoded whole, a row per token."""
    answer = []
    for text in texts:
        encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        at_byte = list(itertools.accumulate((len(c.encode()) for c in text), initial=0))
        rows = []
        for token_id, token, (start, stop), special in zip(
            encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
        ):
            if special:
                rows.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                byte_start, byte_stop = (start, stop) if at_byte is None else (at_byte[start], at_byte[stop])
                rows.append(
                    {
                        "id": token_id,
                        "text": text[start:stop],
                        "special": False,
                        "start": byte_start,
                        "stop": byte_stop,
                    }
                )
        answer.append(rows)
    return answer


@pytest.mark.parametrize("family", ["wordpiece", "byte-level-bpe", "metaspace"])
def test_the_answer_built_in_pieces_is_the_whole_texts_answer(family):
    tokenizer = bert() if family == "wordpiece" else trained(family)
    rng = random.Random(f"pieces-{family}")
    num_words = 3 * PIECE_CHARS // 14  # texts of one piece and a half or so
    texts = [corpus(rng, num_words, style) for style in ("spaces", "runs", "long-words", "punctuation")]
    # CJK without spaces is a word a character to WordPiece; to the other two a run is one word,
    # so theirs has a space now and then (a word longer than a piece is cut inside: inexact there)
    cjk = corpus(rng, num_words, "cjk")
    texts.append(cjk if family == "wordpiece" else " ".join(cjk[i : i + 50] for i in range(0, len(cjk), 50)))
    texts += ["", "x", "Hello wörld 😀"]
    for add_special_tokens in (True, False):
        built = describe_tokens(tokenizer, SpecialRows.of(tokenizer), texts, add_special_tokens, 10**9)
        assert orjson.loads(built) == whole_answer(tokenizer, texts, add_special_tokens)


class CountingTokenizer:
    """A tokenizer that counts the characters it is given to encode."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.num_chars = 0

    def encode(self, text, *args, **kwargs):
        self.num_chars += len(text)
        return self.tokenizer.encode(text, *args, **kwargs)

    def encode_batch(self, texts, *args, **kwargs):
        self.num_chars += sum(map(len, texts))
        return self.tokenizer.encode_batch(texts, *args, **kwargs)


def test_a_request_past_the_token_cap_is_refused_having_tokenized_about_the_cap():
    base = bert()
    rng = random.Random(0)
    cjk = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(262_000))  # a token a character
    counting = CountingTokenizer(base)
    with pytest.raises(TooManyTokens) as refused:
        describe_tokens(counting, SpecialRows.of(base), ["short", cjk], True, 65_536)  # type: ignore[arg-type]
    assert refused.value.index == 1 and refused.value.num_tokens > 65_536
    # each piece is encoded twice (once to find where to cut it): about twice the cap, not the text
    assert counting.num_chars <= 2 * (65_536 + PIECE_CHARS) < len(cjk)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_cjk_tokenize_stays_within_its_memory_bound_and_rss_comes_back(tmp_path):
    """8 requests of 262,000 CJK characters (786 KB bodies within the character cap; refused past
    the token cap) and 8 of 65,000 (answered: 65,002 tokens, 4.4 MB each) at once, against a fresh
    gateway process: its RSS rises at most 300 MiB over idle and is back within 1.5x idle seconds
    after. Built whole, 8 of the first kind took +1,068 MiB and left RSS at 6.2x idle."""
    port = free_port()
    args = ["--model", str(BUNDLED_MODEL_DIR), "--port", str(port), "--worker", unused_address()]
    log = (tmp_path / "gateway.log").open("w")
    gateway = subprocess.Popen(
        [sys.executable, "-P", "-m", "kembed.gateway", *args, "--log-level", "error"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        rng = random.Random(1)
        long, short = (
            json.dumps({"inputs": "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(n))}).encode()
            for n in (262_000, 65_000)
        )
        with httpx.Client() as client:  # the tokenizer warmed once, as any served gateway's is
            assert client.post(f"{url}/tokenize", json={"inputs": "warm up"}).status_code == 200
        time.sleep(0.3)
        idle = rss_mib(gateway.pid)
        peak, is_sampling = idle, True

        def sample() -> None:
            nonlocal peak
            while is_sampling:
                peak = max(peak, rss_mib(gateway.pid))
                time.sleep(0.01)

        statuses: list[int] = []

        def post(body: bytes) -> None:
            with httpx.Client(timeout=60) as client:
                response = client.post(
                    f"{url}/tokenize", content=body, headers={"content-type": "application/json"}
                )
                statuses.append(response.status_code)
                if response.status_code == 200:
                    assert len(response.json()[0]) == 65_002

        sampler = threading.Thread(target=sample)
        sampler.start()
        clients = [threading.Thread(target=post, args=(body,)) for body in [long, short] * 8]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        after = rss_mib(gateway.pid)
        for _ in range(100):  # the trim follows the last large request (heap.py); 10 s at most
            if after <= 1.5 * idle:
                break
            time.sleep(0.1)
            after = rss_mib(gateway.pid)
        is_sampling = False
        sampler.join()
    finally:
        gateway.terminate()
        gateway.wait(15)
        log.close()
    assert sorted(statuses) == [200] * 8 + [413] * 8, (tmp_path / "gateway.log").read_text()
    assert peak - idle <= 300, (idle, peak)
    assert after <= 1.5 * idle, (idle, peak, after)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
async def test_the_heap_is_trimmed_once_when_the_last_large_request_has_ended():
    heap = HeapTrim(min_interval_s=0.05)

    async def large(seconds: float) -> None:
        heap.hold()
        heap.hold()  # once per request, however often it is found large
        await asyncio.sleep(seconds)

    first, second = asyncio.create_task(large(0.05)), asyncio.create_task(large(0.3))
    await first
    await asyncio.sleep(0.15)
    assert heap.num_trims == 0  # the second is still in flight
    await second
    await asyncio.sleep(0.15)
    assert heap.num_trims == 1
