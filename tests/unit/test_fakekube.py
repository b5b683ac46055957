"""The in-memory Kube of the unit tests (tests/support/fakekube.py) lists as the API server does: one namespace,
only the objects that carry every label of the selector."""

from typing import Any

from kvcal.ports import Manifest
from tests.support.fakekube import FakeKube


def pod(name: str, namespace: str = "llm", **labels: str) -> Manifest:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {"kind": "Pod", "metadata": metadata}


def names(items: list[Manifest]) -> list[str]:
    return sorted(i["metadata"]["name"] for i in items)


KUBE = FakeKube(
    [
        pod("a", app="llm", role="canary"),
        pod("b", app="llm"),
        pod("c", app="other"),
        pod("unlabelled"),
        pod("elsewhere", namespace="team-b", app="llm"),
        {"kind": "Service", "metadata": {"name": "svc", "namespace": "llm", "labels": {"app": "llm"}}},
    ]
)


def test_an_empty_selector_lists_the_kind_in_the_namespace() -> None:
    assert names(KUBE.list("Pod", "llm", {})) == ["a", "b", "c", "unlabelled"]
    assert names(KUBE.list("Pod", "team-b", {})) == ["elsewhere"]
    assert KUBE.list("Pod", "nowhere", {}) == []


def test_equality_selectors_match_every_label() -> None:
    assert names(KUBE.list("Pod", "llm", {"app": "llm"})) == ["a", "b"]
    assert names(KUBE.list("Pod", "llm", {"app": "llm", "role": "canary"})) == ["a"]  # a=b,c=d: both must hold
    assert KUBE.list("Pod", "llm", {"app": "llm", "role": "baseline"}) == []
    assert KUBE.list("Pod", "llm", {"role": ""}) == []  # a key that is absent does not equal ""


def test_other_kinds_are_not_listed_and_results_are_copies() -> None:
    assert names(KUBE.list("Service", "llm", {"app": "llm"})) == ["svc"]
    KUBE.list("Pod", "llm", {"app": "other"})[0]["metadata"]["labels"]["app"] = "changed"
    assert names(KUBE.list("Pod", "llm", {"app": "other"})) == ["c"]
