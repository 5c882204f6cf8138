"""A deployment's overrides of the model's own pipeline (the operator's model.pooling / normalize)."""

import numpy as np

from kembed.worker.__main__ import parse_config
from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.engine import load_engine


def run(engine, ids: list[int]) -> np.ndarray:
    return engine.step(engine.pack(np.array(ids, np.int32), np.array([len(ids)], np.int32))).wait()[0]


def test_pooling_and_normalize_overrides_change_what_is_served():
    ids = [101, 7592, 2088, 2003, 2307, 102]
    as_shipped = load_engine(WorkerConfig(model=bundled_model_dir(), device="cpu"))
    overridden = load_engine(
        WorkerConfig(model=bundled_model_dir(), device="cpu", pooling="cls", normalize=False)
    )
    assert (as_shipped.info.pooling, as_shipped.info.normalize) == ("mean", True)
    assert (overridden.info.pooling, overridden.info.normalize) == ("cls", False)
    hidden_first = run(overridden, ids)
    mean = run(as_shipped, ids)
    assert not np.allclose(hidden_first, mean)
    # CLS pooling is the first token's hidden state: the same as mean pooling over a 1-token sequence.
    np.testing.assert_allclose(run(overridden, ids[:1]), run(as_shipped, ids[:1]), rtol=1e-5, atol=1e-6)


def test_overrides_come_from_the_operators_environment():
    env = {"KEMBED_WORKER_POOLING": "lasttoken", "KEMBED_WORKER_NORMALIZE": "false"}
    config = parse_config([], env)
    assert (config.pooling, config.normalize) == ("lasttoken", False)
    assert parse_config([], {}).normalize is None
