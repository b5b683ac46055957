"""The kopf wiring. Handlers only translate kopf's callbacks into Reconciler calls.

- Watch events on a KVCalibration or one of its Jobs / canary workload (a Deployment or StatefulSet, as the
  baseline), or on the baseline it promoted (ids `kvcal-wake-*`) queue a reconcile pass of it in
  handlers.workqueue, whose few workers also run the timed passes (the pass's requeue delay).
- On delete (id `kvcal-cleanup`) the finalizer `kvcal.dev/finalizer` holds the object until the canary is out of
  traffic (0% read back from the router, then spec.serving.traffic.drainDelay) and the canary, Services, Jobs and
  ConfigMaps are gone; the baseline is never touched.
- kopf's own progress and diff-base bookkeeping go to annotations under `kvcal.dev/` (never to status, never spec).
"""

import asyncio
import logging
import threading
from collections.abc import Collection, Coroutine
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client

from kvcal.core.manifests.canary import PROMOTED_ANNOTATION
from kvcal.core.manifests.common import GROUP, KIND, LABEL_MANAGED_BY, MANAGED_BY, PLURAL, VERSION
from kvcal.handlers.workqueue import WorkQueue
from kvcal.services.reconciler import Reconciler

log = logging.getLogger(__name__)
FINALIZER = "kvcal.dev/finalizer"
# The workload kinds a baseline (and so its canary) may be (models.spec.WorkloadKind): (plural, handler id suffix).
WORKLOAD_WATCHES = (("deployments", ""), ("statefulsets", "-statefulset"))
STORAGE_PREFIX = "kvcal.dev"


def settings() -> kopf.OperatorSettings:
    configured = kopf.OperatorSettings()
    configured.persistence.finalizer = FINALIZER
    configured.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
    configured.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=STORAGE_PREFIX, key="last-handled-configuration"
    )
    configured.posting.level = logging.WARNING  # the reconciler posts the lifecycle events itself
    configured.watching.server_timeout = 300
    configured.watching.client_timeout = 330
    return configured


def _owner_of(body: kopf.Body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(GROUP + "/"):
            name: str = ref["name"]
            return name
    return None


def connection_info(api: client.ApiClient) -> kopf.ConnectionInfo:
    """kopf's credentials from the kubernetes client's, so kopf and the reconciler talk to one server as one user."""
    configuration = api.configuration
    api_key = configuration.api_key or {}
    token = api_key.get("authorization") or api_key.get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[7:]
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        token=token or None,
    )


def build_registry(reconciler: Reconciler, queue: WorkQueue, api: client.ApiClient | None) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    managed = {LABEL_MANAGED_BY: MANAGED_BY}

    if api is not None:

        @kopf.on.login(id="kvcal-login", registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return connection_info(api)

    # The handlers are async so kopf runs them on the event loop, where the work queue lives (it has no locks).
    @kopf.on.event(GROUP, VERSION, PLURAL, id="kvcal-wake-self", registry=registry)
    async def wake_self(name: str, namespace: str | None, type: str | None, **_: Any) -> None:
        if type == "DELETED":
            queue.forget(namespace, name)
        else:
            queue.wake(namespace, name)

    @kopf.on.event("batch", "v1", "jobs", labels=managed, id="kvcal-wake-jobs", registry=registry)
    async def wake_from_job(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        queue.wake(namespace, _owner_of(body))

    async def wake_from_canary(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        queue.wake(namespace, _owner_of(body))

    # A promoted baseline (not ours, so not labelled) carries the marker `namespace/name@hash` of its KVCalibration:
    # a sync or an edit that reverts the promotion wakes that object at once (core.rollout.reverts).
    promoted = {PROMOTED_ANNOTATION: kopf.PRESENT}

    async def wake_from_promoted(body: kopf.Body, **_: Any) -> None:
        marker = str(body.get("metadata", {}).get("annotations", {}).get(PROMOTED_ANNOTATION, ""))
        namespace, name_at_hash = marker.partition("/")[::2]
        queue.wake(namespace, name_at_hash.rpartition("@")[0])

    for plural, suffix in WORKLOAD_WATCHES:  # the ids of Deployments stay as they were before StatefulSets
        kopf.on.event("apps", "v1", plural, labels=managed, id=f"kvcal-wake-canary{suffix}", registry=registry)(
            wake_from_canary
        )
        kopf.on.event("apps", "v1", plural, annotations=promoted, id=f"kvcal-wake-promoted{suffix}", registry=registry)(
            wake_from_promoted
        )

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="kvcal-cleanup", registry=registry)
    async def cleanup(name: str, namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
        namespace = namespace or ""
        while True:  # drain passes: the state lives in status, so a restart resumes where this one stopped
            result = await asyncio.to_thread(reconciler.cleanup, namespace, name)
            if result.retry_after is None:
                break
            await asyncio.sleep(result.retry_after)
        if reconciler.metrics:
            reconciler.metrics.set_phase(namespace, name, None)
        logger.info("removed %s", ", ".join(result.removed) or "nothing")

    return registry


class _QuietWakeHandlers(logging.Filter):
    """Drops kopf's "Handler 'kvcal-wake-...' succeeded." line: one per watch event, 10,000s at scale."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Handler 'kvcal-wake-")


@dataclass
class OperatorOptions:
    namespaces: Collection[str] = ()  # empty: every namespace
    standalone: bool = True
    metrics_port: int | None = None
    liveness: str | None = None  # e.g. http://0.0.0.0:8080/healthz (kopf's liveness endpoint)


_QUIET = _QuietWakeHandlers()  # one instance: addFilter ignores a filter already added (operator restarts in tests)


def run(
    reconciler: Reconciler,
    api: client.ApiClient | None,
    options: OperatorOptions,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> None:
    """Run the operator until stop_flag is set (or SIGINT/SIGTERM in the main thread)."""
    stop_metrics = None
    if options.metrics_port is not None and reconciler.metrics is not None:
        stop_metrics = reconciler.metrics.serve(options.metrics_port)
    queue = WorkQueue(reconciler.reconcile)
    logging.getLogger("kopf.objects").addFilter(_QUIET)
    coro = kopf.operator(
        registry=build_registry(reconciler, queue, api),
        settings=settings(),
        standalone=options.standalone,
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        liveness_endpoint=options.liveness,
    )
    try:
        asyncio.run(_with_queue(queue, coro, stop_flag, reconciler))
    finally:
        if stop_metrics is not None:
            stop_metrics()


async def _with_queue(
    queue: WorkQueue,
    operator: Coroutine[Any, Any, None],
    stop_flag: threading.Event | None,
    reconciler: Reconciler | None = None,
) -> None:
    """kopf feeds the queue; the queue's workers run until kopf stops."""
    notifier = reconciler.notifier if reconciler else None
    if notifier is not None:  # a delivery confirmed or failed: a pass records it in status (services.notifier)
        loop = asyncio.get_running_loop()

        def wake(namespace: str, name: str) -> None:
            loop.call_soon_threadsafe(queue.wake, namespace, name)

        notifier.listen(wake)
    workers = asyncio.ensure_future(queue.run())
    # Let the queue spawn its timer and workers before kopf starts: kopf counts every task born after it started
    # as its own and, stopping, waits 5 s for those it did not cancel (ours are stopped below, after kopf).
    await asyncio.sleep(0)
    try:
        await operator
    finally:
        if notifier is not None:
            notifier.listen(None)
        workers.cancel()
        await asyncio.gather(workers, return_exceptions=True)
        if stop_flag is not None:
            # kopf waits on a threading.Event in an executor thread; stopped by a signal, that thread would keep
            # asyncio.run from returning (it joins the executor) until the flag is set.
            stop_flag.set()
