"""What the proxy remembers: the store, session ids, token counts, per-message facts.

    store       SQLite: stashes, checkpoints, session clocks, the usage ledger (WAL, bounded)
    session     which session a request belongs to (SPEC §8)
    tokens      tiktoken counts with an encoding shipped in a package, cached by digest
    facts       per-message digests, token counts and cache breakpoints, memoised across turns

May import: cg.wire, cg.settings.
"""
