"""How the baseline's vLLM asks clients to authenticate, read from its container (pure): ``--api-key`` in its
arguments, or the ``VLLM_API_KEY`` environment variable (a value, or a reference to a Secret). The quality probes
answer with the same key to the baseline and to the canary, which copies the baseline's container; a key from a
Secret is read only where the chart's policy allows (policy.probes.readApiKeySecrets)."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvcal import vllm_flags

API_KEY = vllm_flags.Flag(("--api-key",), "set it on the baseline Deployment, which the canary copies")
# vLLM serves HTTPS with these; the probes do not speak it yet.
TLS_FLAGS = (vllm_flags.Flag(("--ssl-keyfile",), ""), vllm_flags.Flag(("--ssl-certfile",), ""))
API_KEY_ENV = "VLLM_API_KEY"


@dataclass(frozen=True)
class SecretKey:
    """The key is in a Secret of the baseline's namespace."""

    name: str
    key: str


ApiKey = str | SecretKey | None  # the key itself, where to read it, or no key asked


def api_key_source(container: Mapping[str, Any]) -> ApiKey:
    """The key the container's vLLM asks for: ``--api-key`` (the last, in any spelling vLLM accepts) before
    ``VLLM_API_KEY`` (as vLLM reads them), or None."""
    args = [*map(str, container.get("command") or []), *map(str, container.get("args") or [])]
    given = vllm_flags.find(args, API_KEY)
    if given is not None:
        return given.value
    for env in container.get("env") or []:
        if env.get("name") != API_KEY_ENV:
            continue
        if "value" in env:
            return str(env["value"])
        ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name") and ref.get("key"):
            return SecretKey(str(ref["name"]), str(ref["key"]))
    return None


def serves_tls(container: Mapping[str, Any]) -> bool:
    args = [*map(str, container.get("command") or []), *map(str, container.get("args") or [])]
    return any(vllm_flags.find(args, flag) is not None for flag in TLS_FLAGS)
