"""A configuration error said in one line naming the key, before the proxy listens, instead of
a traceback or silence.

mitmproxy reports an OptionsError raised by a script's `configure` at load as "error in script"
with the whole traceback (`mitmproxy.addons.script.script_error_handler`), and a `--set` value
of ours it cannot convert (`cg_max_body_mb=abc`) drops the whole script without a word: the
proxy would run as plain mitmdump. So:

- `configure` raises `ConfigError` (an OptionsError: mitmproxy still refuses the values and
  keeps the old ones), and `OneLine`, a filter on mitmproxy's script logger, turns the record
  of one into `context-guru: cg_preset: unknown preset 'x' (known: …)`, without the
  traceback. It stays an ERROR: mitmdump and mitmweb stop at start-up on it (`errorcheck`).
- `load` asks `unconvertible` which of our deferred `--set` values mitmproxy will fail to
  convert, and logs each as one ERROR line naming the option, before mitmproxy drops us.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from mitmproxy import exceptions

SCRIPT_LOGGER = "mitmproxy.addons.script"  # where `script_error_handler` logs


class ConfigError(exceptions.OptionsError):
    """A `cg_*` option or the config it names refused: the message names the key."""


class OneLine(logging.Filter):
    """A record of a ConfigError, as its message alone (no traceback), prefixed with ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, ConfigError):
            record.msg, record.args = "context-guru: %s", (str(exc),)
            record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """Put `OneLine` on mitmproxy's script logger, once per process."""
    logger = logging.getLogger(SCRIPT_LOGGER)
    if not any(isinstance(f, OneLine) for f in logger.filters):
        logger.addFilter(OneLine())


def unconvertible(options: Any) -> list[tuple[str, str, str]]:
    """Our `--set` values mitmproxy holds unconverted that it cannot convert: (name, the value
    given, why), asked with mitmproxy's own converter once our options are declared."""
    out: list[tuple[str, str, str]] = []
    declared = getattr(options, "_options", {})
    for name, value in getattr(options, "deferred", {}).items():
        raw = getattr(value, "val", None)  # (mitmproxy's `_UnconvertedStrings`)
        if not name.startswith("cg_") or name not in declared or not isinstance(raw, list):
            continue
        if len(raw) > 1 and declared[name].typespec is not Sequence[str]:
            continue  # (given more than once: `repeated_options` says so)
        try:
            options._parse_setval(declared[name], raw)
        except exceptions.OptionsError as e:
            out.append((name, ",".join(str(v) for v in raw), str(e)))
        except Exception:  # noqa: BLE001 - mitmproxy's internals moved: no check, no harm
            continue
    return out
