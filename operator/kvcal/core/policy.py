"""The operator's security policy: what a KVCalibration may make the operator do on its author's behalf.

Whoever may create a KVCalibration (the chart's aggregated edit role) gets Jobs and a Deployment created by the
operator's ServiceAccount, so the spec must not reach further than its author could alone: no host folders unless a
cluster admin allowed them (chart values policy.hostPath.*), and the calibration Job runs only the chart's calibrator
image (jobImages.calibrator) or images under policy.calibratorImage.allowedPrefixes. The canary (and, promoted, the
baseline) gets only the vLLM flags of policy.vllmFlags.allowed. `check` is pure; decide()
refuses a spec with violations before any child exists. docs/security.md explains the trust model.
"""

from dataclasses import dataclass

from pydantic import field_validator

from kvcal.core import vllm_allowlist
from kvcal.core.manifests.common import DEFAULT_CALIBRATOR_IMAGE, Location, clean_path, locate
from kvcal.models.base import Model
from kvcal.models.spec import KVCalibrationSpec

# The chart values that open the policy (charts/kvcal/values.yaml; a unit test checks they exist there).
HOST_PATH_ENABLED_VALUE = "policy.hostPath.enabled"
HOST_PATH_PREFIXES_VALUE = "policy.hostPath.allowedPrefixes"
IMAGE_PREFIXES_VALUE = "policy.calibratorImage.allowedPrefixes"
VLLM_FLAGS_VALUE = "policy.vllmFlags.allowed"
# Characters that end an image's repository part: a prefix must stop at one (ghcr.io/org matches ghcr.io/org/x and
# ghcr.io/org:1, never ghcr.io/organisation).
_IMAGE_SEPARATORS = "/:@"


class Policy(Model):
    """Set by a cluster admin through the chart; the defaults are the secure ones."""

    calibrator_image: str = DEFAULT_CALIBRATOR_IMAGE
    calibrator_image_prefixes: tuple[str, ...] = ()
    # Host folders a spec may mount; empty: hostpath:// is disabled.
    host_path_prefixes: tuple[str, ...] = ()
    # vLLM flags spec.serving.canary.extraArgs may pass (canonical long names; core.vllm_allowlist).
    vllm_flags_allowed: tuple[str, ...] = vllm_allowlist.DEFAULT_ALLOWED

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


def extra_args_violations(args: list[str], policy: Policy) -> list[Violation]:
    """The extraArgs the allow-list does not let through. Checked on every pass (a tightened policy rolls back what
    runs) and again right before promotion writes them into the baseline (core.lifecycle)."""
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
    return found
