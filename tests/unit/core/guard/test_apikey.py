"""The API key a baseline's vLLM asks for, read from its container (core.guard.apikey)."""

from typing import Any

import pytest

from kvcal.core.guard.apikey import SecretKey, api_key_source, serves_tls


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({"args": ["--model", "/m", "--api-key", "k1"]}, "k1"),
        ({"args": ["--api-key=k2"]}, "k2"),
        ({"command": ["vllm", "serve", "/m", "--api_key", "k3"]}, "k3"),  # vLLM accepts the underscore spelling
        ({"args": ["--api-key", "old", "--api-key", "new"]}, "new"),  # the last wins, as in vLLM
        ({"env": [{"name": "VLLM_API_KEY", "value": "k4"}]}, "k4"),
        ({"env": [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm", "key": "token"}}}]},
         SecretKey("vllm", "token")),
        ({"args": ["--api-key", "flag"], "env": [{"name": "VLLM_API_KEY", "value": "env"}]}, "flag"),
        ({"args": ["--model", "/m"], "env": [{"name": "OTHER", "value": "x"}]}, None),
    ],
)  # fmt: skip
def test_the_key_vllm_asks_for(container: dict[str, Any], expected: object) -> None:
    assert api_key_source(container) == expected


def test_tls_is_seen_in_any_spelling() -> None:
    assert serves_tls({"args": ["--ssl-keyfile=/tls/key.pem", "--ssl-certfile", "/tls/cert.pem"]})
    assert not serves_tls({"args": ["--model", "/m"]})
