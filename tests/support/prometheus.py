"""pytest fixtures: prometheus (see tests/conftest.py).

Starts the real Prometheus binary (Debian's package, `make prometheus`) once per session on a free loopback port,
scraping every second the targets a test registers (file_sd: the file is rewritten atomically and Prometheus picks
it up through inotify). Helpers wait on conditions — readiness, targets up, fresh samples — never on sleeps.
"""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvcal.core.analysis import promql
from kvcal.core.analysis.promql import Role
from kvcal.core.guard.policy import Policy, PrometheusAccess
from kvcal.core.manifests.common import LABEL_CALIBRATION, LABEL_ROLE
from tests.support.prereq import require

SCRAPE_INTERVAL_SECONDS = 1
_CONFIG = """\
global:
  scrape_interval: {interval}s
  scrape_timeout: {interval}s
  evaluation_interval: {interval}s
scrape_configs:
  - job_name: vllm
    file_sd_configs:
      - files: [{targets}]
        refresh_interval: 1s
    # As the scrape config in docs/operations.md: the pod labels Kubernetes discovery would give (tests write them
    # as __meta_kubernetes_pod_label_* target labels) become series labels, which kvcal selects roles by.
    relabel_configs:
      - regex: __meta_kubernetes_pod_label_(.+)
        action: labelmap
"""

# The pods of the tests' rollouts: a baseline selected by `app: llm`, and a canary as router `replicas` makes it (the
# baseline's labels plus kvcal's), the hardest case for telling them apart.
CALIBRATION = "llm"
BASELINE_MATCH_LABELS = {"app": "llm"}
ROLE_POD_LABELS: dict[Role, dict[str, str]] = {
    "baseline": {**BASELINE_MATCH_LABELS, "tier": "serving"},
    "canary": {**BASELINE_MATCH_LABELS, "tier": "serving", LABEL_ROLE: "canary", LABEL_CALIBRATION: CALIBRATION},
}


def pod_target_labels(namespace: str, pod: str, pod_labels: dict[str, str]) -> dict[str, str]:
    """The target labels Kubernetes pod discovery gives one pod: its namespace and name, and its labels as meta labels
    (the server's labelmap rule turns them into series labels)."""
    meta = {f"__meta_kubernetes_pod_label_{promql.series_label(key)}": value for key, value in pod_labels.items()}
    return {"namespace": namespace, "pod": pod, **meta}


def role_target_labels(namespace: str, role: Role, pod: str | None = None) -> dict[str, str]:
    """A test rollout's baseline or canary pod as a scrape target (ROLE_POD_LABELS)."""
    return pod_target_labels(namespace, pod or f"{CALIBRATION}-{role}-0", ROLE_POD_LABELS[role])


def role_selector(namespace: str) -> promql.Selector:
    """What the operator selects a test rollout's roles by (kvcal.core.analysis.promql.pod_label_selector)."""
    return promql.pod_label_selector(namespace, CALIBRATION, BASELINE_MATCH_LABELS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class PrometheusServer:
    binary: str
    workdir: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Prometheus's own --web.config.file (TLS, basic auth): the API then answers only over HTTPS with credentials.
    web_config: Path | None = None
    retention: str = "2h"  # blocks older than this (a backfilled history) are deleted at start

    @property
    def url(self) -> str:
        return f"{'https' if self.web_config else 'http'}://127.0.0.1:{self.port}"

    def access(self, name: str = "default") -> PrometheusAccess:
        """This server as a cluster admin would configure it for the operator (chart values policy.prometheus.*)."""
        return PrometheusAccess(name=name, address=self.url)

    def policy(self) -> Policy:
        """The operator's policy with this server as its default Prometheus."""
        return Policy(prometheus_default=self.access())

    @property
    def targets_file(self) -> Path:
        return self.workdir / "targets.json"

    def start(self) -> None:
        self._write_targets()
        config = self.workdir / "prometheus.yml"
        config.write_text(_CONFIG.format(interval=SCRAPE_INTERVAL_SECONDS, targets=json.dumps(str(self.targets_file))))
        log = (self.workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                f"--storage.tsdb.retention.time={self.retention}",
                *([f"--web.config.file={self.web_config}"] if self.web_config else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until(self._ready, 60, f"Prometheus ready on {self.url} (log: {self.workdir / 'prometheus.log'})")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = (self.workdir / "prometheus.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{log}")
        if self.web_config:  # its API wants TLS and credentials: read its own word instead
            return "Server is ready to receive web requests" in (self.workdir / "prometheus.log").read_text(
                errors="replace"
            )
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _write_targets(self) -> None:
        data = [g for groups in self.groups.values() for g in groups]
        fd, tmp = tempfile.mkstemp(dir=self.workdir, suffix=".json.tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.targets_file)  # atomic: Prometheus never reads half a file

    def set_targets(self, key: str, targets: dict[str, dict[str, str]]) -> None:
        """Register (or replace) a set of targets under ``key``: {"127.0.0.1:PORT": {label: value}}."""
        self.groups[key] = [{"targets": [t], "labels": labels} for t, labels in targets.items()]
        self._write_targets()

    def set_target_groups(self, key: str, groups: list[tuple[str, dict[str, str]]]) -> None:
        """Like set_targets, but one address may appear in several groups (e.g. scraped once per role)."""
        self.groups[key] = [{"targets": [t], "labels": labels} for t, labels in groups]
        self._write_targets()

    def remove_targets(self, key: str) -> None:
        self.groups.pop(key, None)
        self._write_targets()

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=promql)["result"]
        return result

    def wait_targets_up(self, targets: list[str], timeout: float = 30) -> None:
        def up() -> bool:
            active = self.api("targets", state="active")["activeTargets"]
            health = {t["scrapeUrl"].split("/")[2]: t["health"] for t in active}
            return all(health.get(t) == "up" for t in targets)

        wait_until(up, timeout, f"targets up: {', '.join(targets)}")

    def wait_samples(self, selector: str, count: int, timeout: float = 60, series: int = 1) -> None:
        """Wait until at least ``series`` series of ``up{selector}`` exist and every one has at least ``count`` scrapes
        in the last 10 minutes."""

        def enough() -> bool:
            res = self.query(f"count_over_time(up{{{selector}}}[10m])")
            return len(res) >= series and all(float(r["value"][1]) >= count for r in res)

        wait_until(enough, timeout, f"{count} scrapes of up{{{selector}}}")

    def wait_next_scrape(self, selector: str, timeout: float = 15) -> None:
        """Wait until every series of ``up{selector}`` has a scrape newer than now (one fresh sample)."""
        start = time.time()

        def fresh() -> bool:
            res = self.query(f"timestamp(up{{{selector}}})")
            return bool(res) and all(float(r["value"][1]) > start for r in res)

        wait_until(fresh, timeout, f"a fresh scrape of up{{{selector}}}", poll=0.1)


def find_prometheus() -> str | None:
    return shutil.which("prometheus") or next(
        (p for p in ("/usr/bin/prometheus", "/usr/local/bin/prometheus") if os.access(p, os.X_OK)), None
    )


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    binary = find_prometheus()
    require(binary, "prometheus binary not found: run `make prometheus` (installs Debian's package)")
    assert binary is not None
    server = PrometheusServer(binary=binary, workdir=tmp_path_factory.mktemp("prometheus"), port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
