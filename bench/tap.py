"""What the usage tap costs a streamed answer: `python -m bench.tap [--json]`.

A 1 MiB SSE answer (Anthropic text deltas of ~100 bytes, or OpenAI chunks with
`stream_options.include_usage`, so every chunk carries `"usage":null`) is fed in 4 KiB network
chunks through (a) a pass-through callable that returns each chunk (what `stream = True` costs
at most) and (b) `UsageTap`, then `finish()`. Reported: the median over reps of the whole answer,
the cost per chunk, and the peak bytes the tap held (its unfinished event).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from cg.billing.tap import UsageTap

SIZE = 1024 * 1024
CHUNK = 4096


def anthropic_answer(size: int = SIZE) -> bytes:
    head = (
        'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":'
        '"message","role":"assistant","model":"claude-sonnet-5-5","content":[],"usage":'
        '{"input_tokens":10,"cache_read_input_tokens":90000,"output_tokens":1}}}\n\n'
    )
    delta = (
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":'
        '{"type":"text_delta","text":"%s"}}\n\n'
    )
    tail = (
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"}'
        ',"usage":{"output_tokens":9000}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    parts = [head]
    n = len(head) + len(tail)
    i = 0
    while n < size:
        d = delta % f"word {i} of a long answer, streamed in pieces"
        parts.append(d)
        n += len(d)
        i += 1
    parts.append(tail)
    return "".join(parts).encode()


def openai_answer(size: int = SIZE) -> bytes:
    chunk = (
        'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-6.2-sol",'
        '"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}],"usage":null}\n\n'
    )
    tail = (
        'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-6.2-sol",'
        '"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":9000,'
        '"total_tokens":10000}}\n\ndata: [DONE]\n\n'
    )
    parts, n, i = [], len(tail), 0
    while n < size:
        c = chunk % f"word {i} of a long answer"
        parts.append(c)
        n += len(c)
        i += 1
    parts.append(tail)
    return "".join(parts).encode()


def time_feed(
    make: Callable[[], Callable[[bytes], bytes]], chunks: list[bytes], reps: int
) -> float:
    times = []
    for _ in range(reps):
        f = make()
        t0 = time.perf_counter()
        for c in chunks:
            f(c)
        f(b"")
        if isinstance(f, UsageTap):
            f.finish()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(dialect: str, body: bytes, reps: int) -> dict[str, Any]:
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    plain = time_feed(lambda: lambda c: c, chunks, reps)
    tapped = time_feed(lambda: UsageTap(dialect), chunks, reps)
    tap = UsageTap(dialect)
    peak = 0
    for c in chunks:
        tap(c)
        peak = max(peak, len(tap._buf))
    tap.finish()
    assert tap.result() is not None, "the benchmark answer must report usage"
    return {
        "dialect": dialect,
        "bytes": len(body),
        "chunks": len(chunks),
        "pass_through_ms": round(plain * 1000, 3),
        "tap_ms": round(tapped * 1000, 3),
        "tap_us_per_chunk": round((tapped - plain) / len(chunks) * 1e6, 2),
        "tap_peak_buffer_bytes": peak,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = [
        measure("anthropic", anthropic_answer(), args.reps),
        measure("openai", openai_answer(), args.reps),
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(
            f"{r['dialect']:9} {r['bytes']} B in {r['chunks']} chunks: pass-through "
            f"{r['pass_through_ms']} ms, tap {r['tap_ms']} ms "
            f"({r['tap_us_per_chunk']} µs/chunk), peak buffer {r['tap_peak_buffer_bytes']} B"
        )


if __name__ == "__main__":
    main()
