"""The operator's security policy: what a KVCalibration may make the operator do on its author's behalf.

Whoever may create a KVCalibration (the chart's aggregated edit role) gets Jobs and a Deployment created by the
operator's ServiceAccount, so the spec must not reach further than its author could alone: no host folders unless a
cluster admin allowed them (chart values policy.hostPath.*), and the calibration Job runs only the chart's calibrator
image (jobImages.calibrator) or images under policy.calibratorImage.allowedPrefixes. The canary (and, promoted, the
baseline) gets only the vLLM flags of policy.vllmFlags.allowed. `check` is pure; decide()
refuses a spec with violations before any child exists. docs/security.md explains the trust model.
"""

from dataclasses import dataclass

from pydantic import Field, field_validator, model_validator

from kvcal.core.guard import vllm_allowlist
from kvcal.core.guard.redact import redact
from kvcal.core.manifests.common import DEFAULT_CALIBRATOR_IMAGE, Location, clean_path, locate
from kvcal.models.base import Model
from kvcal.models.spec import DNS_LABEL_PATTERN, PROMETHEUS_URL_PATTERN, KVCalibrationSpec, PrometheusRef

# The chart values that open the policy (charts/kvcal/values.yaml; a unit test checks they exist there).
HOST_PATH_ENABLED_VALUE = "policy.hostPath.enabled"
HOST_PATH_PREFIXES_VALUE = "policy.hostPath.allowedPrefixes"
IMAGE_PREFIXES_VALUE = "policy.calibratorImage.allowedPrefixes"
VLLM_FLAGS_VALUE = "policy.vllmFlags.allowed"
PROMETHEUS_DEFAULT_VALUE = "policy.prometheus.default"
PROMETHEUS_ADDITIONAL_VALUE = "policy.prometheus.additional"
# Grants the operator InferencePools (router inference-pool: a canary pool and its endpoint picker, docs/security.md).
INFERENCE_POOL_VALUE = "rbac.inferencePool"
# kvcal 0.1's CRD default of spec.analysis.prometheus.address, stored in every object created then: the chart's default
# Prometheus is this address too, so those objects keep working (docs/operations.md, Upgrade).
DEFAULT_PROMETHEUS_ADDRESS = "http://prometheus.monitoring:9090"
# Characters that end an image's repository part: a prefix must stop at one (ghcr.io/org matches ghcr.io/org/x and
# ghcr.io/org:1, never ghcr.io/organisation).
_IMAGE_SEPARATORS = "/:@"


class PrometheusAccess(Model):
    """One Prometheus the operator may query, as a cluster admin configured it (chart values policy.prometheus.*): its
    address and how to reach it. The files are the chart's mounts of Secrets of the operator's namespace, read at
    every connection, so a rotated Secret is used without a restart."""

    name: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    address: str = Field(max_length=1024, pattern=PROMETHEUS_URL_PATTERN)
    ca_file: str | None = None  # PEM bundle that signs the server's certificate; None: the image's system CAs
    cert_file: str | None = None  # client certificate and its key, for a Prometheus that asks for one
    key_file: str | None = None
    bearer_token_file: str | None = None  # Authorization: Bearer <the file's content>
    username_file: str | None = None  # basic auth
    password_file: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "PrometheusAccess":
        where = f"Prometheus {self.name!r}"
        if "@" in self.address.partition("://")[2].split("/")[0]:
            raise ValueError(f"{where}: credentials belong in a Secret, not in the address")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(f"{where}: a client certificate needs both its certificate and its key")
        if (self.username_file is None) != (self.password_file is None):
            raise ValueError(f"{where}: basic auth needs both a username and a password")
        if self.bearer_token_file is not None and self.username_file is not None:
            raise ValueError(f"{where}: a bearer token or basic auth, not both")
        tls_or_secrets = (self.ca_file, self.cert_file, self.bearer_token_file, self.username_file)
        if any(f is not None for f in tls_or_secrets) and not self.address.startswith("https://"):
            # Over plain HTTP the credentials would cross the network in clear, and a CA would check nothing.
            raise ValueError(f"{where}: credentials and TLS settings need an https:// address")
        return self

    def has_address(self, address: str) -> bool:
        """The exact address (a trailing / aside: it names the same API root)."""
        return address.rstrip("/") == self.address.rstrip("/")


class Policy(Model):
    """Set by a cluster admin through the chart; the defaults are the secure ones."""

    calibrator_image: str = DEFAULT_CALIBRATOR_IMAGE
    calibrator_image_prefixes: tuple[str, ...] = ()
    # Host folders a spec may mount; empty: hostpath:// is disabled.
    host_path_prefixes: tuple[str, ...] = ()
    # vLLM flags spec.serving.canary.extraArgs may pass (canonical long names; core.guard.vllm_allowlist).
    vllm_flags_allowed: tuple[str, ...] = vllm_allowlist.DEFAULT_ALLOWED
    # The Prometheus an analysis queries when its spec names none, and the others a spec may pick (by name or exact
    # address); no other URL is ever fetched.
    prometheus_default: PrometheusAccess = PrometheusAccess(name="default", address=DEFAULT_PROMETHEUS_ADDRESS)
    prometheus_additional: tuple[PrometheusAccess, ...] = ()
    # router inference-pool: the chart granted InferencePools (rbac.inferencePool), so the operator may create a canary
    # pool and copy the baseline's endpoint picker.
    inference_pool: bool = False
    # The quality probes may read the API key a baseline's vLLM takes from a Secret (policy.probes.readApiKeySecrets:
    # the chart then grants get on Secrets); without it such a baseline is not probed and the measurement says why.
    read_api_key_secrets: bool = False
    # The CA file (mounted from policy.probes.tls.caSecret) of TLS-serving baselines; None: such a baseline is not
    # probed.
    probes_ca_file: str | None = None

    @field_validator("host_path_prefixes")
    @classmethod
    def _absolute_clean(cls, prefixes: tuple[str, ...]) -> tuple[str, ...]:
        for prefix in prefixes:
            if not prefix.startswith("/"):
                raise ValueError(f"{HOST_PATH_PREFIXES_VALUE}: {prefix!r} must be an absolute path")
        return tuple(clean_path(p, field=HOST_PATH_PREFIXES_VALUE) for p in prefixes)

    @field_validator("calibrator_image_prefixes")
    @classmethod
    def _non_empty(cls, prefixes: tuple[str, ...]) -> tuple[str, ...]:
        if any(not p.strip() for p in prefixes):
            raise ValueError(f"{IMAGE_PREFIXES_VALUE}: an empty prefix would allow every image")
        return prefixes

    @field_validator("vllm_flags_allowed")
    @classmethod
    def _allowable_flags(cls, flags: tuple[str, ...]) -> tuple[str, ...]:
        problems = [why for why in map(vllm_allowlist.unallowable, flags) if why]
        if problems:
            raise ValueError(f"{VLLM_FLAGS_VALUE}: " + "; ".join(problems))
        return flags

    @model_validator(mode="after")
    def _prometheus_unambiguous(self) -> "Policy":
        # A spec picks one by name or by address: each must name exactly one.
        servers = self.prometheus_servers
        for what, keys in (("name", [s.name for s in servers]), ("address", [s.address.rstrip("/") for s in servers])):
            if len(set(keys)) != len(keys):
                raise ValueError(f"{PROMETHEUS_ADDITIONAL_VALUE}: two Prometheus servers have the same {what}")
        return self

    @property
    def prometheus_servers(self) -> tuple[PrometheusAccess, ...]:
        return (self.prometheus_default, *self.prometheus_additional)


@dataclass(frozen=True)
class Violation:
    field: str
    message: str  # names the field and, for a policy refusal, the chart value that would allow it
    chart_value: str | None = None  # None: the spec itself is wrong, no policy value can allow it

    def __str__(self) -> str:
        return self.message


def _allow_hint(value: str) -> str:
    return f"a cluster admin can allow it with the chart value {value}"


def host_path_allowed(path: str, prefixes: tuple[str, ...]) -> bool:
    """Prefix match on whole segments of cleaned paths: /data allows /data and /data/x, not /database."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def image_allowed(image: str, policy: Policy) -> bool:
    if image == policy.calibrator_image:
        return True
    for prefix in policy.calibrator_image_prefixes:
        if image == prefix or (
            image.startswith(prefix) and (prefix[-1] in _IMAGE_SEPARATORS or image[len(prefix)] in _IMAGE_SEPARATORS)
        ):
            return True
    return False


def _host_path_violation(field: str, location: Location, policy: Policy) -> Violation | None:
    host = (location.volume or {}).get("hostPath")
    if host is None:
        return None
    if not policy.host_path_prefixes:
        hint = _allow_hint(f"{HOST_PATH_ENABLED_VALUE}=true (and {HOST_PATH_PREFIXES_VALUE})")
        return Violation(
            field, f"{field}: hostpath:// is disabled by the operator's policy; {hint}", HOST_PATH_ENABLED_VALUE
        )
    if host_path_allowed(host["path"], policy.host_path_prefixes):
        return None
    allowed = ", ".join(policy.host_path_prefixes)
    message = (
        f"{field}: host folder {host['path']} is outside the operator's allowed prefixes ({allowed}); "
        + _allow_hint(HOST_PATH_PREFIXES_VALUE)
    )
    return Violation(field, message, HOST_PATH_PREFIXES_VALUE)


def _segments(location: Location) -> tuple[str, ...] | None:
    """Where a location points, as comparable segments (scheme first); None for a ConfigMap key (never written)."""
    scheme, _, rest = location.uri.partition("://")
    if scheme == "configmap":
        return None
    if scheme == "hostpath":
        host = (location.volume or {})["hostPath"]["path"]
        inside = location.path.removeprefix(str(location.mount_path))
        return (scheme, *(s for s in (host + inside).split("/") if s))
    return (scheme, *(s for s in rest.split("/") if s not in ("", ".")))


def _within(inner: tuple[str, ...], outer: tuple[str, ...]) -> bool:
    return inner[: len(outer)] == outer


def _overlaps(model: Location, dataset: Location, output: Location) -> list[Violation]:
    """The calibrator empties its output folder first: it must hold neither the model nor the prompts, and it must
    not sit inside the model (which stays read-only)."""
    out, src, data = _segments(output), _segments(model), _segments(dataset)
    found: list[Violation] = []
    field = "spec.calibration.output"
    if out is not None and src is not None and (_within(out, src) or _within(src, out)):
        found.append(
            Violation(field, f"{field}: must be a folder of its own, neither spec.model.source nor inside or around it")
        )
    if out is not None and data is not None and _within(data, out):
        found.append(
            Violation(field, f"{field}: must not contain spec.calibration.dataset.source (it is emptied first)")
        )
    return found


def resolve_prometheus(ref: PrometheusRef, policy: Policy) -> PrometheusAccess | None:
    """The configured Prometheus `ref` picks (by name, by exact address, both naming the same one, or neither: the
    default); None when it picks none. The operator then queries that entry's address with its credentials, never a
    string from the spec."""
    by_name = next((s for s in policy.prometheus_servers if s.name == ref.name), None)
    by_address = next((s for s in policy.prometheus_servers if ref.address and s.has_address(ref.address)), None)
    if ref.name is not None and ref.address is not None:
        return by_name if by_name is not None and by_name == by_address else None
    if ref.name is not None:
        return by_name
    if ref.address is not None:
        return by_address
    return policy.prometheus_default


def _prometheus_violation(ref: PrometheusRef, policy: Policy) -> Violation | None:
    if resolve_prometheus(ref, policy) is not None:
        return None
    name_ok = ref.name is not None and resolve_prometheus(PrometheusRef(name=ref.name), policy) is not None
    address_ok = ref.address is not None and resolve_prometheus(PrometheusRef(address=ref.address), policy) is not None
    if name_ok and address_ok:
        field = "spec.analysis.prometheus"
        return Violation(field, f"{field}: name and address pick two different Prometheus servers; set one")
    if ref.name is not None and not name_ok:
        field, picked = "spec.analysis.prometheus.name", repr(ref.name)
    else:
        field, picked = "spec.analysis.prometheus.address", redact(str(ref.address))[:200]
    known = ", ".join(f"{s.name} ({s.address})" for s in policy.prometheus_servers)
    hint = _allow_hint(f"{PROMETHEUS_ADDITIONAL_VALUE} (or {PROMETHEUS_DEFAULT_VALUE})")
    message = f"{field}: {picked} is not a Prometheus the operator may query (configured: {known}); {hint}"
    return Violation(field, message, PROMETHEUS_ADDITIONAL_VALUE)


def extra_args_violations(args: list[str], policy: Policy) -> list[Violation]:
    """The extraArgs the allow-list does not let through. Checked on every pass (a tightened policy rolls back what
    runs) and again right before promotion writes them into the baseline (core.rollout.machine)."""
    allowed = vllm_allowlist.allowed_names(policy.vllm_flags_allowed)
    found: list[Violation] = []
    for refusal in vllm_allowlist.refusals(args, allowed):
        field = f"spec.serving.canary.extraArgs[{refusal.index}]"
        if refusal.policy:
            message = f"{field}: {refusal.message}; " + _allow_hint(VLLM_FLAGS_VALUE)
            found.append(Violation(field, message, VLLM_FLAGS_VALUE))
        else:
            found.append(Violation(field, f"{field}: {refusal.message}"))
    return found


def check(spec: KVCalibrationSpec, policy: Policy) -> list[Violation]:
    """Everything in `spec` the operator must refuse, each naming its field (and the chart value that allows it)."""
    found: list[Violation] = []
    fields = [
        ("spec.model.source", spec.model.source, True),
        ("spec.calibration.dataset.source", spec.calibration.dataset.source, False),
        ("spec.calibration.output", spec.calibration.output, True),
    ]
    locations: list[Location] = []
    for field, uri, directory in fields:
        if ".." in uri.partition("://")[2].split("/"):
            found.append(Violation(field, f"{field}: {uri!r} has a '..' path segment; name the folder without '..'"))
            continue
        try:
            location = locate(uri, field=field, directory=directory)
        except ValueError as e:
            found.append(Violation(field, str(e)))
            continue
        locations.append(location)
        denied = _host_path_violation(field, location, policy)
        if denied is not None:
            found.append(denied)
    if len(locations) == len(fields):
        found += _overlaps(*locations)
    image = spec.calibration.job.image or policy.calibrator_image
    if not image_allowed(image, policy):
        field = "spec.calibration.job.image"
        message = (
            f"{field}: {image} is not the operator's calibrator image ({policy.calibrator_image}); "
            + _allow_hint(IMAGE_PREFIXES_VALUE)
        )
        found.append(Violation(field, message, IMAGE_PREFIXES_VALUE))
    found += extra_args_violations(spec.serving.canary.extra_args, policy)
    prometheus = _prometheus_violation(spec.analysis.prometheus, policy)
    if prometheus is not None:
        found.append(prometheus)
    if spec.serving.traffic.router == "inference-pool" and not policy.inference_pool:
        field = "spec.serving.traffic.router"
        message = (
            f"{field}: inference-pool is not enabled in this operator (it creates an InferencePool and a copy of the "
            "baseline's endpoint picker); " + _allow_hint(f"{INFERENCE_POOL_VALUE}=true")
        )
        found.append(Violation(field, message, INFERENCE_POOL_VALUE))
    return found
