"""What the provider bills, and what it would have billed: usage, prices, the prompt cache.

    cache.py    the prompt-cache billing model: which part of a request is read from the cache,
                written to it, or sent at the full input price (the simulator and the savings
                estimate both use it)
    prices.py   list prices per model (cg/presets/tables/prices.yaml, a user's `prices` map over it)
    tap.py      reading `usage` from an answer as it passes: a stream callable for SSE, and JSON
    ledger.py   the per-session usage ledger in the store, and the without-rewrite estimate
    savings.py  the ledger priced: `usage` and `savings` for /_cg/stats and /_cg/sessions
    listing.py  the session list a page at a time (/_cg/sessions, the dashboard), its cursor

Nothing here talks to the network; only the ledger writes to the store. (`Usage` itself, an
answer's counts in provider-neutral names, is `cg.wire.usage`.)

May import: cg.state, cg.wire, cg.settings.
"""
