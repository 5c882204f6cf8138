"""GET /metrics: Prometheus text with the contracted names and labels, moving with traffic."""

import asyncio

import grpc
import pytest
from gateway_fakes import FakeEmbedder, unused_address
from prometheus_client.parser import text_string_to_metric_families

CONTRACT = {  # family name -> label names of its samples (histogram `le` aside)
    "kembed_gateway_request_duration_seconds": {"route", "code"},
    "kembed_gateway_tokenize_duration_seconds": set(),
    "kembed_gateway_request_inputs": set(),
    "kembed_gateway_request_tokens": set(),
    "kembed_gateway_upstream_retries": set(),
    "kembed_gateway_errors": {"reason"},
    "kembed_gateway_inflight_requests": set(),
    "kembed_gateway_info": {"model"},
    "kembed_gateway_serving_workers": set(),
}


async def scrape(client) -> dict[str, float]:
    """Every sample as `name{label="value",...}` -> value, labels sorted."""
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


async def test_metrics_parse_with_the_contracted_names_and_labels(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        await client.post("/embed", json={"inputs": "hello"})
        await client.post("/embed", json={"inputs": []})
        response = await client.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert set(CONTRACT) <= set(families)
    for name, labels in CONTRACT.items():
        for sample in families[name].samples:
            assert set(sample.labels) - {"le"} == labels, sample
    assert families["kembed_gateway_upstream_retries"].type == "counter"
    assert families["kembed_gateway_inflight_requests"].type == "gauge"


async def test_a_request_moves_the_duration_tokens_and_tokenize_metrics(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        before = await scrape(client)
        response = await client.post("/v1/embeddings", json={"input": ["hello world", "bye"]})
        assert response.status_code == 200
        after = await scrape(client)
    count = 'kembed_gateway_request_duration_seconds_count{code="200",route="/v1/embeddings"}'
    assert before.get(count, 0) == 0 and after[count] == 1
    assert after["kembed_gateway_tokenize_duration_seconds_count{}"] == 1
    assert after['kembed_gateway_request_inputs_bucket{le="2.0"}'] == 1
    assert after["kembed_gateway_request_inputs_sum{}"] == 2
    assert after["kembed_gateway_request_tokens_sum{}"] == response.json()["usage"]["total_tokens"]
    assert after["kembed_gateway_inflight_requests{}"] == 0


async def test_tokenize_records_its_tokenize_time_but_sends_no_tokens(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        before = await scrape(client)
        response = await client.post("/tokenize", json={"inputs": ["hello world", "bye"]})
        assert response.status_code == 200
        after = await scrape(client)
    assert before["kembed_gateway_tokenize_duration_seconds_count{}"] == 0
    assert after["kembed_gateway_tokenize_duration_seconds_count{}"] == 1
    assert after["kembed_gateway_tokenize_duration_seconds_sum{}"] > 0
    # Inputs and tokens count what goes to the workers: /tokenize sends nothing.
    assert after["kembed_gateway_request_tokens_count{}"] == 0


async def test_info_names_the_served_model_for_the_dashboards_to_join_on(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        served = (await client.get("/v1/models")).json()["data"][0]["id"]
        after = await scrape(client)
    assert after[f'kembed_gateway_info{{model="{served}"}}'] == 1


async def test_serving_workers_counts_the_replicas_a_chunk_could_go_to(gateway_with):
    """What the availability alert reads: 0 while the gateway is up and no worker serves, whether or
    not a request arrives to fail."""
    starting = FakeEmbedder(status=2)  # NOT_SERVING
    async with gateway_with(FakeEmbedder(), starting, health_interval_s=0.05) as client:
        assert (await scrape(client))["kembed_gateway_serving_workers{}"] == 1
        starting.status = 1  # SERVING
        await asyncio.sleep(0.3)
        assert (await scrape(client))["kembed_gateway_serving_workers{}"] == 2
    async with gateway_with(unused_address(), health_timeout_s=0.5) as client:
        assert (await scrape(client))["kembed_gateway_serving_workers{}"] == 0


@pytest.mark.parametrize(
    ("path", "body", "route", "code", "reason"),
    [
        ("/embed", {"inputs": []}, "/embed", "422", "invalid_input"),
        ("/no/such/route", {}, "unmatched", "404", "not_found"),
    ],
    ids=["validation", "unknown-path"],
)
async def test_errors_count_by_reason_and_routes_stay_templates(
    gateway_with, path, body, route, code, reason
):
    async with gateway_with(FakeEmbedder()) as client:
        await client.post(path, json=body)
        after = await scrape(client)
    assert after[f'kembed_gateway_errors_total{{reason="{reason}"}}'] == 1
    assert after[f'kembed_gateway_request_duration_seconds_count{{code="{code}",route="{route}"}}'] == 1
    assert not any("/no/such/route" in key for key in after)


async def test_a_chunk_refused_by_one_replica_counts_a_retry(gateway_with):
    full = FakeEmbedder(fail_with=grpc.StatusCode.RESOURCE_EXHAUSTED)
    async with gateway_with(full, FakeEmbedder()) as client:
        for _ in range(4):  # round-robin ties: at least one request tries the full replica first
            assert (await client.post("/embed", json={"inputs": "x"})).status_code == 200
        after = await scrape(client)
    assert after["kembed_gateway_upstream_retries_total{}"] >= 1


async def test_metrics_need_no_api_key_and_count_refusals(gateway_with):
    async with gateway_with(FakeEmbedder(), api_key="k") as client:
        assert (await client.post("/embed", json={"inputs": "x"})).status_code == 401
        after = await scrape(client)
    assert after['kembed_gateway_errors_total{reason="unauthorized"}'] == 1
    assert after['kembed_gateway_request_duration_seconds_count{code="401",route="/embed"}'] == 1


def test_folded_observations_expose_what_one_observe_each_would():
    """Batched hands prometheus_client a batch through its histogram's own fields: the exposition must
    be what observing each value would give (this fails first if prometheus_client changes them)."""
    import random

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from kembed.gateway.metrics import DURATION_BUCKETS, Batched

    rng = random.Random(0)
    values = [rng.lognormvariate(-7, 2) for _ in range(500)] + [DURATION_BUCKETS[10], 0.0, 1e9]
    exposed = []
    for batched in (False, True):
        registry = CollectorRegistry()
        histogram = Histogram("h", "h", buckets=DURATION_BUCKETS, registry=registry)
        if batched:
            folding = Batched(histogram)
            for value in values:
                folding.observe(value)
            folding.fold()
        else:
            for value in values:
                histogram.observe(value)
        exposed.append(
            [line for line in generate_latest(registry).decode().splitlines() if "created" not in line]
        )
    assert exposed[0] == exposed[1]
