"""The one line that stands for a masked tool output.

    [context-guru masked this tool output] Bash {"command":"pytest -q"} → 48,210 characters,
    912 lines; first error line: FAILED tests/test_x.py::test_y - AssertionError; call
    context_guru_expand with id "KEY#N" to read it <<cg:KEY>>

(one line on the wire). It names the tool and its input (abbreviated), the output's size, its
first error line as `cg.retention.facts.first_error` finds it (so that fact stays in the
request), and the id of the stashed message it came from: `KEY#N`, the N-th message (item) of
stash KEY. The `<<cg:KEY>>` marker is what the expand tool is offered for. The text is a pure
function of the output and its call, so a stub is the same bytes every turn; the checkpoint
keeps it too, so a later build that words stubs differently still re-emits the old ones.
"""

from __future__ import annotations

import re

from cg.expand.tool import parse_id
from cg.mask.outputs import Call, Output

PREFIX = "[context-guru masked this tool output]"
_ID = re.compile(r'; call context_guru_expand with id "([^"]{1,64})" to read it <<cg:')


def stub(call: Call | None, output: Output, key: str, n: int) -> str:
    """The stub of `output` (the answer to `call`, None when its call is not in the request),
    stashed as message `n` (1-based) of stash `key`."""
    tool = _line(call.name) if call is not None and call.name else "a tool"
    what = f"{tool} {_line(call.input)}" if call is not None and call.input else tool
    text = (
        f"{PREFIX} {what} → {output.chars:,} characters, {output.lines:,} "
        f"line{'s' if output.lines != 1 else ''}"
    )
    if output.error:
        text += f"; first error line: {_line(output.error)}"
    return f'{text}; call context_guru_expand with id "{key}#{n}" to read it <<cg:{key}>>'


def stub_id(text: str) -> tuple[str, int] | None:
    """The stash key and message number a stub (as `stub` writes it) names, or None."""
    m = _ID.search(text) if text.startswith(PREFIX) else None
    parsed = parse_id(m.group(1)) if m else None
    return (parsed[0], parsed[1]) if parsed is not None and parsed[1] is not None else None


def _line(text: str) -> str:
    return " ".join(text.split()) if "\n" in text or "\r" in text else text
