"""Names vulture (`make deadcode`) cannot see used: each is called or read by something outside
the source it scans. Every group says who uses its names; a name listed here is alive for that
reason and no other, so a name that stops being used that way belongs out of this file.

Parsed by vulture, never imported or run: `_` stands for any object, and `_.name` marks `name`
used wherever vulture finds it (as an attribute, a method, a variable or a parameter).
"""

# ruff: noqa: B018

from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# mitmproxy calls these by name: an addon's event hooks, the commands `@command.command`
# registers (`cg.stats`, `cg.sessions`), and a contentview's keyword arguments (`**unknown_metadata`
# takes what newer mitmproxy versions pass).
_.server_connect
_.stats_command
_.sessions_command
_.unknown_metadata

# http.server / socketserver read these off the handler and server classes (the benchmarks'
# upstream, the fake provider, the hostile probe's sink): the `do_<METHOD>` handlers and the
# class attributes that configure them.
_.do_GET
_.do_POST
_.do_PUT
_.do_PATCH
_.do_DELETE
_.do_HEAD
_.log_message
_.protocol_version
_.disable_nagle_algorithm
_.daemon_threads
_.request_queue_size
_.close_connection

# pydantic reads `model_config`, and calls the validators its decorators register.
_.model_config
_._postgres_url
_._always_shares_the_agents_model
_._fold_legacy

# Counters and report records turned into JSON by `dataclasses.asdict` (the `/_cg/stats` keys,
# `tests.e2e.load`'s and `tests.e2e.crash`'s reports): each field is read by its name there.
_.tokens_before
_.tokens_after
_.timed_out
_.retried_original
_.undecodable
_.tap_errors
_.completed_before
_.latency_ms
_.store_mb_peak_parts
_.stashes_gone
_.check_seconds

# pytest reads `pytestmark`, and runs autouse fixtures by their decorator, never by name.
_.pytestmark
_._unscripted
_._no_responder
_._hooks_addon
_._quick_backoff

# Parameters a signature must have: `__exit__(*exc)`, and the keyword of the tiktoken loader
# function `bench.peers` stands in for (`expected_hash`).
_.exc
_.expected_hash

# Keys of the decision record (cg.pipeline.rewrite.Record) written for the reader of a flow
# (mitmweb, a `-w` file), never read back by the addon; a Draft's fields are read by name.
_.retry_error
_.read_aside
_.provider_400
_.preset_reason
_.messages_out
_.messages_in
_.input_violations
_.session_skipped
_.invalidated

# logging.LogRecord.exc_text: the formatter caches a traceback there (cg.proxy.configerrors clears it).
_.exc_text
