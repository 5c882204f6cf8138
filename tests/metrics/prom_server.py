"""A real Prometheus for the metrics tests: Debian's `prometheus` binary (`make prometheus-tools`)
started on a free localhost port with a config of our own, scraping every second, and a small client
for its HTTP API. Never the packaged service: its own data directory under the test's tmp dir."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

SCRAPE_INTERVAL_S = 1


@dataclass(frozen=True)
class Target:
    """One scraped endpoint and the labels a PodMonitor/ServiceMonitor scrape would give its series."""

    job: str
    address: str  # host:port
    namespace: str
    pod: str
    path: str = "/metrics"


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not on PATH: `make prometheus-tools` installs it (Debian: prometheus)")
    return found


def write_config(directory: Path, targets: list[Target], rule_groups: list[dict]) -> Path:
    (directory / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}))
    jobs: dict[str, dict] = {}
    for target in targets:
        job = jobs.setdefault(
            target.job, {"job_name": target.job, "metrics_path": target.path, "static_configs": []}
        )
        labels = {"namespace": target.namespace, "pod": target.pod}
        job["static_configs"].append({"targets": [target.address], "labels": labels})
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "rule_files": ["rules.yaml"],
        "scrape_configs": list(jobs.values()),
    }
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Prometheus:
    """A running Prometheus and queries against it. Results are the API's `data.result` lists."""

    def __init__(self, directory: Path, port: int, targets: list[Target], rule_groups: list[dict]) -> None:
        config = write_config(directory, targets, rule_groups)
        self.url = f"http://127.0.0.1:{port}"
        self.log = directory / "prometheus.log"
        with self.log.open("w") as out:
            self.popen = subprocess.Popen(
                [
                    tool("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                pytest.fail(f"prometheus exited with {self.popen.returncode}:\n{self.log.read_text()}")
            try:
                if self.http.get("/-/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        pytest.fail(f"prometheus not ready after {timeout_s}s:\n{self.log.read_text()}")

    def wait_scraped(self, num_targets: int, timeout_s: float = 30) -> None:
        """Until every target has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            active = self.api("/api/v1/targets")["activeTargets"]
            if len(active) == num_targets and all(t["health"] == "up" for t in active):
                return
            time.sleep(0.3)
        pytest.fail(
            f"not every target is up: {[(t['scrapeUrl'], t['health'], t['lastError']) for t in active]}"
        )

    def api(self, path: str, **params) -> dict | list:
        response = self.http.get(path, params=params)
        body = response.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict]:
        return self.api("/api/v1/query", query=expr, time=at)["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float = 1) -> list[dict]:
        return self.api("/api/v1/query_range", query=expr, start=start, end=end, step=step_s)["result"]

    def label_values(self, label: str, selector: str, start: float, end: float) -> list[str]:
        return self.api(f"/api/v1/label/{label}/values", **{"match[]": selector, "start": start, "end": end})

    def stop(self) -> None:
        self.http.close()
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
