"""What the tests share and do not test themselves: the fake provider and its prompt-cache
model, the scripted agents, the Responses oracle, hypothesis strategies, transcripts, bombs,
the PostgreSQL server. Its own tests check these against the real wire formats."""
