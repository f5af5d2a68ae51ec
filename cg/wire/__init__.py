"""Bytes in, bytes out: the provider wire formats, and nothing else.

    jsonspan    the exact span of every JSON value in the raw text, via json's C scanner
    body        a request body indexed once: its members, the `messages` array, a view per message
    splice      Keep / Cut / Insert plans -> the new body, retained messages byte-for-byte
    shape       validate_shape (the provider's rules, in its wording), check_wire_roles
    dialects/   one module per wire format: requests (message views) and answers (parse, edit,
                stream back), JSON and SSE; `route` picks one by method and path
    reply       one answer as data (`Reply`, `Call`, the parse errors) and the JSON/SSE primitives
    answers     the dialect-blind face over answers: parse_json/sse, tool_calls, render_*, usage
    usage       `Usage`: an answer's `usage` in the provider-neutral names of
    docs/behaviour.md#usage-cost-and-savings upstream    a request upstream with the agent's own
    headers, a provider's error message

May import: nothing else of cg: the bottom of the stack (docs/architecture.md).
"""
