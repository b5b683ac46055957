"""Production analysis backends: Prometheus metrics, HTTP quality probes and the traffic router of the spec.

Imported lazily so `kvcal operator run` starts even when an optional adapter's dependencies are missing; an adapter
that cannot be built yields None and the analysis records that interval as an Error (never a pass).
"""

import importlib
import logging
from typing import TYPE_CHECKING, Any

from kvcal.core.guard.policy import Policy
from kvcal.ports import Kube, MetricsSource, Probes, Router, Target

if TYPE_CHECKING:
    from kvcal.adapters.probes import ProbeTls

log = logging.getLogger(__name__)


class ClusterBackends:
    def __init__(self, kube: Kube, policy: Policy | None = None) -> None:
        self.kube = kube
        # The operator's policy: the Prometheus servers it may query (chart values policy.prometheus.*).
        self.policy = policy or Policy()

    def metrics_source(self, target: Target) -> MetricsSource | None:
        from kvcal.adapters.prometheus import PrometheusSource
        from kvcal.core.analysis.promql import pod_label_selector
        from kvcal.core.manifests.common import match_labels

        baseline = target.spec.serving.baseline
        workload = self.kube.get(baseline.kind, target.namespace, baseline.deployment)
        if workload is None:
            raise LookupError(f"{baseline.kind} {target.namespace}/{baseline.deployment} (the baseline) not found")
        selector = pod_label_selector(target.namespace, target.name, match_labels(workload))
        return PrometheusSource(selector, policy=self.policy)

    def probes(self, target: Target) -> Probes | None:
        from kvcal.adapters.probes import HttpProbes, load_suite

        def read_configmap(name: str) -> dict[str, str] | None:
            cm = self.kube.get("ConfigMap", target.namespace, name)
            return None if cm is None else dict(cm.get("data") or {})

        key, tls, refusal = self._access(target)
        quality = target.spec.analysis.quality
        return HttpProbes(load_suite(quality, read_configmap), api=quality.api, api_key=key, tls=tls, refusal=refusal)

    def _access(self, target: Target) -> tuple[str | None, "ProbeTls | None", str | None]:
        """(the key the baseline's vLLM asks for, its TLS, or why the probes cannot run): core.guard.apikey."""
        import base64
        import binascii

        from kvcal.adapters.probes import ProbeTls
        from kvcal.core.guard.apikey import SecretKey, api_key_source, serves_tls
        from kvcal.core.manifests.canary import baseline_container_index

        baseline = target.spec.serving.baseline
        workload = self.kube.get(baseline.kind, target.namespace, baseline.deployment)
        if workload is None:
            return None, None, None  # the probe URLs say the baseline is missing
        containers = workload["spec"]["template"]["spec"]["containers"]
        container = containers[baseline_container_index(workload, baseline.container)]
        tls = None
        if serves_tls(container):
            if self.policy.probes_ca_file is None:
                return (
                    None,
                    None,
                    (
                        "the baseline's vLLM serves HTTPS (--ssl-keyfile/--ssl-certfile) and no CA is named for it: an "
                        "admin names the CA that signs its certificate with the chart value policy.probes.tls.caSecret"
                    ),
                )
            tls = ProbeTls(self.policy.probes_ca_file, f"{baseline.service}.{target.namespace}.svc")
        source = api_key_source(container)
        if not isinstance(source, SecretKey):
            return source, tls, None
        where = f"Secret {source.name} (key {source.key})"
        if not self.policy.read_api_key_secrets:
            return (
                None,
                tls,
                (
                    f"the baseline's vLLM takes its API key from {where}, which the operator may not read: an admin "
                    "allows it with the chart value policy.probes.readApiKeySecrets=true"
                ),
            )
        secret = self.kube.get("Secret", target.namespace, source.name)
        encoded = ((secret or {}).get("data") or {}).get(source.key)
        if not encoded:
            return None, tls, f"the baseline's vLLM takes its API key from {where}, which does not exist"
        try:
            return base64.b64decode(encoded, validate=True).decode(), tls, None
        except (binascii.Error, UnicodeDecodeError):
            return None, tls, f"the baseline's vLLM takes its API key from {where}, which is not valid base64 text"

    def router(self, target: Target) -> Router | None:
        try:
            module: Any = importlib.import_module("kvcal.adapters.router")
        except ImportError:
            log.warning("kvcal.adapters.router is not available: traffic weights are set by replica counts only")
            return None
        factory = getattr(module, "router_for", None)
        return None if factory is None else factory(target, self.kube)
