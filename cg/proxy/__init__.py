"""The mitmproxy face: the only package that imports mitmproxy.

    addon       ContextGuru: options, hooks (request, responseheaders, response, error),
                commands, the control endpoints' routes
    agents      which agent sent a request (Claude Code's own headers), for `cg_preset: auto`
    control     `/_cg/…` endpoints answered in place, loopback clients only by default
    meter       the hooks' side of the usage ledger: a tap on each answer, booked when it ends
    resend      the 400 safety net: the original request sent again, answered whole
    view        the mitmweb contentview of a rewritten request
    stats       the counters of /_cg/stats
    flows       provider requests read back from a mitmproxy flow file

May import: anything in cg but cg.simulate and cg.cli.
"""
