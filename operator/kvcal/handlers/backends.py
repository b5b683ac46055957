"""Production analysis backends: Prometheus metrics, HTTP quality probes and the traffic router of the spec.

Imported lazily so `kvcal operator run` starts even when an optional adapter's dependencies are missing; an adapter
that cannot be built yields None and the analysis records that interval as an Error (never a pass).
"""

import importlib
import logging
from typing import Any

from kvcal.core.guard.policy import Policy
from kvcal.ports import Kube, MetricsSource, Probes, Router, Target

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

        return HttpProbes(load_suite(target.spec.analysis.quality, read_configmap))

    def router(self, target: Target) -> Router | None:
        try:
            module: Any = importlib.import_module("kvcal.adapters.router")
        except ImportError:
            log.warning("kvcal.adapters.router is not available: traffic weights are set by replica counts only")
            return None
        factory = getattr(module, "router_for", None)
        return None if factory is None else factory(target, self.kube)
