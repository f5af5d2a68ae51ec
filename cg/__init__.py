"""context-guru: shrink long LLM-agent transcripts in flight, byte-preservingly.

The public surface is re-exported here; the modules behind it are small and private in spirit.
"""

__version__ = "0.1.0"
