"""The sign-ins' side of the fake provider (tests/support/fakeprovider.py): ChatGPT's Codex
backend and Anthropic's OAuth (Claude Pro/Max), each checking what its real counterpart is known
to check and answering with the rate-limit headers a plan's answers carry.

    account = ChatGPTAccount()                       # fake tokens, far-future expiry
    (codex_home / "auth.json").write_text(account.auth_json())
    fake.chatgpt = account                           # POST …/backend-api/codex/responses

    oauth = ClaudeOAuth()                            # sk-ant-oat01-…
    fake.claude_oauth = oauth                        # POST …/v1/messages needs it

ChatGPT's backend (`…/backend-api/codex/responses`, the Responses API): 401 unless the bearer is
the account's access token, 403 unless `chatgpt-account-id` names its account, and, as the real
one answers, 400 for `stream` not true, `store` not false, or a `max_output_tokens`. Answers carry
`x-codex-primary-used-percent` (the 5-hour window) and `x-codex-secondary-used-percent` (the
weekly one), with their window lengths and resets, rising by `step` per answer.

Anthropic with OAuth: 401 for an `x-api-key` beside the bearer or a bearer other than the token,
and for a bearer without the `oauth-2025-04-20` beta (the API's own words); answers carry
`anthropic-ratelimit-unified-5h-utilization` / `-7d-utilization` (fractions) and their resets.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

CHATGPT_PATH = "/backend-api/codex/responses"
OAUTH_BETA = "oauth-2025-04-20"
FAR_FUTURE = 4_102_444_800  # 2100-01-01: no token refresh in any test's life


def _b64(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def fake_jwt(claims: dict[str, Any]) -> str:
    """An unsigned JWT (header.payload.signature): Codex reads its claims, never verifies it."""
    return f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}.c2lnbmF0dXJl"


@dataclass
class _Counter:
    n: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self) -> int:
        with self.lock:
            self.n += 1
            return self.n


@dataclass
class ChatGPTAccount:
    """A ChatGPT sign-in for Codex: its `auth.json` and the backend's checks."""

    account_id: str = "acct-cg-test-0001"
    email: str = "user@example.test"
    plan: str = "plus"
    start_percent: float = 10.0
    step: float = 2.0
    answers: _Counter = field(default_factory=_Counter)

    def _auth_claims(self) -> dict[str, Any]:
        return {
            "chatgpt_account_id": self.account_id,
            "chatgpt_plan_type": self.plan,
            "chatgpt_user_id": "user-cg-test",
        }

    @property
    def id_token(self) -> str:
        return fake_jwt(
            {
                "email": self.email,
                "exp": FAR_FUTURE,
                "https://api.openai.com/auth": self._auth_claims(),
            }
        )

    @property
    def access_token(self) -> str:
        return fake_jwt(
            {
                "exp": FAR_FUTURE,
                "https://api.openai.com/auth": self._auth_claims(),
                "https://api.openai.com/profile": {"email": self.email},
            }
        )

    def auth_json(self) -> str:
        """`$CODEX_HOME/auth.json` as `codex login` writes it for a ChatGPT sign-in
        (codex-rs/login: `AuthDotJson`, `TokenData`), refreshed just now."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return json.dumps(
            {
                "auth_mode": "chatgpt",
                "OPENAI_API_KEY": None,
                "tokens": {
                    "id_token": self.id_token,
                    "access_token": self.access_token,
                    "refresh_token": "rt-cg-test-never-used",
                    "account_id": self.account_id,
                },
                "last_refresh": now,
            },
            indent=2,
        )

    def problem(self, headers: dict[str, str], body: Any) -> tuple[int, str] | None:
        """(status, message) of the backend's refusal, or None when it answers."""
        if headers.get("authorization") != f"Bearer {self.access_token}":
            return 401, "Your authentication token is not valid."
        if headers.get("chatgpt-account-id") != self.account_id:
            return 403, "chatgpt-account-id does not match the token's account."
        if not isinstance(body, dict):
            return 400, "The body must be a JSON object."
        if body.get("stream") is not True:
            return 400, "Stream must be set to true"
        if body.get("store") is not False:
            return 400, "Store must be set to false"
        if "max_output_tokens" in body:
            return 400, "Unsupported parameter: max_output_tokens"
        return None

    def answer_headers(self) -> dict[str, str]:
        n = self.answers.next()
        used = self.start_percent + self.step * n
        return {
            "x-codex-plan-type": self.plan,
            "x-codex-primary-used-percent": f"{used:g}",
            "x-codex-primary-window-minutes": "300",
            "x-codex-primary-reset-at": str(FAR_FUTURE),
            "x-codex-secondary-used-percent": f"{used / 4:g}",
            "x-codex-secondary-window-minutes": "10080",
            "x-codex-secondary-reset-at": str(FAR_FUTURE),
        }


@dataclass
class ClaudeOAuth:
    """A Claude Pro/Max sign-in: the OAuth access token Claude Code sends as a bearer."""

    token: str = "sk-ant-oat01-cg-test-" + "x" * 40
    start: float = 0.10
    step: float = 0.02
    answers: _Counter = field(default_factory=_Counter)

    def problem(self, headers: dict[str, str]) -> tuple[int, str] | None:
        auth = headers.get("authorization", "")
        if "x-api-key" in headers:
            return 401, "invalid x-api-key"
        if not auth.startswith("Bearer "):
            return 401, "x-api-key header is required"
        if auth != f"Bearer {self.token}":
            return 401, "Invalid bearer token"
        betas = {b.strip() for b in headers.get("anthropic-beta", "").split(",")}
        if OAUTH_BETA not in betas:
            return 401, "OAuth authentication is currently not supported."
        return None

    def answer_headers(self) -> dict[str, str]:
        n = self.answers.next()
        used = self.start + self.step * n
        return {
            "anthropic-ratelimit-unified-status": "allowed",
            "anthropic-ratelimit-unified-5h-status": "allowed",
            "anthropic-ratelimit-unified-5h-utilization": f"{used:.4f}",
            "anthropic-ratelimit-unified-5h-reset": str(FAR_FUTURE),
            "anthropic-ratelimit-unified-7d-status": "allowed",
            "anthropic-ratelimit-unified-7d-utilization": f"{used / 5:.4f}",
            "anthropic-ratelimit-unified-7d-reset": str(FAR_FUTURE),
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
        }
