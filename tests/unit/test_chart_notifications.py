"""The chart's notifications.webhooks reach the operator as the webhooks it posts to (chart -> --notify flags + Secret
volumes -> WebhookTarget), their URL and token only as read-only files of Secrets: no URL in the values, no Secret
access for the operator's ServiceAccount (tests/unit/test_chart.py checks its RBAC)."""

from pathlib import PurePosixPath
from typing import Any

import pytest

from kvcal.core.notifications import NOTIFY_EVENTS, WebhookTarget
from kvcal.handlers.cli import webhooks_from_args
from tests.support.helm_template import CHART, KUBE_VERSION, helm, one, render, set_args

WEBHOOKS = {
    "notifications.webhooks[0].name": "platform-slack",
    "notifications.webhooks[0].format": "slack",
    "notifications.webhooks[0].urlSecret": "kvcal-slack-webhook",
    "notifications.webhooks[0].events[0]": "RolledBack",
    "notifications.webhooks[0].events[1]": "Failed",
    "notifications.webhooks[1].name": "pager",
    "notifications.webhooks[1].urlSecret": "kvcal-pager-url",
    "notifications.webhooks[1].tokenSecret": "kvcal-pager-token",
}


def operator_webhooks(docs: list[dict[str, Any]]) -> list[WebhookTarget]:
    """Parse the rendered Deployment's command line with the real `kvcal operator run` parser."""
    from kvcal.cli import build_parser

    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    argv = [*container["command"][1:], *container["args"]]
    return webhooks_from_args(build_parser(argv[0]).parse_args(argv))


def test_the_default_chart_notifies_nobody() -> None:
    docs = render()
    assert operator_webhooks(docs) == []
    assert operator_webhooks(render({"notifications": "null"})) == []  # --reuse-values from an older chart
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]


def test_webhooks_and_their_secrets_reach_the_operator() -> None:
    docs = render(WEBHOOKS)
    base = "/etc/kvcal/notify"
    assert operator_webhooks(docs) == [
        WebhookTarget(
            name="platform-slack",
            format="slack",
            url_file=f"{base}/platform-slack/url/url",
            events=("RolledBack", "Failed"),
        ),
        WebhookTarget(
            name="pager",
            format="json",
            url_file=f"{base}/pager/url/url",
            token_file=f"{base}/pager/token/token",
            events=NOTIFY_EVENTS,
        ),
    ]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    read = []
    for target in operator_webhooks(docs):
        for path in (target.url_file, target.token_file):
            if path is None:
                continue
            file = PurePosixPath(path)
            mount = mounts[str(file.parent)]
            secret = volumes[mount["name"]]["secret"]
            assert mount["readOnly"] is True and secret["defaultMode"] == 0o440
            assert secret["items"] == [{"key": file.name, "path": file.name}]
            read.append((secret["secretName"], file.name))
    assert read == [("kvcal-slack-webhook", "url"), ("kvcal-pager-url", "url"), ("kvcal-pager-token", "token")]
    assert len(volumes) == 1 + 3 and len(container["volumeMounts"]) == 1 + 3  # tmp + one per Secret


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"notifications.webhooks[0].name": "x"}, "urlSecret"),
        ({"notifications.webhooks[0].name": "x", "notifications.webhooks[0].urlSecret": ""}, "urlSecret"),
        (
            {"notifications.webhooks[0].name": "x", "notifications.webhooks[0].urlSecret": "s",
             "notifications.webhooks[0].url": "https://hooks.example.com/x"},
            "url",
        ),
        (
            {"notifications.webhooks[0].name": "x", "notifications.webhooks[0].urlSecret": "s",
             "notifications.webhooks[0].format": "teams"},
            "format",
        ),
        (
            {"notifications.webhooks[0].name": "x", "notifications.webhooks[0].urlSecret": "s",
             "notifications.webhooks[0].events[0]": "Calibrating"},
            "events",
        ),
        ({"notifications.webhooks[0].name": "X", "notifications.webhooks[0].urlSecret": "s"}, "name"),
        (
            {"notifications.webhooks[0].name": "x", "notifications.webhooks[0].urlSecret": "s",
             "notifications.webhooks[1].name": "x", "notifications.webhooks[1].urlSecret": "t"},
            "two webhooks are named x",
        ),
        (
            {f"notifications.webhooks[{i}].{key}": f"w{i}" for i in range(9) for key in ("name", "urlSecret")},
            "webhooks",
        ),
    ],
    ids=["no-secret", "empty-secret", "plain-url", "format", "event", "name", "same-name", "too-many"],
)  # fmt: skip
def test_the_schema_refuses_bad_webhooks(values: dict[str, str], expected: str) -> None:
    proc = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, *set_args(values), check=False)
    assert proc.returncode != 0, f"helm accepted {values}"
    assert expected in proc.stderr, proc.stderr
