"""The `mask` component: old tool outputs replaced by one-line stubs (docs/behaviour.md#mask).

    config      its YAML block (`keep_last_rounds`, `min_output_tokens`, `remask_tokens`,
                `trigger`), strict
    outputs     where each message's tool calls and tool outputs lie in its source, memoised
                per message across turns
    stub        the one line that stands for a masked output
    component   decide per request, stash, checkpoint, and the plan of edited messages

May import: cg.pipeline.contract, cg.summarize (its config, triggers and conversation keys),
cg.retention, cg.state, cg.wire, cg.settings.
"""
