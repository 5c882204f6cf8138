"""Flags and KEMBED_GATEWAY_* variables parse once into the config; the CLI serves over real HTTP."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gateway_fakes import FakeEmbedder, serving
from local_ports import free_port

from kembed.gateway.__main__ import bundled_model_dir, check_model_dir, parse_config
from kembed.gateway.config import GatewayConfig


def test_defaults_use_the_bundled_model_and_local_worker(model_dir: Path):
    config = parse_config([], {})
    assert config == GatewayConfig(model_dir=model_dir)
    assert bundled_model_dir() == model_dir
    assert (config.host, config.port, config.static_workers) == ("127.0.0.1", 8080, ("127.0.0.1:50051",))


def test_flags_win_over_environment_which_wins_over_defaults(tmp_path: Path):
    env = {
        "KEMBED_GATEWAY_PORT": "9000",
        "KEMBED_GATEWAY_CHUNK_TOKENS": "1024",
        "KEMBED_GATEWAY_WORKER_ADDRESSES": "a:1, b:2",
        "KEMBED_GATEWAY_AUTO_TRUNCATE": "false",
        "KEMBED_GATEWAY_REQUEST_TIMEOUT_S": "5.5",
    }
    config = parse_config(["--port", "9100", "--model", str(tmp_path), "--served-model-name", "m"], env)
    assert config.port == 9100 and config.chunk_tokens == 1024 and config.request_timeout_s == 5.5
    assert config.worker_addresses == ("a:1", "b:2") and config.auto_truncate is False
    assert config.model_dir == tmp_path and config.served_model_names == ("m",)


def test_repeated_flags_give_several_workers_and_aliases():
    argv = [
        "--worker",
        "w1:50051",
        "--worker",
        "w2:50051",
        "--served-model-name",
        "a",
        "--served-model-name",
        "b",
    ]
    config = parse_config([*argv, "--no-auto-truncate"], {"KEMBED_GATEWAY_WORKER_ADDRESSES": "ignored:1"})
    assert config.worker_addresses == ("w1:50051", "w2:50051") and config.served_model_names == ("a", "b")
    assert config.auto_truncate is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--chunk-tokens", "0"], "chunk_tokens must be positive"),
        (["--max-attempts", "-1"], "max_attempts"),
        (["--processes", "0"], "processes must be positive, got 0"),
        (["--processes", "2", "--port", "0"], "fixed port"),
        (["--max-inflight-frames", "-1"], "max_inflight_frames must be >= 0"),
        (["--max-inline-tokenize-chars", "-1"], "max_inline_tokenize_chars must be >= 0"),
    ],
    ids=[
        "zero-chunk-tokens",
        "negative-attempts",
        "no-processes",
        "processes-on-any-port",
        "negative-rpc-window",
        "negative-inline-chars",
    ],
)
def test_bad_values_are_refused_at_start(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_config(argv, {})


@pytest.mark.slow
async def test_cli_serves_embeddings_over_real_http():
    port = free_port()
    async with serving(FakeEmbedder()) as address:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "kembed.gateway", "--worker", address, "--port", str(port),
            env={**os.environ, "KEMBED_GATEWAY_LOG_LEVEL": "warning"}, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for _ in range(100):
                    try:
                        if (await client.get("/ready")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.1)
                response = await client.post("/v1/embeddings", json={"input": ["hello", "world"]})
            assert response.status_code == 200
            assert len(response.json()["data"]) == 2
        finally:
            process.terminate()
            _, stderr = await asyncio.wait_for(process.communicate(), 10)
        # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal: -15 is a clean exit.
        assert process.returncode in (0, -15), stderr.decode()
        assert b"Traceback" not in stderr, stderr.decode()


async def test_max_length_and_prompt_overrides_reach_tokenization(gateway_with):
    from gateway_fakes import FakeEmbedder

    async with gateway_with(FakeEmbedder(), max_seq_length=8, prompts='{"query": "query: "}') as client:
        tokens = (
            await client.post("/tokenize", json={"inputs": "one two three four five six seven eight nine"})
        ).json()
        prompted = (await client.post("/tokenize", json={"inputs": "hi", "prompt_name": "query"})).json()
        embedded = await client.post("/embed", json={"inputs": "word " * 50, "truncate": False})
    assert [t["text"] for t in prompted[0]][:4] == ["[CLS]", "query", ":", "hi"]
    assert embedded.status_code == 413 and "8" in embedded.json()["error"]
    assert len(tokens[0]) > 8  # /tokenize shows everything; truncation applies to what is embedded


@pytest.mark.parametrize("prompts", ["not json", '["a"]', '{"query": 1}'], ids=["text", "list", "number"])
def test_bad_prompt_overrides_are_refused_at_start(model_dir, prompts):
    from kembed.gateway.config import GatewayConfig

    with pytest.raises(ValueError, match="prompts"):
        GatewayConfig(model_dir=model_dir, prompts=prompts)


@pytest.mark.parametrize("name", ["worker_auth_token", "api_key"])
def test_secrets_come_from_a_file_or_the_environment_never_a_flag_value(tmp_path: Path, name: str):
    flag = "--" + name.replace("_", "-")
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-file\n")
    env = {f"KEMBED_GATEWAY_{name.upper()}": "from-env"}
    config = parse_config([f"{flag}-file", str(secret_file)], env)
    assert getattr(config, name) == "from-file" and "from-file" not in repr(config)
    assert getattr(parse_config([], env), name) == "from-env"
    with pytest.raises(SystemExit):
        parse_config([flag, "visible-to-ps"], {})
    with pytest.raises(SystemExit, match=f"cannot read {flag}-file"):
        parse_config([f"{flag}-file", str(tmp_path / "none")], {})


def _broken_copy(model_dir: Path, target: Path, name: str, text: str) -> Path:
    target.mkdir()
    for path in model_dir.iterdir():
        if path.is_file():
            (target / path.name).write_bytes(path.read_bytes())
    (target / name).write_text(text)
    return target


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("tokenizer.json", "{not json", "tokenizer.json: "),
        ("tokenizer.json", '{"version": "1.0"}', "tokenizer.json: Model missing"),
        ("config_sentence_transformers.json", "[", "config_sentence_transformers.json: Expecting value"),
        ("config_sentence_transformers.json", '{"default_prompt_name": "x"}', "default_prompt_name 'x'"),
    ],
    ids=["tokenizer-not-json", "tokenizer-without-model", "settings-not-json", "unknown-default-prompt"],
)
def test_a_model_directory_the_gateway_cannot_read_is_one_line_and_status_2(
    model_dir, tmp_path, capsys, name, text, says
):
    broken = _broken_copy(model_dir, tmp_path / "broken", name, text)
    with pytest.raises(SystemExit) as exited:
        check_model_dir(broken)
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert (
        line.startswith(f"python -m kembed.gateway: error: cannot serve --model {broken}: ") and says in line
    )
    check_model_dir(model_dir)  # the bundled one passes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--model", "/no/such/dir"], "cannot serve --model /no/such/dir: no tokenizer.json in /no/such/dir"),
        (["--processes", "0"], "processes must be positive, got 0"),
    ],
    ids=["missing-model", "bad-value"],
)
def test_the_cli_ends_a_bad_start_in_one_line_not_a_traceback(argv, says):
    done = subprocess.run(
        [sys.executable, "-P", "-m", "kembed.gateway", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"python -m kembed.gateway: error: {says}"]


def test_help_lists_every_flag_with_its_docstring_percent_signs_included(capsys):
    """argparse formats help text with %: a field docstring saying "2 %" must print, not crash --help."""
    with pytest.raises(SystemExit) as stopped:
        parse_config(["--help"], {})
    assert stopped.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-hedge-share" in text and "at most 2 % more work" in text
    assert "[env KEMBED_GATEWAY_PORT; default 8080]" in text
