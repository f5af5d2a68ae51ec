"""Getting the original back (docs/behaviour.md#expand): the `context_guru_expand` tool and its
continuation loop.

    tool            markers (`<<cg:KEY>>` in both spellings), the tool's constant bytes per
                    dialect, when to inject it, resolving an id to its stashed span
    continuation    the model called the tool: answer it here, re-send, return the final answer

May import: cg.state, cg.wire.
"""
