"""A credential in a request's query string: the Gemini API takes its key as `?key=…` as well
as in `x-goog-api-key`. It is a credential like a header's, so it names the tenant
(`cg.state.tenant.fingerprint`) and is replaced before a URL is shown, saved or logged.
"""

from __future__ import annotations

import re

# The query parameter, and the value that replaces it wherever a URL is shown.
QUERY_KEY = "key"
REDACTED = "[redacted-by-context-guru]"

_KEY = re.compile(r"([?&]key=)([^&#]*)")


def query_key(url: str) -> str | None:
    """The non-empty `key` of a path's or URL's query, or None."""
    if "key=" not in url:
        return None
    query = url.split("#", 1)[0].partition("?")[2]
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == QUERY_KEY and value:
            return value
    return None


def redact_key(url: str) -> str:
    """The path or URL with every `key` value of its query replaced by REDACTED."""
    if "key=" not in url:
        return url
    head, sep, rest = url.partition("?")
    return head + sep + _KEY.sub(lambda m: m.group(1) + REDACTED, "?" + rest)[1:] if sep else url
