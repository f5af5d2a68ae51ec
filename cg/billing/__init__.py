"""What the provider bills, and what it would have billed: usage, prices, the prompt cache.

    usage.py    `Usage`: one answer's token counts in provider-neutral names (SPEC §11), read
                from an Anthropic, OpenAI Chat or OpenAI Responses `usage` object
    cache.py    the prompt-cache billing model: which part of a request is read from the cache,
                written to it, or sent at the full input price (the simulator and the savings
                estimate both use it)
    prices.py   list prices per model (presets/tables/prices.yaml, a user's `prices` map over it)

Nothing here talks to the network or the store.
"""
