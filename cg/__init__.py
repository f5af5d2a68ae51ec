"""context-guru: shrink long LLM-agent transcripts in flight, byte-preservingly.

The packages follow a request down the stack — proxy → pipeline, summarize, expand → billing,
state → wire — and every import points down (docs/architecture.md; tests/test_layers.py).
`cg_addon.py` at the repository's top registers `cg.proxy.addon.addons()` with mitmproxy.
"""

__version__ = "0.1.0"
