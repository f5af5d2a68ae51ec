"""Which conversation a request belongs to (docs/behaviour.md#sessions).

The first usable of, in order:

1. header `x-context-guru-session` — set by the operator or a wrapper script;
2. header `x-claude-code-session-id` — Claude Code sends it on every request;
3. header `session-id` — Codex CLI sends it on every request (with `thread-id` and
   `x-client-request-id`, which carry the same id);
4. anthropic `metadata.user_id`, only where it names a session: Claude Code 2.x sends a JSON-object
   string `{"device_id": …, "account_uuid": …, "session_id": …}` (its `session_id` is used), and
   1.x sent `user_<hash>_account_<uuid>_session_<uuid>` (the part after `_session_` is used).
   Any other `user_id` names a user, who may run many conversations at once, so it is not a
   session id and resolution falls through;
5. a Responses request's `prompt_cache_key` (Codex sets it to its session id; an app that shares
   one key across conversations still gets one checkpoint per conversation, since checkpoints
   are keyed by session and first message);
6. a hash of the conversation head: the system prompt plus the first user message, as
   `h:` + 32 hex digits. `cache_control` markers are left out of the hash, since a client moves
   them from message to message as the conversation grows. The request's tenant (the keyed
   fingerprint of its credential, `cg.state.tenant`) goes into it too (`tenant_head`), so two
   users who open with the same system prompt and first message never share a session; a
   request without a credential keeps the plain hash.

An explicit id is used only when it is allow-listed (ASCII letters, digits and `._:-`, 1 to 128
characters, surrounding whitespace ignored); anything else falls through to the next source, and
the skipped sources are listed in `SessionId.skipped` for the decision record. Nothing else of the
headers (credentials included) is read or kept.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from cg.frozen import frozen
from cg.state.facts import strip_cache_control
from cg.wire.body import BodyIndex
from cg.wire.dialects import DIALECTS, Dialect

HEADER_CG = "x-context-guru-session"
HEADER_CLAUDE_CODE = "x-claude-code-session-id"
HEADER_CODEX = "session-id"
SOURCE_METADATA = "metadata.user_id"
SOURCE_CACHE_KEY = "prompt_cache_key"
SOURCE_HEAD = "head"

SESSION_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_LEGACY_USER_ID = re.compile(r"user_[0-9a-f]*_account_[0-9a-fA-F-]*_session_(.+)")


@frozen
class SessionId:
    """`id` is allow-listed; `source` is the header name, `metadata.user_id` or `head`."""

    id: str
    source: str
    skipped: tuple[str, ...] = ()


def valid_session_id(s: object) -> bool:
    return isinstance(s, str) and SESSION_RE.fullmatch(s) is not None


def header(headers: Mapping[str, str], name: str) -> str | None:
    """Header `name` (given in lower case), case-insensitively; repeated, its values joined
    with ", " as `Headers.get` does. mitmproxy's `Headers` is read from its raw fields, made
    into raw values by lowered raw name once per version of them (`_lowered`), the one value
    asked for decoded: its own lookup converts every field to `str` first, and a
    flow is asked for about nine names over its life."""
    fields = getattr(headers, "fields", None)
    if type(fields) is tuple:
        by_name = _lowered(fields)
        try:  # (strict first: naming the error handler costs a little, UTF-8 is the rule)
            raw = by_name.get(name.encode())
            return None if raw is None else raw.decode()
        except UnicodeError:  # as mitmproxy reads a field that is not UTF-8
            raw = by_name.get(name.encode("utf-8", "surrogateescape"))
            return None if raw is None else raw.decode("utf-8", "surrogateescape")
    v = headers.get(name)
    if v is None and isinstance(headers, dict):  # a plain dict: case-insensitively
        v = next((val for k, val in headers.items() if k.lower() == name), None)
    return v


# The header field tuples read lately, each with its values by lowered name, by `id`: with
# many flows in flight their requests' and answers' reads interleave (two entries were
# rebuilt on most reads at 16 flows). `Headers.fields` is an immutable tuple, replaced on any
# change, and the memo holds it, so its id cannot be reused while it is here, and `is` never
# matches a newer version.
LOWERED_MAX = 256
_LOWERED: dict[int, tuple[tuple[Any, ...], dict[bytes, bytes]]] = {}


def _lowered(fields: tuple[Any, ...]) -> dict[bytes, bytes]:
    """Each lowered raw name's raw value (a repeated field's values joined with b", "; the
    separator splits no UTF-8 sequence, so decoding the join is joining the decoded values),
    made once for the tuple: a lookup is then one dict read and one decode, not a decode of
    every name and value."""
    known = _LOWERED.get(id(fields))
    if known is not None and known[0] is fields:
        return known[1]
    by_name = {k.lower(): v for k, v in fields}
    if len(by_name) != len(fields):  # a name given more than once
        by_name = {}
        for k, v in fields:
            name = k.lower()
            had = by_name.get(name)
            by_name[name] = v if had is None else had + b", " + v
    if len(_LOWERED) >= LOWERED_MAX:
        # The oldest. (Read from the event loop and from the thread that reads large bodies:
        # the other may have taken it, or changed the dict under the iterator, meanwhile.)
        try:
            del _LOWERED[next(iter(_LOWERED))]
        except (KeyError, RuntimeError, StopIteration):
            _LOWERED.clear()
    _LOWERED[id(fields)] = (fields, by_name)
    return by_name


def session_from_user_id(user_id: object) -> str | None:
    """The session named inside an anthropic `metadata.user_id`, as sent; None if none."""
    if not isinstance(user_id, str):
        return None
    s = user_id.strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            return None
        sid = obj.get("session_id") if isinstance(obj, dict) else None
        return sid if isinstance(sid, str) else None
    m = _LEGACY_USER_ID.fullmatch(s)
    return m.group(1) if m else None


def head_hash(system: object, first_user: object) -> str:
    """`h:` + a 16-byte blake2b of the canonical system prompt and first user message."""
    canon = json.dumps(
        [strip_cache_control(system), strip_cache_control(first_user)],
        sort_keys=True,
        ensure_ascii=True,
        separators=(",", ":"),
    )
    return "h:" + hashlib.blake2b(canon.encode("ascii"), digest_size=16).hexdigest()


def tenant_head(head: str, tenant: str) -> str:
    """The head-hash session of `tenant` (its fingerprint; "" for none: the hash unchanged)."""
    if not tenant:
        return head
    mixed = f"{head}@{tenant}".encode("ascii")
    return "h:" + hashlib.blake2b(mixed, digest_size=16).hexdigest()


def resolve_session(
    headers: Mapping[str, str],
    metadata: object = None,
    system: object = None,
    first_user: object = None,
    cache_key: object = None,
    head: Callable[[], str] | None = None,
    tenant: str = "",
) -> SessionId:
    """The session of one request; never fails.

    `headers` is looked up case-insensitively (mitmproxy's `Headers` or a plain dict).
    `metadata` is the parsed top-level `metadata` value (anthropic), `system` the parsed system
    prompt (anthropic: the top-level `system`; openai: `messages[0]` when its role is system or
    developer) and `first_user` the parsed first user message; `conversation_head` finds the last
    two for any dialect. `cache_key` is a Responses request's `prompt_cache_key`. `head`, when
    given, is called for the head hash instead (computed only when no explicit id is found).
    `tenant` is the request's (`cg.state.tenant.fingerprint`), mixed into the head hash.
    """
    skipped: list[str] = []
    for name in (HEADER_CG, HEADER_CLAUDE_CODE, HEADER_CODEX):
        v = header(headers, name)
        if v is not None:
            if valid_session_id(v.strip()):
                return SessionId(v.strip(), name, tuple(skipped))
            skipped.append(name)
    if isinstance(metadata, dict) and "user_id" in metadata:
        sid = session_from_user_id(metadata["user_id"])
        if sid is not None:
            if valid_session_id(sid.strip()):
                return SessionId(sid.strip(), SOURCE_METADATA, tuple(skipped))
            skipped.append(SOURCE_METADATA)
    if isinstance(cache_key, str):
        if valid_session_id(cache_key.strip()):
            return SessionId(cache_key.strip(), SOURCE_CACHE_KEY, tuple(skipped))
        skipped.append(SOURCE_CACHE_KEY)
    h = head() if head is not None else head_hash(system, first_user)
    return SessionId(tenant_head(h, tenant), SOURCE_HEAD, tuple(skipped))


def conversation_head(
    dialect: str, top_level: Mapping[str, Any], messages: Sequence[Any]
) -> tuple[object, object]:
    """(system prompt, first user message) of a parsed body, for `resolve_session`.

    `top_level` maps top-level keys to parsed values; `messages` are the parsed messages (or
    Responses items). Where the system prompt is, is the dialect's `conversation_system`.
    """
    return _head(DIALECTS[dialect], top_level, messages)


def _head(
    dialect: Dialect, top_level: Mapping[str, Any], messages: Sequence[Any]
) -> tuple[object, object]:
    system = dialect.conversation_system(top_level, messages)
    first_user = next(
        (m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None
    )
    return system, first_user


class _Values(Sequence[Any]):
    """The parsed values of an index's messages, read where asked: the head of a conversation
    is its first few messages, and a list of them all would be built every turn."""

    __slots__ = ("_messages",)

    def __init__(self, messages: Sequence[Any]) -> None:
        self._messages = messages

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [m.value for m in self._messages[i]]
        return self._messages[i].value

    def __iter__(self) -> Iterator[Any]:
        return (m.value for m in self._messages)


def session_of(headers: Mapping[str, str], index: BodyIndex, tenant: str = "") -> SessionId:
    """`resolve_session` for an indexed body (`metadata.user_id` is read for anthropic only,
    `prompt_cache_key` for responses only), for the request's `tenant`. The head hash memoised
    on the index is the plain one (an index may be inherited from another tenant's
    byte-identical body), mixed with the tenant per call."""
    d = index.dialect
    metadata = index.members.get(d.metadata_member) if d.metadata_member else None
    cache_key = index.members.get(d.cache_key_member) if d.cache_key_member else None
    return resolve_session(
        headers,
        metadata.value if metadata is not None else None,
        cache_key=cache_key.value if cache_key is not None else None,
        head=lambda: _head_of(index),
        tenant=tenant,
    )


def _head_of(index: BodyIndex) -> str:
    """The head hash of an indexed body, memoised on the index (`memo.head`) as a list as
    long as the messages up to the first user message, with the hash last: a next turn inherits
    the list cut to the messages it shares, so it keeps the hash only while it repeats that
    head byte for byte (the members outside the array, where the system prompt lives, are
    shared whole or the index is not inherited at all). A session without headers re-hashed
    its system prompt and first message at every answer."""
    known = index.memo.head[1]
    if isinstance(known, list) and known and known[-1] is not None:
        return str(known[-1])
    top = {k: m.value for k, m in index.members.items()}
    system, first_user = _head(index.dialect, top, _Values(index.messages))
    h = head_hash(system, first_user)
    at = next(
        (i for i, m in enumerate(index.messages)
         if isinstance(m.value, dict) and m.value.get("role") == "user"),
        None,
    )  # fmt: skip
    if at is not None:
        index.memo.head = (None, [None] * at + [h])
    return h
