"""From an indexed request to the bytes sent: the component contract, the runner, rewrite_body.

    contract    Component, Step, RequestContext, Commissioner: what a component is told and
                answers (components import only this)
    runner      components in order over one body, each reverted alone on error or lost content
    rewrite     rewrite_body: index -> pipeline -> splice -> validate -> expand tool; fails open

May import: cg.expand, cg.state, cg.wire, cg.settings. Never a component: a component (such as
`cg.summarize`) imports `cg.pipeline.contract`, and `cg.components` names them.
"""
