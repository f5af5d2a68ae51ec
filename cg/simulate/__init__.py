"""The cost simulator (`context-guru simulate`, docs/behaviour.md#usage-cost-and-savings): what each
preset would have cost on recorded sessions. Every figure it gives is a model estimate, labelled so.

The data flows down this list:

    trace       flow files and JSONL traces -> requests -> sessions (as the addon tells them apart)
    turns       each request's per-message facts (one shared FactsCache), the agent's output
    proxy       a preset's real pipeline replayed offline, every sent request billed
    compaction  the `agent-compaction` baseline: the agent compacting itself, as Claude Code does
    tally       one preset's bill on one session, agent / summarizer
    run         every preset over every session, and the totals
    report      the tables;  plot  the PNG (matplotlib, optional)
    standin     the deterministic stand-in summarizer

May import: anything in cg but cg.cli (flow files are read through cg.proxy.flows).
"""
