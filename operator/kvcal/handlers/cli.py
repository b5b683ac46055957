"""`kvcal operator run`: the operator in this process, against the current kubeconfig (or in-cluster config)."""

import argparse
import logging
import os
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kubernetes import client
from pydantic import ValidationError

from kvcal.adapters.kubeconfig import connect
from kvcal.core.guard.policy import DEFAULT_PROMETHEUS_ADDRESS, Policy, PrometheusAccess
from kvcal.core.guard.vllm_allowlist import DEFAULT_ALLOWED
from kvcal.core.manifests.common import DEFAULT_CALIBRATOR_IMAGE
from kvcal.core.notifications import WebhookTarget

if TYPE_CHECKING:
    from kvcal.adapters.kube import KubeClient
    from kvcal.handlers.operator import OperatorOptions
    from kvcal.services.notifier import Notifier
    from kvcal.services.reconciler import Reconciler


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = sub.add_parser("operator", help="run the KVCalibration operator")
    actions = parser.add_subparsers(dest="operator_command", metavar="ACTION")
    run = actions.add_parser("run", help="run the operator until interrupted")
    run.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: every namespace",
    )
    run.add_argument("--metrics-port", type=int, default=None, help="serve the operator's Prometheus metrics here")
    run.add_argument(
        "--standalone",
        action="store_true",
        help="no peering with other operator instances (one replica, or tests)",
    )
    run.add_argument(
        "--leader-elect",
        action="store_true",
        help="run the operator only while holding a coordination.k8s.io Lease; other replicas stand by",
    )
    run.add_argument(
        "--lease-namespace",
        default=os.environ.get("KVCAL_OPERATOR_NAMESPACE") or "default",
        help="namespace of the leader-election Lease (default: $KVCAL_OPERATOR_NAMESPACE, else default)",
    )
    run.add_argument("--lease-name", default="kvcal-operator", help="name of the leader-election Lease")
    run.add_argument(
        "--identity",
        default=os.environ.get("HOSTNAME") or socket.gethostname(),
        help="this replica's name in the Lease (default: $HOSTNAME, the pod's name)",
    )
    run.add_argument("--liveness", default=None, help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument(
        "--calibrator-image",
        default=os.environ.get("KVCAL_CALIBRATOR_IMAGE") or DEFAULT_CALIBRATOR_IMAGE,
        help="calibration Job image when spec.calibration.job.image is unset, and the only one allowed unless "
        f"--allow-calibrator-image-prefix (default: $KVCAL_CALIBRATOR_IMAGE, else {DEFAULT_CALIBRATOR_IMAGE})",
    )
    run.add_argument(
        "--allow-calibrator-image-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="also allow spec.calibration.job.image under this prefix, e.g. registry.example.com/ml/ (repeatable)",
    )
    run.add_argument(
        "--allow-hostpath-prefix",
        action="append",
        default=[],
        metavar="PATH",
        help="allow hostpath:// sources and outputs under this host folder (repeatable); none: hostpath:// disabled",
    )
    run.add_argument(
        "--allowed-vllm-flags",
        default=None,
        metavar="FLAGS",
        help="the vLLM flags spec.serving.canary.extraArgs may pass, comma-separated long names, e.g. "
        "--max-num-seqs,--enforce-eager; empty: none (default: kvcal's tuning flags, docs/security.md)",
    )
    run.add_argument(
        "--prometheus",
        action="append",
        default=[],
        metavar="JSON",
        help="a Prometheus the analysis may query, e.g. "
        '\'{"name": "default", "address": "https://prometheus.monitoring:9090", "caFile": "/path/ca.crt"}\' '
        "(also certFile, keyFile, bearerTokenFile, usernameFile, passwordFile); repeatable, the first is the one a "
        f"spec that names none uses (default: default at {DEFAULT_PROMETHEUS_ADDRESS})",
    )
    run.add_argument(
        "--notify",
        action="append",
        default=[],
        metavar="JSON",
        help="a webhook told of phase changes, e.g. "
        '\'{"name": "ops", "format": "slack", "urlFile": "/path/url", "tokenFile": "/path/token", '
        '"events": ["RolledBack", "Failed"]}\' (format json or slack; events default: all); repeatable '
        "(docs/notifications.md)",
    )
    run.add_argument(
        "--allow-inference-pool",
        action="store_true",
        help="allow spec.serving.traffic.router inference-pool: the chart granted InferencePools (rbac.inferencePool)",
    )
    run.add_argument(
        "--allow-api-key-secrets",
        action="store_true",
        help="the probes may read a baseline's API key from the Secret its VLLM_API_KEY names (the chart's "
        "policy.probes.readApiKeySecrets granted get on Secrets)",
    )
    run.add_argument(
        "--probes-ca-file",
        default=None,
        help="the CA of TLS-serving baselines' vLLM (the chart's policy.probes.tls.caSecret, mounted): the probes "
        "speak HTTPS to them, checking the baseline Service's DNS name",
    )
    run.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG, in-cluster")
    run.add_argument("--verbose", "-v", action="store_true")
    run.set_defaults(func=_run)

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def policy_from_args(args: argparse.Namespace) -> Policy:
    """The security policy from the flags the chart's policy.* values become (templates/deployment.yaml)."""
    # --prometheus, repeated: the first is the default; none given: the policy's own default (kvcal 0.1's address).
    prometheus = [PrometheusAccess.model_validate_json(server) for server in args.prometheus]
    prometheus = prometheus or [Policy().prometheus_default]
    return Policy(
        calibrator_image=args.calibrator_image,
        calibrator_image_prefixes=tuple(args.allow_calibrator_image_prefix),
        host_path_prefixes=tuple(args.allow_hostpath_prefix),
        vllm_flags_allowed=_vllm_flags(args.allowed_vllm_flags),
        prometheus_default=prometheus[0],
        prometheus_additional=tuple(prometheus[1:]),
        inference_pool=args.allow_inference_pool,
        read_api_key_secrets=args.allow_api_key_secrets,
        probes_ca_file=args.probes_ca_file,
    )


def webhooks_from_args(args: argparse.Namespace) -> list[WebhookTarget]:
    """The notification targets from the flags the chart's notifications.webhooks become (templates/deployment.yaml)."""
    targets = [WebhookTarget.model_validate_json(target) for target in args.notify]
    names = [target.name for target in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"--notify: two webhooks share a name ({', '.join(sorted(names))})")
    return targets


def _vllm_flags(flags: str | None) -> tuple[str, ...]:
    """None (the chart predates policy.vllmFlags): kvcal's default list, the one values.yaml shows; "": none."""
    if flags is None:
        return DEFAULT_ALLOWED
    return tuple(flag.strip() for flag in flags.split(",") if flag.strip())


def _run(args: argparse.Namespace) -> int:
    from kvcal.adapters.kube import KubeClient
    from kvcal.handlers.backends import ClusterBackends
    from kvcal.handlers.operator import OperatorOptions, run
    from kvcal.metrics import OperatorMetrics
    from kvcal.services.reconciler import Reconciler

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        policy = policy_from_args(args)
        webhooks = webhooks_from_args(args)
    except (ValidationError, ValueError) as e:
        logging.getLogger(__name__).error("invalid policy or webhooks: %s", e)
        return 2
    logging.getLogger(__name__).info("policy: %s", policy.to_wire())
    api = connect(args.kubeconfig, home=False).api_client  # the named file, else in-cluster
    kube = KubeClient(api)
    reconciler = Reconciler(
        kube,
        clock=lambda: datetime.now(UTC),
        backends=ClusterBackends(kube, policy),
        metrics=OperatorMetrics(),
        policy=policy,
        notifier=_notifier(webhooks),
    )
    options = OperatorOptions(
        namespaces=args.namespace, standalone=args.standalone, metrics_port=args.metrics_port, liveness=args.liveness
    )
    if not args.leader_elect:
        run(reconciler, api, options)
        return 0
    return _run_elected(args, kube, reconciler, api, options)


def _notifier(webhooks: list[WebhookTarget]) -> "Notifier | None":
    from kvcal.adapters.webhook import HttpxPoster
    from kvcal.services.notifier import Notifier

    if not webhooks:
        return None
    logging.getLogger(__name__).info("notifying webhooks %s", ", ".join(target.name for target in webhooks))
    return Notifier(webhooks, HttpxPoster()).start()


def _run_elected(
    args: argparse.Namespace,
    kube: "KubeClient",
    reconciler: "Reconciler",
    api: client.ApiClient,
    options: "OperatorOptions",
) -> int:
    """Metrics from the start (a standby reports kvcal_leader 0), the operator only while leading."""
    from kvcal.handlers.leadership import run_elected
    from kvcal.handlers.operator import OperatorOptions, run
    from kvcal.services.leader import LeaderElector

    elector = LeaderElector(kube, args.lease_namespace, args.lease_name, args.identity, lambda: datetime.now(UTC))
    metrics = reconciler.metrics
    stop_metrics = metrics.serve(options.metrics_port) if metrics and options.metrics_port is not None else None
    leading_options = OperatorOptions(**{**options.__dict__, "metrics_port": None})
    try:
        return run_elected(
            elector,
            lambda stop_flag: run(reconciler, api, leading_options, stop_flag),
            options.liveness,
            on_leading=metrics.set_leader if metrics else lambda _leading: None,
        )
    finally:
        if stop_metrics is not None:
            stop_metrics()
