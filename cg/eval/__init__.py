"""`context-guru eval`: what a rewrite lost, asked of the user's own model (docs/eval.md)."""
