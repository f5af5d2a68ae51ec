"""A request body's decoded text, held as segments that earlier turns' texts share.

An agent's next turn repeats the previous body byte for byte up to its new messages, and then
the members after the transcript array (Claude Code's system prompt and tools) as they were.
Decoding the whole body again every turn was a large part of the request hook (the text is
UCS-4 as soon as one emoji appears), and each cached turn held its own copy, four bytes a
character. A warm turn's
text is instead the previous text's shared prefix, the newly decoded middle, and the previous
text's members after the array: three references, no copy. Positions are the same character
indices the whole text would have, so spans read the same.
"""

from __future__ import annotations

from bisect import bisect_right

# More segments than this and the small ones between the first and the last are joined into
# one (a turn adds one): lookups stay a short bisect, and the join copies only what the
# session appended since its first request, never the shared base.
MAX_SEGMENTS = 16


class Chars:
    """Text as `(start, string, offset)` segments: character `x` of the text, for the segment
    with the greatest `start <= x`, is `string[offset + x - start]`. Immutable."""

    __slots__ = ("_segs", "_starts", "_whole", "size")

    def __init__(self, segs: list[tuple[int, str, int]], size: int) -> None:
        self._segs = segs
        self._starts = [s[0] for s in segs]
        self.size = size  # the text's length in characters
        self._whole: str | None = None

    @classmethod
    def of(cls, text: str) -> Chars:
        c = cls([(0, text, 0)], len(text))
        c._whole = text
        return c

    def __len__(self) -> int:
        return self.size

    @property
    def ascii(self) -> bool:
        """One byte per character in UTF-8 (so a character position is a byte offset): a str
        knows this of itself, in constant time. False may also mean a segment's string holds
        non-ASCII outside the part this text uses."""
        for _, s, _ in self._segs:  # noqa: SIM110 - `all` of a generator is slower
            if not s.isascii():
                return False
        return True

    @property
    def segments(self) -> int:
        return len(self._segs)

    def whole(self) -> str:
        """The text as one string (built once, on the first call, for a segmented text)."""
        if self._whole is None:
            self._whole = self.slice(0, self.size)
            self._segs = [(0, self._whole, 0)]
            self._starts = [0]
        return self._whole

    def _end(self, j: int) -> int:
        return self._starts[j + 1] if j + 1 < len(self._starts) else self.size

    def slice(self, a: int, b: int) -> str:
        """`text[a:b]` for 0 <= a, b (a copy of those characters only)."""
        b = min(b, self.size)
        if a >= b:
            return ""
        if self._whole is not None:
            return self._whole[a:b]
        j = bisect_right(self._starts, a) - 1
        start, s, off = self._segs[j]
        end = self._end(j)
        if b <= end:
            return s[off + a - start : off + b - start]
        parts = [s[off + a - start : off + end - start]]
        while end < b:
            j += 1
            start, s, off = self._segs[j]
            end = min(self._end(j), b)
            parts.append(s[off : off + end - start])
        return "".join(parts)

    def locate(self, a: int) -> tuple[str, int, int]:
        """`(string, shift, end)`: the string holding character `a`, such that text position `x`
        is `string[x - shift]` for every `x` from `a` up to `end`."""
        if self._whole is not None:
            return self._whole, 0, self.size
        j = bisect_right(self._starts, a) - 1
        start, s, off = self._segs[j]
        return s, start - off, self._end(j)

    def spliced(self, p: int, middle: str, after: int | None = None) -> Chars:
        """This text's first `p` characters, then `middle`, then (when `after` is given) this
        text from `after` to its end: a next turn's text, sharing both ends with this one."""
        segs = [seg for seg in self._segs if seg[0] < p]
        size = p
        if middle:
            segs.append((size, middle, 0))
            size += len(middle)
        if after is not None and after < self.size:
            s, shift, end = self.locate(after)
            pieces = [(size, s, after - shift)]
            if end < self.size:  # the rest spans segments: take it as one string
                pieces = [(size, self.slice(after, self.size), 0)]
            segs += pieces
            size += self.size - after
        if len(segs) > MAX_SEGMENTS:
            first, last = segs[0], segs[-1]
            mid_start = segs[1][0]
            inner = Chars(segs, size)
            joined = inner.slice(mid_start, last[0])
            segs = [first, (mid_start, joined, 0), last]
        return Chars(segs, size)
