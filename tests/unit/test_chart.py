"""The Helm chart, rendered and linted by the real helm binary: security context, least-privilege RBAC, schema."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.helm_template import (
    CHART,
    KUBE_VERSION,
    LEADER_ELECTION,
    helm,
    is_leader_election,
    is_user_role,
    one,
    render,
    set_args,
)


def operator_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("ClusterRole", "Role") and not is_user_role(d)]


def rbac_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for d in operator_roles(docs) for r in d["rules"]]


NAMESPACED = {"rbac.scope": "namespace", "watchNamespace": "team-a"}


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def namespaced_docs() -> list[dict[str, Any]]:
    return render(NAMESPACED)


@pytest.mark.parametrize("values", [{}, NAMESPACED, {"prometheusRule.enabled": "true"}], ids=["default", "ns", "rules"])
def test_helm_lint_strict(values: dict[str, str]) -> None:
    helm("lint", "--strict", str(CHART), *set_args(values))


def test_chart_ships_the_crd_unchanged() -> None:
    source = CHART.parents[1] / "crds" / "kvcal.dev_kvcalibrations.yaml"
    assert (CHART / "crds" / source.name).read_bytes() == source.read_bytes(), "charts/kvcal/crds/ is stale"


def test_operator_deployment_is_single_recreate_and_hardened(default_docs: list[dict[str, Any]]) -> None:
    dep = one(default_docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]["memory"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9090, "health": 8080}
    assert container["command"] == ["kvcal", "operator", "run"]
    args = container["args"]
    assert "--standalone" in args and not [a for a in args if a.startswith("--namespace")]
    assert "--metrics-port=9090" in args and "--liveness=http://0.0.0.0:8080/healthz" in args
    # Read-only root: the only writable path is an emptyDir at /tmp.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["serviceAccountName"] == one(default_docs, "ServiceAccount")["metadata"]["name"]


def test_image_defaults_to_app_version_and_digest_wins() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    image = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(f":{app_version}")
    digest = "sha256:" + "a" * 64
    pinned = one(render({"image.digest": digest}), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert pinned["image"].endswith(f"@{digest}")


def test_cluster_scope_binds_a_cluster_role(default_docs: list[dict[str, Any]]) -> None:
    assert not [d for d in default_docs if d["kind"] in ("Role", "RoleBinding") and not is_leader_election(d)]
    binding = one(default_docs, "ClusterRoleBinding")
    sa = one(default_docs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": "kvcal-system"}]
    assert binding["roleRef"]["name"] == one(default_docs, "ClusterRole")["metadata"]["name"]


def test_namespace_scope_uses_a_role_in_the_watched_namespace(namespaced_docs: list[dict[str, Any]]) -> None:
    role = one(namespaced_docs, "Role")
    assert role["metadata"]["namespace"] == "team-a"
    assert one(namespaced_docs, "RoleBinding")["metadata"]["namespace"] == "team-a"
    args = one(namespaced_docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a"]
    # The only cluster-scoped grants left, all read-only: CRDs and namespaces for kopf's discovery, GatewayClasses
    # for the shadow stage (can the route's gateway mirror?).
    (cluster_role,) = [d for d in operator_roles(namespaced_docs) if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["gatewayclasses"], "verbs": ["get"]},
    ]
    without = render({**NAMESPACED, "rbac.clusterDiscovery": "false", "rbac.aggregateToDefaultRoles": "false"})
    assert not [d for d in without if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_role_holds_exactly_the_cluster_roles_namespaced_rules(
    default_docs: list[dict[str, Any]], namespaced_docs: list[dict[str, Any]]
) -> None:
    cluster_rules = one(default_docs, "ClusterRole")["rules"]
    role_rules = one(namespaced_docs, "Role")["rules"]
    discovery = one(namespaced_docs, "ClusterRole")["rules"]
    assert role_rules + discovery == cluster_rules


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster", "ns"])
def test_every_replica_runs_leader_election_on_its_own_lease(values: dict[str, str]) -> None:
    docs = render({**values, "replicaCount": "2"})
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}  # the new pod stands by: no overlap in acting
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args and "--identity=$(KVCAL_POD_NAME)" in args
    (lease_arg,) = [a for a in args if a.startswith("--lease-name=")]
    role = one(docs, "Role", LEADER_ELECTION)
    assert role["metadata"]["namespace"] == "kvcal-system"  # KVCAL_OPERATOR_NAMESPACE: the pod's namespace
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease_arg.split("=", 1)[1]],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(docs, "RoleBinding", LEADER_ELECTION)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == one(docs, "ServiceAccount")["metadata"]["name"]


def test_namespace_scope_defaults_to_the_release_namespace() -> None:
    role = one(render({"rbac.scope": "namespace"}, namespace="ml-serving"), "Role")
    assert role["metadata"]["namespace"] == "ml-serving"


@pytest.mark.parametrize("docs_fixture", ["default_docs", "namespaced_docs"])
def test_rbac_has_no_wildcards_and_no_secrets(docs_fixture: str, request: pytest.FixtureRequest) -> None:
    rules = rbac_rules(request.getfixturevalue(docs_fixture))
    assert rules
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        assert not {"secrets", "pods/exec", "serviceaccounts/token"} & set(rule["resources"]), rule
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), rule
        assert "nonResourceURLs" not in rule


def granted(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}


def test_rbac_grants_what_the_operator_calls(default_docs: list[dict[str, Any]]) -> None:
    rules = rbac_rules(default_docs)
    assert {"get", "list", "watch", "patch", "update"} <= granted(rules, "kvcal.dev", "kvcalibrations")
    assert {"patch", "update"} <= granted(rules, "kvcal.dev", "kvcalibrations/status")
    assert {"create", "get", "list", "watch", "delete", "patch"} <= granted(rules, "batch", "jobs")
    assert {"create", "get", "list", "watch", "delete", "patch"} <= granted(rules, "", "configmaps")
    assert {"create", "get", "list", "watch", "delete", "patch"} <= granted(rules, "apps", "deployments")
    # A StatefulSet baseline (spec.serving.baseline.kind): the same verbs as a Deployment, no update (SSA is a patch).
    assert {"create", "get", "list", "watch", "delete", "patch"} == granted(rules, "apps", "statefulsets")
    assert {"create"} == granted(rules, "", "events")
    assert {"get", "list", "watch"} == granted(rules, "", "pods")
    assert {"get", "list", "create", "patch", "delete"} == granted(rules, "", "services")
    assert {"get", "patch"} == granted(rules, "gateway.networking.k8s.io", "httproutes")
    # The operator never deletes or creates a KVCalibration: those belong to users and Git.
    assert not {"create", "delete"} & granted(rules, "kvcal.dev", "kvcalibrations")


def test_user_roles_aggregate_into_edit_and_view(default_docs: list[dict[str, Any]]) -> None:
    users = {
        d["metadata"]["name"].rsplit("-", 1)[1]: d
        for d in default_docs
        if d["kind"] == "ClusterRole" and is_user_role(d)
    }
    assert set(users) == {"edit", "view"}
    assert users["edit"]["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert users["view"]["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {v for r in users["view"]["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    for role in users.values():
        assert all("*" not in r[f] for r in role["rules"] for f in ("apiGroups", "resources", "verbs"))
        assert {g for r in role["rules"] for g in r["apiGroups"]} == {"kvcal.dev"}


def test_gateway_api_grant_is_optional() -> None:
    rules = rbac_rules(render({"rbac.gatewayApi": "false"}))
    for resource in ("httproutes", "gateways", "gatewayclasses"):
        assert not granted(rules, "gateway.networking.k8s.io", resource)


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_the_shadow_stage_reads_gateways_and_their_classes_only(scope: str) -> None:
    docs = render({"rbac.scope": scope, "watchNamespace": "llm"})
    rules = [r for d in docs if d["kind"] in ("Role", "ClusterRole") and "rules" in d for r in d["rules"]]
    gateway_rules = [r for r in rules if r["apiGroups"] == ["gateway.networking.k8s.io"]]
    verbs = {resource: set(r["verbs"]) for r in gateway_rules for resource in r["resources"]}
    assert verbs == {"httproutes": {"get", "patch"}, "gateways": {"get"}, "gatewayclasses": {"get"}}


def operator_args(docs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_inference_pool_grant_and_flag_only_when_the_admin_allows_it(scope: str) -> None:
    """Off by default: no InferencePool verb and no --allow-inference-pool, so the operator refuses the router
    (core.guard.policy). On: exactly the verbs the operator uses (get the baseline's pool, create and delete the
    canary's)."""
    closed = render({"rbac.scope": scope})
    assert not granted(rbac_rules(closed), "inference.networking.k8s.io", "inferencepools")
    assert "--allow-inference-pool" not in operator_args(closed)
    opened = render({"rbac.scope": scope, "rbac.inferencePool": "true"})
    assert granted(rbac_rules(opened), "inference.networking.k8s.io", "inferencepools") == {"get", "create", "delete"}
    assert "--allow-inference-pool" in operator_args(opened)


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_secret_reads_for_api_keys_only_when_the_admin_allows_it(scope: str) -> None:
    """Off by default (no Secret verb at all: the test above); on: get on Secrets, nothing else, and the operator is
    told (--allow-api-key-secrets) so that it reads a baseline's API key from the Secret its VLLM_API_KEY names."""
    closed = render({"rbac.scope": scope})
    assert not granted(rbac_rules(closed), "", "secrets")
    assert "--allow-api-key-secrets" not in operator_args(closed)
    opened = render({"rbac.scope": scope, "policy.probes.readApiKeySecrets": "true"})
    assert granted(rbac_rules(opened), "", "secrets") == {"get"}
    assert "--allow-api-key-secrets" in operator_args(opened)


def test_the_probes_ca_is_mounted_only_when_named() -> None:
    """policy.probes.tls.caSecret: the Secret's ca.crt mounted read-only and passed as --probes-ca-file; no Secret
    permission comes with it (the kubelet mounts it)."""
    assert not any(arg.startswith("--probes-ca-file") for arg in operator_args(render({})))
    docs = render({"policy.probes.tls.caSecret": "vllm-serving-ca"})
    assert "--probes-ca-file=/etc/kvcal/probes/ca.crt" in operator_args(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "probes-ca"]
    assert volume["secret"] == {"secretName": "vllm-serving-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                "defaultMode": 0o440}  # fmt: skip
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "probes-ca", "mountPath": "/etc/kvcal/probes", "readOnly": True} in mounts
    assert not granted(rbac_rules(docs), "", "secrets")


def test_metrics_service_targets_the_operator(default_docs: list[dict[str, Any]]) -> None:
    svc = one(default_docs, "Service", "-metrics")
    dep = one(default_docs, "Deployment")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]


def test_service_monitor_and_rules_are_optional(default_docs: list[dict[str, Any]]) -> None:
    assert not [d for d in default_docs if d["kind"] in ("ServiceMonitor", "PrometheusRule")]
    docs = render({"metrics.serviceMonitor.enabled": "true", "prometheusRule.enabled": "true"})
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    svc_labels = one(docs, "Service", "-metrics")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc_labels.items()
    alerts = {r["alert"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert {"KVCalibrationPhaseStuck", "KVCalibrationRepeatedRollbacks", "KVCalibrationReconcileErrors"} <= alerts


def test_service_monitor_without_service_is_refused() -> None:
    values = {"metrics.serviceMonitor.enabled": "true", "metrics.service.enabled": "false"}
    proc = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, *set_args(values), check=False)
    assert proc.returncode != 0
    assert "metrics.service.enabled" in proc.stderr


def test_stuck_phase_threshold_reaches_the_alert() -> None:
    docs = render({"prometheusRule.enabled": "true", "prometheusRule.stuckPhaseMinutes": "45"})
    rules = [r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    stuck = next(r for r in rules if r["alert"] == "KVCalibrationPhaseStuck")
    assert stuck["expr"].count("[45m]") == 2


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"rbac.scope": "everything"}, "scope"),
        ({"image.tag": "latest"}, "tag"),
        ({"image.digest": "sha256:short"}, "digest"),
        ({"securityContext.runAsUser": "0"}, "runAsUser"),
        ({"metrics.port": "80"}, "port"),
        ({"replicas": "2"}, "replicas"),
        ({"extraArgs[0]": "rm"}, "extraArgs"),
        ({"policy.vllmFlags.allowed[0]": "-tp"}, "vllmFlags"),
        ({"policy.vllmFlags.allowed[0]": "--max_num_seqs"}, "vllmFlags"),
        ({"watchNamespace": "Not_A_Namespace"}, "watchNamespace"),
        ({"jobImages.calibrator": "ghcr.io/kvcal/kvcal-calibrator"}, "calibrator"),
        ({"resources.limits.memory": "lots"}, "memory"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_schema_rejects_bad_values(values: dict[str, str], field: str) -> None:
    proc = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, *set_args(values), check=False)
    assert proc.returncode != 0, f"helm accepted {values}"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert field in proc.stderr, proc.stderr


def test_job_images_reach_the_operator(default_docs: list[dict[str, Any]]) -> None:
    container = one(default_docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert env["KVCAL_CALIBRATOR_IMAGE"] == values["jobImages"]["calibrator"]


@pytest.mark.parametrize("docs_fixture", ["default_docs", "namespaced_docs"])
def test_operator_command_line_parses(
    docs_fixture: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Deployment's command and args are accepted by the real `kvcal operator run` parser."""
    from kvcal.cli import build_parser

    container = one(request.getfixturevalue(docs_fixture), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    argv = [*container["command"][1:], *container["args"]]
    try:
        args = build_parser(argv[0]).parse_args(argv)
    except SystemExit:
        pytest.fail(f"`kvcal {' '.join(argv)}` is refused by the operator's parser: {capsys.readouterr().err}")
    assert callable(args.func)


def test_the_vllm_flag_allow_list_reaches_the_operator(tmp_path: Path) -> None:
    """policy.vllmFlags.allowed as the operator's own parser reads the Deployment: the default list, an admin's list,
    and [] (none allowed); a release whose values predate the key gets the operator's default, the same list."""
    from kvcal.cli import build_parser
    from kvcal.core.guard.vllm_allowlist import DEFAULT_ALLOWED
    from kvcal.handlers.cli import policy_from_args

    def allowed(docs: list[dict[str, Any]]) -> tuple[str, ...]:
        container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        argv = [*container["command"][1:], *container["args"]]
        return policy_from_args(build_parser(argv[0]).parse_args(argv)).vllm_flags_allowed

    assert allowed(render()) == DEFAULT_ALLOWED
    assert allowed(render({"policy.vllmFlags.allowed[0]": "--seed"})) == ("--seed",)
    (tmp_path / "none.yaml").write_text("policy:\n  vllmFlags:\n    allowed: []\n")
    out = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(tmp_path / "none.yaml")).stdout
    assert allowed([d for d in yaml.safe_load_all(out) if d]) == ()
