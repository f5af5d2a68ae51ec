"""The `summarize` component (docs/behaviour.md#summarize): replace the stale middle with one
summary, reused.

    component   decide per request (pass, splice the checkpoint, commission a summary) and turn
                the summarizer's answer into a checkpoint and a stash
    config      the component's keys, strict (docs/behaviour.md#summarize-configuration)
    span        [head | span | tail] and orphaned tool result repair
    (docs/behaviour.md#summarize-the-span, docs/behaviour.md#summarize-orphaned-tool-results)
    triggers    the request gates, the window table, the hard triggers, the cache state prompt
    the standalone prompt, the shared-cache instruction, the summary message shared      the
    shared-cache summarizer request, spliced from the commissioning request client      the model
    client that writes summaries (incoming or config source, both dialects)

May import: cg.pipeline.contract, cg.state, cg.wire, cg.settings.
"""
