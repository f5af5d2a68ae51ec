"""The scripted model and the Responses fake (tests/support/codex_script.py, tests/support/responses_api.py)
against the real Codex binary, with no proxy between them: Codex takes the stream as the API's,
runs the calls, and round-trips the reasoning items; and a refusal reaches Codex as the error it
would get from the API — the guard that "Codex saw no error" in the proxy tests is not vacuous.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.codex import run_codex
from tests.e2e.codex_sessions import codex_steps, elements
from tests.support.codex_script import CodexScript, request_kind
from tests.support.fakeprovider import FakeProvider

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def test_the_scripted_model_drives_real_codex_over_the_responses_stream(codex, fake, tmp_path):
    script = CodexScript(f"CG-{tmp_path.name}", codex_steps(7))
    fake.responder = script
    run = run_codex(codex, f"{script.tag}: run the steps.", tmp_path, fake.url + "/v1")
    run.assert_succeeded()
    assert run.final_message == script.final_text
    assert script.refusals == []
    assert [a.step for a in script.answers] == list(range(8))
    # Codex ran every command (two at once at step 3) and showed the preambles.
    commands = [i["command"] for i in run.items("command_execution")]
    assert len(commands) == 8 and all(i["exit_code"] == 0 for i in run.items("command_execution"))
    assert any("echo step 3b" in c for c in commands)
    messages = [i["text"] for i in run.items("agent_message")]
    assert messages[:2] == [
        "Preamble before step 2: running a command.",
        "Preamble before step 7: running a command.",
    ]
    # It re-sent every reasoning item, its encrypted content unchanged, before its call.
    requests = fake.requests
    assert len(requests) == 8 and {request_kind(r) for r in requests} == {"turn"}
    last = json.loads(requests[-1].body)["input"]
    reasoning = [x for x in last if x["type"] == "reasoning"]
    assert len(reasoning) == 7
    for r in requests[1:]:
        prev = elements(requests[requests.index(r) - 1].body, "input")
        assert elements(r.body, "input")[: len(prev)] == prev


def test_a_request_the_api_would_refuse_is_an_error_codex_reports(codex, fake, tmp_path):
    script = CodexScript(f"CG-{tmp_path.name}", codex_steps(5))

    def forget(step: int) -> None:
        if step == 2:  # as if the reasoning items came from another organisation
            script._reasoning.clear()

    script.before = forget
    fake.responder = script
    run = run_codex(codex, f"{script.tag}: run the steps.", tmp_path, fake.url + "/v1")
    assert script.refusals and "could not be verified" in script.refusals[0]
    errors = run.errors()
    assert errors, run.describe()
    assert any("could not be verified" in json.dumps(e) for e in errors)
    with pytest.raises(AssertionError):
        run.assert_succeeded()
