"""kvcal.ports.Kube on the official kubernetes client.

Requests go through ApiClient's generic call path with plain dict bodies and JSON answers, so the operator sees
exactly the camelCase dicts the API serves (no model round trip). Transient failures (429, 5xx, connection errors)
are retried with exponential backoff; a 409 on create means "already exists" (the caller's names are
deterministic), a 409 on a status replace is a stale resourceVersion and surfaces as ports.Conflict for the
reconciler to re-read.
"""

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kvcal.core.manifests.common import API_VERSION, GROUP, PLURAL, VERSION
from kvcal.core.timestamps import micro_time, rfc3339
from kvcal.ports import Conflict, Kind, Manifest

log = logging.getLogger(__name__)
T = TypeVar("T")
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply; JSON is YAML
_TRANSIENT = frozenset({429, 500, 502, 503, 504})


def retrying(
    call: Callable[[], T],
    *,
    attempts: int = 5,
    base_delay: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run `call`, retrying transient API and connection errors with exponential backoff: `sleep(base_delay)`, then
    twice that, ... between the attempts. `sleep` is a parameter so a test runs the schedule without waiting."""
    for attempt in range(attempts):
        try:
            return call()
        except ApiException as e:
            if e.status not in _TRANSIENT or attempt == attempts - 1:
                raise
            log.warning("transient API error %s, retrying: %s", e.status, e.reason)
        except (urllib3.exceptions.HTTPError, ConnectionError) as e:
            if attempt == attempts - 1:
                raise
            log.warning("connection error, retrying: %s", e)
        sleep(base_delay * 2**attempt)  # backoff between retries of a failed call
    raise AssertionError("unreachable")


# kind -> (API prefix, plural). One generic REST path for every kind: the generated typed methods validate bodies
# into their own models, and the operator works on the API's dicts as they are.
_RESOURCES: dict[str, tuple[str, str]] = {
    "KVCalibration": (f"/apis/{GROUP}/{VERSION}", PLURAL),
    "Job": ("/apis/batch/v1", "jobs"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),  # get only: a baseline's API key, where the chart's policy allows
    "Deployment": ("/apis/apps/v1", "deployments"),
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Service": ("/api/v1", "services"),
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "InferencePool": ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
    # list only: is the baseline autoscaled (spec.serving.canary.capacity fromBaseline scales it)?
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
}


class KubeClient:
    """The operator's view of the API server (one instance per process, thread-safe like ApiClient)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api_client
        # Both run inside a reconcile pass (the backoff of a retried call, an Event's timestamps): injectable, so a
        # test controls them instead of waiting or reading the wall clock.
        self.sleep = sleep
        self.clock = clock

    def request(
        self,
        method: str,
        kind: str,
        namespace: str,
        name: str | None = None,
        *,
        subresource: str | None = None,
        query: Mapping[str, str] | None = None,
        body: Manifest | None = None,
        content_type: str = "application/json",
    ) -> Manifest:
        """One HTTP call; raises ApiException on a non-2xx answer (after retrying transient ones)."""
        prefix, plural = _RESOURCES[kind]
        path = f"{prefix}/namespaces/{namespace}/{plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        headers = {"Accept": "application/json", "Content-Type": content_type}

        def call() -> Manifest:
            request = self.api.param_serialize(
                method,
                path,
                query_params=list((query or {}).items()),
                header_params=dict(headers),
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(*request)
            data: bytes = response.read()  # type: ignore[no-untyped-call]
            if not 200 <= response.status <= 299:
                raise ApiException(status=response.status, reason=response.reason, body=data.decode(errors="replace"))
            parsed: Manifest = json.loads(data) if data else {}
            return parsed

        return retrying(call, sleep=self.sleep)

    def _get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        """GET; None when it does not exist."""
        try:
            return self.request("GET", kind, namespace, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _create(self, kind: str, manifest: Manifest) -> bool:
        """POST; False when an object of that name exists already (the callers' names are deterministic)."""
        try:
            self.request("POST", kind, manifest["metadata"]["namespace"], body=manifest)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def _replace(self, kind: str, body: Manifest, subresource: str | None = None) -> None:
        """PUT with the resourceVersion that was read; a stale one (409) raises Conflict."""
        meta = body["metadata"]
        try:
            self.request("PUT", kind, meta["namespace"], meta["name"], subresource=subresource, body=body)
        except ApiException as e:
            if e.status == 409:
                raise Conflict(f"{kind} {meta['namespace']}/{meta['name']} changed since it was read") from e
            raise

    # --- ports.Kube ----------------------------------------------------------------------------------------------

    def get(self, kind: Kind, namespace: str, name: str) -> Manifest | None:
        return self._get(kind, namespace, name)

    def list(self, kind: Kind, namespace: str, labels: Mapping[str, str]) -> list[Manifest]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        items: list[Manifest] = self.request("GET", kind, namespace, query={"labelSelector": selector})["items"]
        return items

    def create(self, manifest: Manifest) -> bool:
        kind: Kind = manifest["kind"]
        return self._create(kind, manifest)

    def apply(self, manifest: Manifest) -> None:
        if self.create(manifest):
            return
        meta = manifest["metadata"]
        patch = {"metadata": {"labels": meta.get("labels", {})}, "spec": manifest["spec"]}
        self.patch(manifest["kind"], meta["namespace"], meta["name"], patch)

    def patch(self, kind: Kind, namespace: str, name: str, patch: Manifest) -> None:
        self.request("PATCH", kind, namespace, name, body=patch, content_type=MERGE_PATCH)

    def scale(self, kind: Kind, namespace: str, name: str, replicas: int) -> bool:
        return self._patch_if_there(kind, namespace, name, {"spec": {"replicas": replicas}})

    def set_job_deadline(self, namespace: str, name: str, seconds: int) -> bool:
        return self._patch_if_there("Job", namespace, name, {"spec": {"activeDeadlineSeconds": seconds}})

    def _patch_if_there(self, kind: Kind, namespace: str, name: str, patch: Manifest) -> bool:
        try:
            self.patch(kind, namespace, name, patch)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def apply_owned_fields(self, manifest: Manifest, field_manager: str) -> None:
        # A PATCH of the apply type, never `kubectl apply --server-side`: on an object last written by a client-side
        # apply (Argo CD's default), kubectl would also move every field of the last-applied annotation to us.
        meta = manifest["metadata"]
        query = {"fieldManager": field_manager, "force": "true"}
        self.request(
            "PATCH",
            manifest["kind"],
            meta["namespace"],
            meta["name"],
            query=query,
            body=manifest,
            content_type=APPLY_PATCH,
        )

    def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        try:
            self.request("DELETE", kind, namespace, name, query={"propagationPolicy": "Background"})
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def termination_message(self, namespace: str, job_name: str) -> str | None:
        pods = self.list("Pod", namespace, {"job-name": job_name})
        for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True):
            for status in pod.get("status", {}).get("containerStatuses") or []:
                for state in (status.get("state") or {}, status.get("lastState") or {}):
                    terminated = state.get("terminated")
                    if terminated and terminated.get("message"):
                        message: str = terminated["message"]
                        return message
        return None

    def replace_status(self, namespace: str, name: str, resource_version: str, status: Manifest) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": "KVCalibration",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
            "status": status,
        }
        self._replace("KVCalibration", body, subresource="status")

    def remove_annotations(self, namespace: str, name: str, keys: Sequence[str]) -> None:
        self.patch("KVCalibration", namespace, name, {"metadata": {"annotations": dict.fromkeys(keys)}})

    def emit_event(self, involved: Manifest, type_: str, reason: str, message: str, name: str | None = None) -> bool:
        meta = involved["metadata"]
        moment = self.clock()
        now = rfc3339(moment)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name or f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "kvcal-operator"},
            "reportingComponent": "kvcal.dev/operator",
            "reportingInstance": "kvcal-operator",
            "firstTimestamp": now,
            "lastTimestamp": now,
            # Microsecond time: several events of one reconcile share a second, and readers order by this.
            "eventTime": micro_time(moment),
            "action": reason,
            "count": 1,
        }
        if name is None:  # a fresh name: nothing to collide with
            self.request("POST", "Event", meta["namespace"], body=body)
            return True
        return self._create("Event", body)  # False: sent before (by this process or the one before a restart)

    # --- ports.Leases (leader election) ---------------------------------------------------------------------------

    def read_lease(self, namespace: str, name: str) -> Manifest | None:
        return self._get("Lease", namespace, name)

    def create_lease(self, lease: Manifest) -> bool:
        return self._create("Lease", lease)

    def replace_lease(self, lease: Manifest) -> None:
        self._replace("Lease", lease)
