"""Wire formats, one module each, and routing a request to one of them.

Dialect ─┬─ Anthropic   POST …/v1/messages
         ├─ OpenAI      POST …/v1/chat/completions
         ├─ Responses   POST …/v1/responses, …/backend-api/codex/responses (ChatGPT sign-in)
         └─ Gemini      POST …/models/MODEL:generateContent, …:streamGenerateContent
"""

from __future__ import annotations

import re

from cg.wire.dialects.anthropic import Anthropic
from cg.wire.dialects.base import (
    SYSTEM_ROLES,
    BlockView,
    Dialect,
    MessageShapeError,
    MessageView,
    ToolCall,
    ToolOutput,
)
from cg.wire.dialects.gemini import Gemini
from cg.wire.dialects.openai import OpenAI
from cg.wire.dialects.responses import Responses

ANTHROPIC = Anthropic()
OPENAI = OpenAI()
RESPONSES = Responses()
GEMINI = Gemini()
DIALECTS: dict[str, Dialect] = {d.name: d for d in (ANTHROPIC, OPENAI, RESPONSES, GEMINI)}


# Bedrock's runtime: the request is SigV4-signed over its body, so no byte of it may change.
_BEDROCK = re.compile(
    r"/model/[^/]+/(?:invoke|invoke-with-response-stream|converse|converse-stream)$"
)
BEDROCK_REASON = (
    "Bedrock: the request is SigV4-signed over its body, and a rewrite would break the "
    "signature, so it passes through untouched"
)


def signed(method: str, path: str) -> str | None:
    """Why a model request that no dialect may touch passes through (Bedrock's), or None."""
    if method.upper() != "POST":
        return None
    bare = path.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    return BEDROCK_REASON if _BEDROCK.search(bare) else None


def route(method: str, path: str) -> Dialect | None:
    """The dialect of a provider request, or None for anything we must not touch.

    The path suffix is matched (query string ignored), so a `/anthropic/v1/messages` prefix
    works, and so is a dialect's `extra_suffixes` (Codex's ChatGPT route); `…/v1/messages/count_tokens`, `…/v1/responses/compact`, `…/v1/responses/{id}` and
    batch endpoints do not match.
    """
    if method.upper() != "POST":
        return None
    bare = path.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    for d in DIALECTS.values():
        if d.matches(bare):
            return d
    return None


__all__ = [
    "ANTHROPIC",
    "DIALECTS",
    "GEMINI",
    "OPENAI",
    "RESPONSES",
    "SYSTEM_ROLES",
    "BlockView",
    "Dialect",
    "MessageShapeError",
    "MessageView",
    "ToolCall",
    "ToolOutput",
    "route",
    "signed",
]
