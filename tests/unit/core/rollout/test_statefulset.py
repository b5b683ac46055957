"""A StatefulSet baseline (spec.serving.baseline.kind): the spec, the canary and promotion of its kind, its rollout
state, and decide() creating, promoting and deleting by that kind. The same on a real API server with the
StatefulSet controller: tests/e2e/test_statefulset.py."""

from typing import Any

import pytest
from pydantic import ValidationError

from kvcal.core.decide import decide
from kvcal.core.manifests import build_canary_workload, build_promoted_baseline, canary_name
from kvcal.core.manifests.canary import PROMOTED_ANNOTATION, promotion_marker
from kvcal.core.observations import ABORT_ANNOTATION, Apply, ApplyOwnedFields, Decision, Delete, DeploymentState
from kvcal.core.spechash import spec_hash
from kvcal.models.spec import KVCalibrationSpec
from kvcal.models.status import Phase
from kvcal.services.observe import workload_state
from tests.support.decide import (
    ANALYZING,
    NOW,
    OWNER,
    SPEC,
    baseline_manifest,
    observations,
    spec,
    statefulset_manifest,
    status,
)

STS = spec(serving={"baseline": {"deployment": "llm", "service": "llm", "kind": "StatefulSet"}})
CANARY = canary_name(OWNER.name)


def sts_state(replicas: int = 2, ready: int = 2, manifest: dict[str, Any] | None = None) -> DeploymentState:
    found = workload_state(
        "StatefulSet",
        {
            **(manifest or statefulset_manifest(replicas)),
            "status": {
                "observedGeneration": 1,
                "replicas": replicas,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "updatedReplicas": replicas,
                "currentRevision": "llm-1",
                "updateRevision": "llm-1",
            },
        },
    )
    assert found is not None
    return found


def kinds(d: Decision, action: type) -> list[tuple[str, str]]:
    return [(a.manifest["kind"], a.manifest["metadata"]["name"]) for a in d.actions if isinstance(a, action)]


def test_a_spec_without_kind_still_names_a_deployment_and_other_kinds_are_refused() -> None:
    assert spec().serving.baseline.kind == "Deployment" and STS.serving.baseline.workload == "StatefulSet llm"
    data = {**SPEC, "serving": {"baseline": {"deployment": "llm", "service": "llm", "kind": "LeaderWorkerSet"}}}
    with pytest.raises(ValidationError, match="kind"):
        KVCalibrationSpec.model_validate(data)


def test_the_canary_has_the_baseline_kind_and_leaves_no_claims_behind() -> None:
    canary = build_canary_workload(OWNER, STS, statefulset_manifest(), 1)
    assert (canary["kind"], canary["spec"]["serviceName"]) == ("StatefulSet", "llm-headless")
    assert canary["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Delete"}
    assert [c["metadata"]["name"] for c in canary["spec"]["volumeClaimTemplates"]] == ["cache"]
    assert "status" not in canary["spec"]["volumeClaimTemplates"][0]
    assert "updateStrategy" not in canary["spec"] and "strategy" not in canary["spec"]  # OnDelete stays the baseline's
    deployment = build_canary_workload(OWNER, spec(), baseline_manifest(), 1)
    assert deployment["kind"] == "Deployment" and set(deployment["spec"]) == {"replicas", "selector", "template",
                                                                             "strategy"}  # fmt: skip


def test_promotion_rolls_every_statefulset_pod() -> None:
    applied = build_promoted_baseline(OWNER, STS, spec_hash(STS), statefulset_manifest())
    assert (applied["kind"], applied["metadata"]["name"]) == ("StatefulSet", "llm")
    assert applied["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert set(applied["spec"]) == {"updateStrategy", "template"}


def test_a_statefulset_is_rolled_out_once_its_revisions_meet() -> None:
    settled = sts_state()
    assert settled.rolled_out and not settled.progress_deadline_exceeded
    rolling = workload_state(
        "StatefulSet",
        {**statefulset_manifest(), "status": {**settled.manifest["status"], "updateRevision": "llm-2"}},
    )
    assert rolling is not None and rolling.revision_pending and not rolling.rolled_out
    # The same counters on a Deployment carry no revisions: only the kind that has them is held to them.
    deployment = workload_state("Deployment", {**baseline_manifest(), "status": settled.manifest["status"]})
    assert deployment is not None and deployment.rolled_out


def test_deploying_creates_a_canary_statefulset_and_waits_for_it_without_a_deadline() -> None:
    deploying = status(Phase.DEPLOYING, verification=ANALYZING.verification)
    d = decide(STS, deploying, observations(baseline=sts_state(), canary=None), NOW)
    assert kinds(d, Apply) == [("StatefulSet", CANARY), ("Service", CANARY)]
    created = d.actions[0].manifest  # type: ignore[union-attr]
    stuck = sts_state(created["spec"]["replicas"], ready=0, manifest=created)
    waiting = decide(STS, d.status, observations(baseline=sts_state(), canary=stuck), NOW)
    assert waiting.status.phase == Phase.DEPLOYING and "0/2 canary pods ready" in (waiting.status.message or "")


def test_promotion_applies_to_the_statefulset_and_waits_for_its_revisions() -> None:
    promoting = status(Phase.PROMOTING, canary=ANALYZING.canary, verification=ANALYZING.verification)
    d = decide(STS, promoting, observations(baseline=sts_state(), canary=sts_state(1)), NOW)
    assert kinds(d, ApplyOwnedFields) == [("StatefulSet", "llm")] and d.status.phase == Phase.PROMOTING
    promoted = statefulset_manifest()
    promoted["metadata"]["annotations"] = {PROMOTED_ANNOTATION: promotion_marker(OWNER, spec_hash(STS))}
    settled = sts_state(manifest=promoted)
    rolling = workload_state(
        "StatefulSet", {**promoted, "status": {**settled.manifest["status"], "updateRevision": "2"}}
    )
    waiting = decide(STS, d.status, observations(baseline=rolling, canary=sts_state(1)), NOW)
    assert waiting.status.phase == Phase.PROMOTING and not kinds(waiting, ApplyOwnedFields)
    done = decide(STS, waiting.status, observations(baseline=settled, canary=None), NOW)
    assert done.status.phase == Phase.SUCCEEDED, done.status.message
    assert "llm serves the calibrated checkpoint" in (done.status.message or "")


def test_a_rollback_deletes_the_canary_statefulset() -> None:
    aborted = observations(baseline=sts_state(), canary=sts_state(1), gates={ABORT_ANNOTATION: "1"})
    d = decide(STS, ANALYZING, aborted, NOW)
    deleting = decide(STS, d.status, observations(baseline=sts_state(), canary=sts_state(1)), NOW)
    deletes = [a for a in (*d.actions, *deleting.actions) if isinstance(a, Delete)]
    assert Delete("StatefulSet", CANARY) in deletes and Delete("Service", CANARY) in deletes
    assert all(a.kind != "Deployment" for a in deletes)


def test_prometheus_selects_a_statefulsets_pods_by_its_selector_labels_not_by_pod_names() -> None:
    """StatefulSet pods are NAME-0: the analysis selects the baseline's series by the labels its controller selects
    its pods by (kvcal.core.analysis.promql.pod_label_selector), read from the baseline workload."""
    from kvcal.adapters.prometheus import PrometheusSource
    from kvcal.handlers.backends import ClusterBackends
    from kvcal.ports import Target
    from tests.support.fakekube import FakeKube

    target = Target(namespace="llm", name=OWNER.name, spec=STS, canary_deployment=CANARY, canary_service=CANARY)
    source = ClusterBackends(FakeKube([statefulset_manifest()])).metrics_source(target)
    assert isinstance(source, PrometheusSource)
    assert source.selector.for_role("baseline") == 'namespace="llm",app="llm",kvcal_dev_calibration=""'
    assert source.selector.for_role("canary") == f'namespace="llm",kvcal_dev_calibration="{OWNER.name}",role="canary"'
    with pytest.raises(LookupError, match="StatefulSet llm/llm \\(the baseline\\) not found"):
        ClusterBackends(FakeKube([])).metrics_source(target)
