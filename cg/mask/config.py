"""The `mask` component's configuration (docs/configuration.md#mask), strict as summarize's:
unknown keys and bad values are refused with a message naming the key and the value; nothing is
clamped. Its `trigger` block is summarize's (the same keys, the same defaults): the first mask
of a conversation waits for the same request-level gates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cg.settings import describe
from cg.summarize.config import TriggerConfig


class MaskConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    # The latest tool rounds (a run of consecutive tool outputs: one exchange, parallel calls
    # included) whose outputs are never masked: what the agent is working from.
    keep_last_rounds: int = Field(10, ge=0)
    # An output is masked only when it holds at least this many tokens (a stub is ~60).
    min_output_tokens: int = Field(200, ge=0)
    # The masked prefix is reused byte for byte until the unmasked outputs older than the kept
    # rounds pass this many tokens; then they are masked in one step.
    remask_tokens: int = Field(20_000, ge=0)
    trigger: TriggerConfig = Field(default_factory=TriggerConfig)

    @property
    def min_messages(self) -> int:
        return self.trigger.min_messages or 0

    @property
    def cache_state(self) -> str:
        """Masking acts in any cache state (the trigger's `evaluate` asks)."""
        return "any"


def parse_mask(raw: Mapping[str, Any]) -> MaskConfig:
    """Validate a `components.mask` block."""
    try:
        return MaskConfig.model_validate(dict(raw))
    except ValidationError as e:
        raise ValueError(describe(e, "components.mask", model=MaskConfig)) from None
