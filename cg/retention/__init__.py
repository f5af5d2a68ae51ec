"""What the agent keeps: the facts of a transcript, found deterministically, and how many of them
a rewritten request still shows (docs/behaviour.md#retention).
"""
