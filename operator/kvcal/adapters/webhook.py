"""Notification webhooks over httpx (ports.WebhookPoster): one POST, its status code, nothing else read back."""

from collections.abc import Mapping

import httpx


class HttpxPoster:
    """Certificates verified against the system CAs; redirects not followed (a receiver elsewhere is a URL nobody
    configured); the environment's proxies and .netrc ignored, like the Prometheus client (adapters.prometheus)."""

    def __init__(self, timeout_seconds: float = 10) -> None:
        self._http = httpx.Client(timeout=timeout_seconds, follow_redirects=False, trust_env=False)

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        with self._http.stream("POST", url, content=body, headers=dict(headers)) as response:
            return response.status_code  # the body is not read

    def close(self) -> None:
        self._http.close()
