"""The sign-in fakes (tests/support/signin.py) refuse what the real backends refuse, and Codex's
scratch config signs it in with ChatGPT: the e2e tests' vacuity guards."""

from __future__ import annotations

import base64
import json
import tomllib
from typing import Any

import httpx

from tests.e2e import codex as cx
from tests.support.fakeprovider import FakeProvider
from tests.support.signin import CHATGPT_PATH, OAUTH_BETA, ChatGPTAccount, ClaudeOAuth


def _claims(jwt: str) -> dict[str, Any]:
    payload = jwt.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


def test_the_auth_json_is_a_chatgpt_sign_in_that_never_expires():
    account = ChatGPTAccount()
    doc = json.loads(account.auth_json())
    assert doc["auth_mode"] == "chatgpt" and doc["OPENAI_API_KEY"] is None
    tokens = doc["tokens"]
    assert tokens["account_id"] == account.account_id
    claims = _claims(tokens["id_token"])
    assert claims["exp"] > 4_000_000_000
    auth = claims["https://api.openai.com/auth"]
    assert isinstance(auth, dict) and auth["chatgpt_account_id"] == account.account_id


def test_the_fake_chatgpt_backend_refuses_what_the_real_one_refuses():
    account = ChatGPTAccount()
    ok = {"model": "m", "input": [], "stream": True, "store": False}
    body = json.dumps(ok).encode()
    good = {"authorization": f"Bearer {account.access_token}",
            "chatgpt-account-id": account.account_id}  # fmt: skip
    with FakeProvider() as fake:
        fake.chatgpt = account
        url = fake.url + CHATGPT_PATH

        def post(headers: dict[str, str], payload: dict[str, object]) -> httpx.Response:
            data = json.dumps(payload).encode()
            return httpx.post(url, content=data, headers=headers, trust_env=False)

        assert post({**good, "authorization": "Bearer sk-x"}, ok).status_code == 401
        assert post({**good, "chatgpt-account-id": "acct-other"}, ok).status_code == 403
        for bad, why in [
            ({**ok, "stream": False}, "Stream must be set to true"),
            ({**ok, "store": True}, "Store must be set to false"),
            ({**ok, "max_output_tokens": 10}, "Unsupported parameter: max_output_tokens"),
        ]:
            r = post(good, bad)
            assert (r.status_code, r.json()["error"]["message"]) == (400, why)
        r = httpx.post(url, content=body, headers=good, trust_env=False)
        assert r.status_code == 200 and "x-codex-primary-used-percent" in r.headers
        fake.chatgpt = None
        assert httpx.post(url, content=body, headers=good, trust_env=False).status_code == 404


def test_the_fake_anthropic_takes_only_the_oauth_bearer_with_its_beta():
    oauth = ClaudeOAuth()
    body = json.dumps({"model": "claude-x", "max_tokens": 5, "messages": []}).encode()
    good = {"authorization": f"Bearer {oauth.token}", "anthropic-beta": f"x,{OAUTH_BETA}"}
    with FakeProvider() as fake:
        fake.claude_oauth = oauth
        url = fake.url + "/v1/messages"

        def status(headers: dict[str, str]) -> int:
            return httpx.post(url, content=body, headers=headers, trust_env=False).status_code

        assert status({**good, "x-api-key": "sk-ant-api03-x"}) == 401
        assert status({"x-api-key": "sk-ant-api03-x"}) == 401
        assert status({**good, "anthropic-beta": "claude-code-20250219"}) == 401
        r = httpx.post(url, content=body, headers=good, trust_env=False)
        assert r.status_code == 200
        assert "anthropic-ratelimit-unified-5h-utilization" in r.headers


def test_codexs_scratch_config_signs_in_with_chatgpt_at_the_base_url():
    config = tomllib.loads(cx.config_toml("http://127.0.0.1:9/backend-api/codex", chatgpt=True))
    provider = config["model_providers"][cx.PROVIDER]
    assert provider["requires_openai_auth"] is True and "env_key" not in provider
    assert provider["base_url"] == "http://127.0.0.1:9/backend-api/codex"
    assert config["chatgpt_base_url"] == "http://127.0.0.1:9/backend-api/"
    assert config["cli_auth_credentials_store"] == "file"
