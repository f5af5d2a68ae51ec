"""Hostile request bodies, built streaming (docs/behaviour.md#bounded-work-and-shared-use): small
bodies that decode to far more than the cap, and bodies under the cap that cost the most to read.

Each bomb is built from 16 MiB of zeros at a time (never the whole decoded body in memory) in a
second or two: `br` and `zstd` through their streaming compressors, `gzip` from one compressed
16 MiB block repeated (a full flush makes each repeat independent) with the trailer the whole
decodes to. 1 GiB: 809 bytes of br, 33 KB of zstd, 1 MB of gzip, a few hundred bytes of
`gzip, br` (the gzip bomb inside br).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterator

import brotli
import zstandard

MIB = 1024 * 1024
BLOCK = 16 * MIB
_ZEROS = b"\0" * BLOCK


def _stream(compress: Callable[[bytes], bytes], flush: Callable[[], bytes], blocks: int) -> bytes:
    return b"".join(compress(_ZEROS) for _ in range(blocks)) + flush()


def br(blocks: int = 64) -> bytes:
    """`blocks` × 16 MiB of zeros as brotli (64: 1 GiB in ~800 bytes)."""
    c = brotli.Compressor(quality=3, lgwin=24)
    return _stream(c.process, c.finish, blocks)


def zstd(blocks: int = 64) -> bytes:
    """`blocks` × 16 MiB of zeros as zstd (64: 1 GiB in ~33 KB)."""
    c = zstandard.ZstdCompressor(level=3).compressobj()
    return _stream(c.compress, c.flush, blocks)


def gzip(blocks: int = 64) -> bytes:
    """`blocks` × 16 MiB of zeros as one gzip member (64: 1 GiB in ~1 MB)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(_ZEROS) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(blocks):
        crc = zlib.crc32(_ZEROS, crc)
    size = (blocks * BLOCK) & 0xFFFFFFFF
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    tail = b"\x03\x00" + crc.to_bytes(4, "little") + size.to_bytes(4, "little")
    return header + block * blocks + tail


def gzip_in_br(blocks: int = 64) -> bytes:
    """`Content-Encoding: gzip, br`: the gzip bomb inside brotli."""
    out: bytes = brotli.compress(gzip(blocks), quality=5)
    return out


BOMBS: dict[str, Callable[[], bytes]] = {
    "br": br,
    "zstd": zstd,
    "gzip": gzip,
    "gzip, br": gzip_in_br,
}


def _body(messages: Iterator[str], model: str = "claude-sonnet-4-5") -> bytes:
    """An Anthropic Messages body whose `messages` are the JSON texts given."""
    head = f'{{"model":"{model}","max_tokens":16,"messages":['.encode()
    return head + ",".join(messages).encode() + b"]}"


def unbroken(size: int = 30 * MIB) -> bytes:
    """One user message of one unbroken run of letters: tiktoken's worst case, one piece."""
    return _body(iter([json.dumps({"role": "user", "content": "a" * size})]))


def tiny_messages(n: int, tag: str = "m", numbered: bool = True) -> bytes:
    """`n` alternating tiny messages (200k: ~6.5 MB), each `tag` and (`numbered`) its number;
    unnumbered, 900k are ~28 MB (under the 32 MiB cap)."""
    roles = ("user", "assistant")
    return _body(
        f'{{"role":"{roles[i % 2]}","content":"{tag}{i if numbered else ""}"}}' for i in range(n)
    )


def ordinary(size: int) -> bytes:
    """Ordinary messages (prose, tool-call-free) up to about `size` bytes."""
    text = "The quick brown fox jumps over the lazy dog near the river bank. " * 60
    n = max(2, size // (len(text) + 40))
    roles = ("user", "assistant")
    return _body(json.dumps({"role": roles[i % 2], "content": f"{i}: {text}"}) for i in range(n))


LARGE: dict[str, Callable[[], bytes]] = {
    "30 MB, one unbroken run": unbroken,
    "28 MB, 900k tiny messages": lambda: tiny_messages(900_000, numbered=False),
    "6.5 MB, 200k tiny messages": lambda: tiny_messages(200_000),
    "19k tiny messages (under cg_max_messages)": lambda: tiny_messages(19_000),
    "30 MB, ordinary messages": lambda: ordinary(30 * MIB),
}


def gzip_of(body: bytes) -> bytes:
    """`body` gzip-compressed, streaming (for the 200 MB of ordinary messages in ~0.7 MB)."""
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    view = memoryview(body)
    return b"".join(c.compress(view[i : i + BLOCK]) for i in range(0, len(body), BLOCK)) + c.flush()
