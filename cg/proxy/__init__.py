"""The mitmproxy face: the only package that imports mitmproxy.

    addon       `addons()`: the addons below on one runtime, in mitmproxy's order (and
                `ContextGuru`, all of them as one object, for tests and benches)
    runtime     the first addon: options, configuration, store, pipelines, flows in flight
    options     every `cg_*` option, declared once
    flowstate   one provider flow's state in flight: one table, one cap, one cleanup
    endpoints   the control addon: `/_cg/` routes and the `cg.*` commands
    rewriting   the rewrite addon: a provider turn's request hook
    summaries   summary jobs off the hot path, held until their flow's answer begins
    answers     the answers addon: the relay of streamed turns, the expand continuation, the
                400 re-send
    metering    the meter addon: each answer's usage booked
    redact      the redact addon: provider credentials out of every provider flow once done
    agents      which agent sent a request (Claude Code's own headers), for `cg_preset: auto`
    control     `/_cg/…` endpoints answered in place, loopback clients only by default
    meter       the hooks' side of the usage ledger: a tap on each answer, booked when it ends
    resend      the 400 safety net: the original request sent again, answered whole
    view        the mitmweb contentviews of a rewritten request (the views addon)
    stats       the counters of /_cg/stats
    flows       provider requests read back from a mitmproxy flow file

May import: anything in cg but cg.simulate and cg.cli.
"""
