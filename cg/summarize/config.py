"""The `summarize` component's configuration (docs/behaviour.md#summarize-configuration), strict:
unknown keys and bad values are refused with a message naming the key and the value; nothing is
clamped."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cg.settings import describe


class TriggerConfig(BaseModel):
    """Request-level gates, ANDed; a zero or unset gate imposes nothing."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # Defaults chosen with the cost simulator (docs/savings.md), where the first design's defaults (no token
    # gate, 90% of the window, a cold cache, a roll-forward every 6,000 tokens) barely paid: a
    # first summary at an absolute size, in any cache state, rolled forward rarely.
    min_request_tokens: int = Field(60_000, ge=0)
    min_messages: int | None = Field(None, ge=0)
    min_output_tokens: int = Field(0, ge=0)
    min_request_frac: float = Field(0.0, ge=0, le=1)
    min_output_frac: float = Field(0.0, ge=0, le=1)
    huge_output_frac: float = Field(0.0, ge=0, le=1)
    # A request at this fraction of the window fires regardless of every gate and of the cache
    # state; 0 turns the ceiling off.
    ceiling_frac: float = Field(0.95, ge=0, le=1)


class ModelConfig(BaseModel):
    """Which model writes the summary. `api_key` is write-only: never printed, logged or stored."""

    model_config = ConfigDict(extra="forbid", strict=True)
    source: Literal["incoming", "config"] = "incoming"
    model: str | None = None
    # The wire format of a `config` model: `anthropic` (Messages), `openai` (Chat Completions)
    # or `responses` (the OpenAI Responses API, `POST …/v1/responses`).
    provider: Literal["anthropic", "openai", "responses"] | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    auth: Literal["x-api-key", "bearer"] | None = None
    # auto: with source incoming, the summarizer call is the commissioning request plus one
    # instruction, so the provider reads the transcript from its prompt cache
    # (docs/behaviour.md#summarize-the-summarizer-call), where that pays (the commissioning answer
    # began, no forced tool choice); always: whenever it can; never: the standalone prompt only.
    share_cache: Literal["auto", "always", "never"] = "auto"

    @field_validator("share_cache")
    @classmethod
    def _always_shares_the_agents_model(cls, v: str, info: ValidationInfo) -> str:
        # `always` promises the shared call; refuse what makes it impossible rather than
        # silently falling back (only the agent's own model can read its cache).
        if v == "always" and info.data.get("source") == "config":
            raise ValueError(
                "always needs model.source: incoming (a dedicated model cannot read the "
                "agent's prompt cache); use auto or never with source: config"
            )
        if v == "always" and info.data.get("model"):
            raise ValueError(
                "always sends the agent's own model, so model.model cannot be set with it"
            )
        return v


class SummarizeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    summary_level: Literal["concise", "regular", "highly_detailed"] = "regular"
    keep_first: int = Field(1, ge=0)
    keep_last: int = Field(3, ge=0)
    min_tokens: int = Field(500, ge=0)
    include_tool_calls: bool = False
    resummarize_tokens: int = Field(40_000, ge=0)
    start_from_message: int = Field(6, ge=0)
    custom_prompt: str | None = None
    marker_mode: Literal["full", "summary", "off"] = "full"
    cache_state: Literal["cold", "any"] = "any"
    # The floor every summary message carries (cg.summarize.floor): the span's user messages
    # verbatim, and its artifact trail, each within this many tokens; 0 turns a section off.
    keep_user_tokens: int = Field(8000, ge=0)
    keep_artifact_tokens: int = Field(4000, ge=0)
    model: ModelConfig = Field(default_factory=ModelConfig)
    trigger: TriggerConfig = Field(default_factory=TriggerConfig)

    @model_validator(mode="after")
    def _fold_legacy(self) -> SummarizeConfig:
        # `start_from_message` is the legacy spelling of `trigger.min_messages`.
        if self.trigger.min_messages is None:
            self.trigger.min_messages = self.start_from_message
        return self

    @property
    def min_messages(self) -> int:
        return self.trigger.min_messages or 0


CHEAP_ENV = {
    "CHEAP_MODEL": "model",
    "CHEAP_MODEL_PROVIDER": "provider",
    "CHEAP_MODEL_BASE_URL": "base_url",
    "CHEAP_MODEL_API_KEY": "api_key",
    "CHEAP_MODEL_AUTH": "auth",
}


def parse_summarize(
    raw: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> SummarizeConfig:
    """Validate a `components.summarize` block; with `model.source: config`, `CHEAP_MODEL*` env
    fills unset `model.*` keys (`incoming` reuses the proxied request's own model, so the env
    does not apply to it).

    The environment is read here, when settings are built, never at import.
    """
    env = os.environ if env is None else env
    data = dict(raw)
    model = dict(data["model"]) if isinstance(data.get("model"), Mapping) else None
    if model is not None and model.get("source") == "config":
        for var, key in CHEAP_ENV.items():
            if env.get(var) and model.get(key) in (None, ""):
                model[key] = env[var]
        data["model"] = model
    try:
        return SummarizeConfig.model_validate(data)
    except ValidationError as e:
        raise ValueError(
            describe(e, "components.summarize", secret_keys={"api_key"}, model=SummarizeConfig)
        ) from None
