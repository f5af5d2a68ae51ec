"""A request body's content-encoding undone under a bound
(docs/behaviour.md#bounded-work-and-shared-use): never more than `limit` bytes are produced, at any
stage of a chain.

Why not mitmproxy's `get_content`: it decodes the whole body before anyone can look at its
size, so a 1.7 KB brotli body (or 33 KB of zstd, 1 MB of gzip) becomes 1 GiB in memory. Here
every decoder is streamed and stops as soon as its output would pass `limit`:

    gzip, x-gzip         zlib with a gzip header, member after member (as `gzip.GzipFile`)
    deflate, deflateraw  zlib with its header, else raw deflate (as mitmproxy's lenient reader)
    br                   the brotli library's own streaming decoder, called with an output
                         buffer of our size (its C API, through ctypes: the Python binding
                         pinned beside mitmproxy 11 has no output limit); where that C API
                         cannot be reached, the Python binding fed a few bytes at a time, so
                         one call can overshoot by at most a few brotli meta-blocks (16 MiB
                         each)
    zstd                 zstandard's decoder, frame after frame, fed a few hundred bytes
                         at a time (a block decodes to 128 KiB at most)
    identity, none, ""   as they are

A chain (`Content-Encoding: gzip, br`: applied left to right) is undone right to left, each
stage bounded. Errors: `TooLarge` (decodes past the limit) and `Undecodable` (an unknown
encoding, or bytes its decoder refuses), both ValueErrors saying what and how much. `encode`
is the inverse, for a rewritten body that must go back under a chain mitmproxy cannot encode.
"""

from __future__ import annotations

import ctypes
import gzip
import zlib
from collections.abc import Callable

import brotli
import zstandard

IDENTITY = frozenset({"", "identity", "none"})
_OUT = 64 * 1024  # output buffer of one streamed decoder call
_BR_STEP = 4  # input bytes per call of the Python brotli binding (the fallback)
_ZSTD_STEP = 256  # input bytes per call of the zstd decoder


class Undecodable(ValueError):
    """An unknown content-encoding, or bytes its decoder refuses."""


class TooLarge(ValueError):
    """The body decodes to more than the limit."""

    def __init__(self, encoding: str, limit: int) -> None:
        super().__init__(f"decodes ({encoding}) to more than {limit} bytes")
        self.encoding = encoding
        self.limit = limit


def codings(header: str) -> list[str]:
    """The content-codings of a `Content-Encoding` value, in the order they were applied."""
    return [c.strip().lower() for c in header.split(",") if c.strip().lower() not in IDENTITY]


def decode(data: bytes, header: str, limit: int) -> bytes:
    """`data` with every coding of `header` undone, right to left; raises TooLarge once any
    stage would produce more than `limit` bytes, Undecodable when it cannot be read."""
    for coding in reversed(codings(header)):
        step = _DECODERS.get(coding)
        if step is None:
            raise Undecodable(f"unknown content-encoding {coding!r}")
        if data:
            data = step(data, limit)
    if len(data) > limit:  # (no coding at all: the body is as long as it came)
        raise TooLarge(header.strip() or "identity", limit)
    return data


def encode(data: bytes, header: str) -> bytes:
    """`data` with every coding of `header` applied, left to right (the inverse of `decode`)."""
    for coding in codings(header):
        step = _ENCODERS.get(coding)
        if step is None:
            raise Undecodable(f"unknown content-encoding {coding!r}")
        data = step(data)
    return data


def _inflate(data: bytes, limit: int, wbits: int, members: bool, name: str) -> bytes:
    out: list[bytes] = []
    total = 0
    d = zlib.decompressobj(wbits)
    pending = data
    while True:
        try:
            chunk = d.decompress(pending, limit - total + 1)
        except zlib.error as e:
            raise Undecodable(f"{name}: {e}") from None
        total += len(chunk)
        if total > limit:
            raise TooLarge(name, limit)
        out.append(chunk)
        if d.eof:
            rest = d.unused_data
            if members and rest.strip(b"\0"):  # another gzip member (zero padding ends it)
                d, pending = zlib.decompressobj(wbits), rest
                continue
            return b"".join(out)
        pending = d.unconsumed_tail
        if not pending:
            raise Undecodable(f"{name}: the compressed data ends before its end marker")


def _gzip(data: bytes, limit: int) -> bytes:
    return _inflate(data, limit, 16 + zlib.MAX_WBITS, True, "gzip")


def _deflate(data: bytes, limit: int) -> bytes:
    try:
        return _inflate(data, limit, zlib.MAX_WBITS, False, "deflate")
    except Undecodable:  # no zlib header (or checksum): raw deflate, as mitmproxy reads it
        return _inflate(data, limit, -zlib.MAX_WBITS, False, "deflate")


def _zstd(data: bytes, limit: int) -> bytes:
    """Frame after frame, fed `_ZSTD_STEP` bytes at a time: a zstd block holds at most
    128 KiB, so one call yields at most a few MiB however the input was made."""
    out = bytearray()
    rest = data
    try:
        while rest:
            d = zstandard.ZstdDecompressor().decompressobj()
            at = 0
            while at < len(rest) and not d.eof:
                out += d.decompress(rest[at : at + _ZSTD_STEP])
                at += _ZSTD_STEP
                if len(out) > limit:
                    raise TooLarge("zstd", limit)
            if not d.eof:
                raise Undecodable("zstd: the compressed data ends before its frame does")
            rest = d.unused_data + rest[at:]
    except zstandard.ZstdError as e:
        raise Undecodable(f"zstd: {e}") from None
    return bytes(out)


class _BrotliC:
    """The brotli decoder's C API in the library's own extension module: a stream decoded into
    an output buffer of our size, so it stops where we say."""

    NEEDS_MORE_INPUT, NEEDS_MORE_OUTPUT, SUCCESS = 2, 3, 1

    def __init__(self) -> None:
        import _brotli

        lib = ctypes.CDLL(_brotli.__file__)  # (a CDLL call releases the GIL)
        self.create = lib.BrotliDecoderCreateInstance
        self.create.restype = ctypes.c_void_p
        self.create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.destroy = lib.BrotliDecoderDestroyInstance
        self.destroy.restype = None
        self.destroy.argtypes = [ctypes.c_void_p]
        self.stream = lib.BrotliDecoderDecompressStream
        self.stream.restype = ctypes.c_int
        size_p = ctypes.POINTER(ctypes.c_size_t)
        byte_pp = ctypes.POINTER(ctypes.POINTER(ctypes.c_uint8))
        self.stream.argtypes = [ctypes.c_void_p, size_p, byte_pp, size_p, byte_pp, size_p]

    def decode(self, data: bytes, limit: int) -> bytes:
        state = self.create(None, None, None)
        if not state:
            raise MemoryError("brotli: no decoder")
        try:
            src = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            next_in = ctypes.cast(src, ctypes.POINTER(ctypes.c_uint8))
            avail_in = ctypes.c_size_t(len(data))
            buf = (ctypes.c_uint8 * _OUT)()
            out = bytearray()
            while True:
                next_out = ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8))
                avail_out = ctypes.c_size_t(_OUT)
                result = self.stream(
                    state,
                    ctypes.byref(avail_in),
                    ctypes.byref(next_in),
                    ctypes.byref(avail_out),
                    ctypes.byref(next_out),
                    None,
                )
                out += memoryview(buf)[: _OUT - avail_out.value]
                if len(out) > limit:
                    raise TooLarge("br", limit)
                if result == self.SUCCESS:
                    return bytes(out)
                if result == self.NEEDS_MORE_OUTPUT:
                    continue
                if result == self.NEEDS_MORE_INPUT:
                    raise Undecodable("br: the compressed data ends before its end marker")
                raise Undecodable("br: not a brotli stream")
        finally:
            self.destroy(state)


def _brotli_fed(data: bytes, limit: int) -> bytes:
    """The fallback: the Python binding (which returns all it can decode from what it is
    given) fed `_BR_STEP` bytes at a time."""
    d = brotli.Decompressor()
    out = bytearray()
    try:
        for at in range(0, len(data), _BR_STEP):
            out += d.process(data[at : at + _BR_STEP])
            if len(out) > limit:
                raise TooLarge("br", limit)
        finished = d.is_finished()
    except brotli.error as e:
        raise Undecodable(f"br: {e}") from None
    if not finished:
        raise Undecodable("br: the compressed data ends before its end marker")
    return bytes(out)


def _brotli_c() -> _BrotliC | None:
    try:
        return _BrotliC()
    except (ImportError, OSError, AttributeError):
        return None


BROTLI_C = _brotli_c()


def _brotli(data: bytes, limit: int) -> bytes:
    if BROTLI_C is not None:
        return BROTLI_C.decode(data, limit)
    return _brotli_fed(data, limit)


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip,
    "x-gzip": _gzip,
    "deflate": _deflate,
    "deflateraw": _deflate,
    "br": _brotli,
    "zstd": _zstd,
}
_ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: gzip.compress(b, mtime=0),
    "x-gzip": lambda b: gzip.compress(b, mtime=0),
    "deflate": zlib.compress,
    "deflateraw": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
}
