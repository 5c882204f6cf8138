"""A CPU batch's token count is padded to a multiple of 64 with one extra sequence (so glibc's heaps
see few activation sizes: worker/engine/engine.py, CPU_TOKEN_MULTIPLE); its row never comes back and
the real rows are what they are without it."""

import numpy as np
import pytest

from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.engine import load_engine
from kembed.worker.engine.engine import CPU_TOKEN_MULTIPLE


@pytest.fixture(scope="module")
def cpu_engine():
    model = bundled_model_dir()
    if model is None:
        pytest.skip("the bundled model package is not installed")
    return load_engine(WorkerConfig(model=model, device="cpu"))


@pytest.mark.parametrize(
    "lengths", [[5], [64], [3, 61], [7, 30, 100], [1] * 65], ids=["5", "64", "3+61", "7+30+100", "65x1"]
)
def test_a_cpu_batch_runs_padded_and_returns_only_its_own_rows(cpu_engine, lengths):
    rng = np.random.default_rng(len(lengths))
    sequences = [rng.integers(1000, 30000, n).astype(np.int32) for n in lengths]
    batch = cpu_engine.pack(np.concatenate(sequences), np.array(lengths, np.int32))
    assert batch.input_ids.shape[0] % CPU_TOKEN_MULTIPLE == 0
    assert batch.input_ids.shape[0] - sum(lengths) < CPU_TOKEN_MULTIPLE
    rows = cpu_engine.step(batch).wait()
    assert rows.shape == (len(lengths), cpu_engine.info.dimensions)
    # each sequence alone (padded by a different amount, or not at all) gives the same row
    alone = np.concatenate(
        [cpu_engine.step(cpu_engine.pack(s, np.array([len(s)], np.int32))).wait() for s in sequences]
    )
    np.testing.assert_allclose(rows, alone, atol=1e-5)
