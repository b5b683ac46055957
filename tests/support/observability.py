"""What the Grafana dashboard and the chart's PrometheusRule query: their PromQL expressions, by panel and alert."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.helm_template import CHART, KUBE_VERSION, helm

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "dashboards" / "kvcal.json").read_text())


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield panel["title"], target["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(DASHBOARD["panels"])


def prometheus_rule(values: dict[str, str] | None = None) -> dict[str, Any]:
    """The chart's PrometheusRule, rendered with prometheusRule.enabled and VALUES."""
    sets = [a for k, v in (values or {}).items() for a in ("--set", f"{k}={v}")]
    out = helm(
        "template", "r", str(CHART), "--kube-version", KUBE_VERSION, "--set", "prometheusRule.enabled=true", *sets,
        "-s", "templates/prometheusrule.yaml",
    ).stdout  # fmt: skip
    rule: dict[str, Any] = yaml.safe_load(out)
    return rule
