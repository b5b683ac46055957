"""core.guard.redact: credentials out of anything written from an error (compound key names, quoted values)."""

import pytest

from kvcal.core.guard.redact import redact


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ('{"AccessKeyId": "ASIAY34FZKBOKMUTVV7A", "SecretAccessKey": "wJalr/K7MDENG+bPxRfi"}', "wJalr/K7MDENG+bPxRfi"),
        ('{"AccessKeyId":"id-value-1","Token":"IQoJb3JpZ2luX2Vj"}', "id-value-1"),
        ('{"AccessKeyId":"id-value-1","Token":"IQoJb3JpZ2luX2Vj"}', "IQoJb3JpZ2luX2Vj"),
        ("x-api-key: 0123456789abcdef", "0123456789abcdef"),
        ("X-Auth-Token=tok-9f8e7d", "tok-9f8e7d"),
        ("client_secret='two words'", "two words"),
        ('"password": "correct horse battery"', "horse"),
        ("aws_session_token: FQoGZXIvYXdzEBY", "FQoGZXIvYXdzEBY"),
        ("private_key=-----BEGIN", "-----BEGIN"),
        ("Cookie: session=abc123", "abc123"),
        ("the key AKIAIOSFODNN7EXAMPLE alone", "AKIAIOSFODNN7EXAMPLE"),
        ("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJl", "eyJzdWIiOiJzeXN0ZW06c2EifQ"),
        ('{"token":"a\\"b c"}', "b c"),
    ],
)
def test_secret_values_are_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)


def test_the_keys_stay_and_counts_are_left_alone() -> None:
    body = '{"Code": "Success", "AccessKeyId": "AKIA0000000000000000", "SecretAccessKey": "abc"}'
    assert redact(body) == '{"Code": "Success", "AccessKeyId": "***", "SecretAccessKey": "***"}'
    for text in ("max_tokens=16", "1200 tokens/s", "spec.analysis.prometheus.name: 'thanos'", "HTTP 403"):
        assert redact(text) == text
