"""Who a request's state belongs to (docs/behaviour.md#tenancy): a keyed fingerprint of its
credential.

A session id is whatever a request says it is (a header, a hash of its opening), so it cannot be
what keeps one user's stashes and checkpoints from another's: anyone who sends `x-context-guru-
session: A` would read A's. The tenant is what the request proves instead: a MAC of its
credential, the first present (non-empty) of `x-api-key`, `authorization`, `api-key` and
`x-goog-api-key`, name and value, under a key the store generates once and keeps
(`Store.tenant_key`: an SQLite file's `meta` table, PostgreSQL's `cg_keys`, shared by every
instance so a fleet agrees; a store in memory has a key of its own). The credential itself is
never written anywhere; its fingerprint, `FINGERPRINT_HEX` hex digits, is.

The MAC is keyed BLAKE2b (BLAKE2's own MAC mode, RFC 7693; the keyed hash docs/behaviour.md#tenancy
asks for, where the first design named an HMAC) rather than HMAC-SHA256: it runs on every
request, and HMAC-SHA256 costs several times as much (measured: docs/reliability.md, tenancy).

Every stash and checkpoint records the tenant that wrote it, and a request reads only rows of
its own tenant or rows written before tenancy existed (`UNBOUND`, the migration's mark: they stay
readable by their session, as they were). A request without a credential is `ANONYMOUS`: all such
requests are one tenant, as every request was before. The decision record says which applies
(`describe`), never the fingerprint in full.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from cg.state.session import header
from cg.wire.urlkey import QUERY_KEY, query_key

# In the order a provider reads them: Anthropic's, the bearer token (OpenAI, OAuth), Azure
# OpenAI's, Gemini's.
CREDENTIAL_HEADERS = ("x-api-key", "authorization", "api-key", "x-goog-api-key")
_NAMES = tuple((n, n.encode() + b"\0") for n in CREDENTIAL_HEADERS)
ANONYMOUS = ""
UNBOUND = "*"  # a row written before tenancy: readable by any tenant of its session
FINGERPRINT_HEX = 32  # 128 bits
KEY_BYTES = 32
CONVERSATION_HEX = 16  # of the fingerprint, in a checkpoint's key (`conversation_key`)


def new_key() -> bytes:
    """A fresh fingerprint key (the store keeps the first one it makes, for good)."""
    return os.urandom(KEY_BYTES)


_QUERY_PREFIX = b"?" + QUERY_KEY.encode() + b"\0"


def fingerprint(key: bytes, headers: Mapping[str, str], path: str = "") -> str:
    """The tenant of a request with `headers` (and `path`, whose query may carry the key, as
    the Gemini API's `?key=` does): its credential's MAC under `key`, as hex, or ANONYMOUS
    when it carries none. An empty value is no credential (two users who both send an empty
    `x-api-key` beside their real `authorization` must not be one tenant)."""
    for name, prefix in _NAMES:
        value = header(headers, name)
        if value is not None and value.strip():
            return _mac(key, prefix + value.encode("utf-8", "surrogateescape"))
    in_query = query_key(path) if path else None
    if in_query is not None:
        return _mac(key, _QUERY_PREFIX + in_query.encode("utf-8", "surrogateescape"))
    return ANONYMOUS


def _mac(key: bytes, msg: bytes) -> str:
    return hashlib.blake2b(msg, key=key, digest_size=FINGERPRINT_HEX // 2).hexdigest()


def readable(row_tenant: str, tenant: str) -> bool:
    """Whether a row written by `row_tenant` may be read by a request of `tenant`."""
    return row_tenant in (tenant, UNBOUND)


def describe(tenant: str, unbound: bool = False) -> str:
    """The decision record's `tenant`: `unbound` when the state a request used was written
    before tenancy, else `bound` (a credential) or `anonymous` (none)."""
    if unbound:
        return "unbound"
    return "bound" if tenant else "anonymous"
