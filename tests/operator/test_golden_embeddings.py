"""Golden embeddings by default: the first gated revision of given weights keeps its answer for the
golden texts; later revisions of the same weights must answer the same, new weights keep their own.
Against the in-memory API, with the golden Job's log played by the fake (its real run against real
workers: tests/e2e/test_golden_tool.py)."""

from __future__ import annotations

import json

import pytest
from operator_fakes import IMAGES, Driver, example, golden_log

from kembed.operator.build import naming as n
from kembed.operator.rollout import golden
from kembed.proto.accuracy import MIN_COSINE

OTHER_ANSWER = ((0.0, 1.0), (0.6, 0.8))  # the default answer's first row turned by 90 degrees


@pytest.fixture
def driver():
    return Driver(example("minilm-cpu.yaml")["spec"])


def records(driver: Driver) -> dict[str, golden.GoldenRecord]:
    found = driver.cluster.named("ConfigMap", "golden")
    return {body["metadata"]["name"]: golden.parse(body["data"][golden.RECORD_KEY]) for body in found}


def to_smoke_testing(driver: Driver) -> str:
    revision = driver.step()["candidateRevision"]
    driver.cluster.run_workers(revision, ip_base=30)
    driver.step()
    driver.cluster.finish_job("prewarm", True)
    assert driver.step()["rollout"]["stage"] == "SmokeTesting"
    return revision


def test_the_golden_job_runs_the_gateway_image_on_the_model_beside_the_smoke_test(driver):
    driver.cluster.golden_log = None  # held running, to look at it
    to_smoke_testing(driver)
    (job,) = driver.cluster.named("Job", "golden")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGES.gateway
    assert container["command"][:7] == [
        "python", "-P", "-m", "kembed.gateway.golden", "--model", "/models/model", "--target"
    ]  # fmt: skip
    assert container["command"][7] == "10.0.30.1:50051"
    assert {"name": "model", "mountPath": "/models/model", "readOnly": True} in container["volumeMounts"]
    assert any(v["name"] == "model" for v in pod["volumes"])
    assert len(driver.cluster.named("Job", "smoke")) == 1
    driver.cluster.finish_job("smoke", True)
    assert driver.step()["rollout"]["stage"] == "SmokeTesting"  # the golden Job has not answered yet


def test_same_weights_must_answer_the_same_and_an_intended_change_is_recorded(driver):
    first = driver.promote()
    (name,) = records(driver)
    assert name == "minilm-golden-" + "ab" * 6
    (body,) = driver.cluster.named("ConfigMap", "golden")
    assert body["metadata"]["annotations"][golden.RECORDED_FROM] == first
    assert body["metadata"]["labels"][golden.WEIGHTS_LABEL] == "ab" * 16

    driver.edit("worker", maxBatchTokens=1024)  # a new revision, the same weights and answer
    second = driver.promote()
    assert second != first and len(records(driver)) == 1
    passed = [m for _, reason, m in driver.cluster.events if reason == "SmokeTestPassed"][-1]
    assert "golden texts match their record" in passed

    driver.cluster.golden_log = golden_log(rows=OTHER_ANSWER)  # e.g. a pooling override
    driver.edit("model", pooling="cls")
    to_smoke_testing(driver)
    driver.cluster.finish_job("smoke", True)
    status = driver.step()
    assert status["phase"] == "Blocked" and status["activeRevision"] == second
    blocked = driver.condition("RolloutBlocked")
    assert blocked["reason"] == "GoldenMismatch"
    assert (
        "golden text 0 answers 0.000000" in blocked["message"]
        and "rollout.golden: Record" in blocked["message"]
    )
    assert records(driver)[name].rows[0] == (1.0, 0.0)  # the record is untouched

    driver.body["spec"]["worker"]["replicas"] = 3  # scaling is no reason to try again
    assert driver.step()["rollout"]["stage"] == "Blocked"
    driver.body["spec"]["worker"]["replicas"] = 1

    driver.edit("rollout", golden="Record")  # the change is intended: retried, its answer kept
    status = driver.step()
    assert status["rollout"]["attempt"] == 2
    revision = status["candidateRevision"]
    driver.cluster.run_workers(revision, ip_base=40)
    driver.step()
    driver.cluster.finish_job("prewarm", True)
    driver.step()
    driver.cluster.finish_job("smoke", True)
    assert driver.step()["rollout"]["stage"] == "Promoting"
    assert records(driver)[name].rows[0] == (0.0, 1.0)
    assert driver.cluster.events[-1][1] == "GoldenRecorded"


def test_new_weights_keep_their_own_record_and_the_oldest_go(driver):
    for i in range(golden.MAX_RECORDS + 2):
        driver.cluster.golden_log = golden_log(weights=f"{i:02x}" * 32)
        driver.edit("worker", maxBatchTokens=1024 + i)
        driver.promote()
    kept = {record.weights for record in records(driver).values()}
    assert kept == {"sha256:" + f"{i:02x}" * 32 for i in range(2, golden.MAX_RECORDS + 2)}


def test_golden_off_runs_no_golden_job_and_keeps_nothing(driver):
    driver.edit("rollout", golden="Off")
    to_smoke_testing(driver)
    assert driver.cluster.named("Job", "golden") == []
    driver.cluster.finish_job("smoke", True)
    assert driver.step()["rollout"]["stage"] == "Promoting"
    assert records(driver) == {}


@pytest.mark.parametrize(
    ("log", "says"),
    [
        ("ok   golden 10.0.0.1:50051: 8 rows\n", "no record line"),
        (golden.RECORD_PREFIX + '{"weights": "sha256:x", "rows": ["!!"]}\n', "malformed golden record"),
    ],
    ids=["no-record-line", "malformed-record"],
)
def test_a_golden_job_whose_answer_cannot_be_read_blocks_with_why(driver, log, says):
    driver.cluster.golden_log = log
    to_smoke_testing(driver)
    driver.cluster.finish_job("smoke", True)
    status = driver.step()
    assert status["phase"] == "Blocked"
    blocked = driver.condition("RolloutBlocked")
    assert blocked["reason"] == "GoldenMismatch" and says in blocked["message"]
    assert "pods/log" in blocked["message"]
    assert records(driver) == {}


def test_the_golden_job_tokenizes_with_the_gateways_length_and_prompts(driver):
    """The check embeds what the revision's clients get: a maxSequenceLength of 16 and a prompt are
    the gateway's settings (its env), and the golden Job is given the same. Before, it embedded with
    the model directory alone, so both were promoted unseen (a long text's vector at cosine 0.923)."""
    driver.promote()
    driver.cluster.golden_log = None  # held running, to look at it
    driver.edit("model", maxSequenceLength=16, prompts={"query": "query: ", "document": "passage: "})
    revision = to_smoke_testing(driver)
    (job,) = [j for j in driver.cluster.named("Job", "golden") if revision in j["metadata"]["name"]]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    prompts = '{"document": "passage: ", "query": "query: "}'
    assert command[command.index("--max-seq-length") + 1] == "16"
    assert command[command.index("--prompts") + 1] == prompts
    (gateway,) = driver.cluster.named("Deployment", "gateway")
    env = {e["name"]: e.get("value") for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env.get("KEMBED_GATEWAY_PROMPTS") in (None, prompts)  # the serving revision's, or the same


def test_judge_compares_norms_and_each_prompts_rows_and_renews_an_older_record():
    """A record as clients got their vectors (version 2): a normalisation turned off keeps every
    direction but not the norms; a prompt's prefix changed shows on its own rows; an older record
    (raw rows) is compared by direction only and renewed."""
    rows = ((1.0, 0.0), (0.6, 0.8))
    kept = record(rows, prompted={"query": ((0.8, 0.6),)})
    assert golden.judge(record(rows, prompted={"query": ((0.8, 0.6),)}), kept, "Check", MIN_COSINE).passed
    unnormalised = record(((5.0, 0.0), (3.0, 4.0)), prompted={"query": ((4.0, 3.0),)})
    verdict = golden.judge(unnormalised, kept, "Check", MIN_COSINE)
    assert (
        not verdict.passed and "golden text 0 has norm 5.0000 against the record's 1.0000" in verdict.message
    )
    reprompted = golden.judge(record(rows, prompted={"query": ((0.0, 1.0),)}), kept, "Check", MIN_COSINE)
    assert not reprompted.passed and "golden text 0 under prompt 'query' answers" in reprompted.message
    added = record(rows, prompted={"query": ((0.8, 0.6),), "passage": ((1.0, 0.0),)})
    assert golden.judge(added, kept, "Check", MIN_COSINE).passed  # a new prompt has no record yet
    older = record(((5.0, 0.0), (3.0, 4.0)))  # version 1: raw pooled rows
    renewed = golden.judge(record(rows, prompted={"query": ((0.8, 0.6),)}), older, "Check", MIN_COSINE)
    assert renewed.passed and renewed.record is not None and "renewed" in renewed.message


def record(rows, task="embed", texts="t" * 64, prompted=None) -> golden.GoldenRecord:
    line = golden_log(rows=rows, prompted=prompted).splitlines()[1].removeprefix(golden.RECORD_PREFIX)
    data = json.loads(line) | {"task": task, "textsSha256": texts}
    return golden.parse(json.dumps(data))


def test_judge_reads_cosine_for_embeddings_and_relative_error_for_logits():
    kept = record(((1.0, 0.0), (0.6, 0.8)))
    assert golden.judge(record(((0.9999, 0.01), (0.6, 0.8))), kept, "Check", MIN_COSINE).passed
    assert not golden.judge(record(((0.99, 0.14), (0.6, 0.8))), kept, "Check", MIN_COSINE).passed
    scores = record(((3.0,), (-2.0,)), task="score")
    assert golden.judge(record(((3.05,), (-2.01,)), task="score"), scores, "Check", MIN_COSINE).passed
    assert not golden.judge(record(((3.2,), (-2.0,)), task="score"), scores, "Check", MIN_COSINE).passed
    # A record of other golden texts cannot be compared: it is replaced, not failed.
    other = golden.judge(record(((0.0, 1.0), (0.6, 0.8)), texts="u" * 64), kept, "Check", MIN_COSINE)
    assert other.passed and other.record is not None and "other golden texts" in other.message
    assert not golden.judge(record(((1.0, 0.0, 0.0), (0.6, 0.8, 0.0))), kept, "Check", MIN_COSINE).passed
    assert (
        n.MODEL_LABEL
        in golden.config_map(n.Owner("m", "ml", "u"), kept, "r1", "2026-01-01T00:00:00Z")["metadata"][
            "labels"
        ]
    )
