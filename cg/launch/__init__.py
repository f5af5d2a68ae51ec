"""`context-guru claude|codex|opencode|gemini [AGENT ARGS…]`: one agent session through the
proxy, in one command (docs/agents.md#one-command-per-agent).

    agents     what each agent is: its binary, npm package, providers, preset, and how it is
               pointed at a base URL (an environment variable, `-c` overrides, a config string)
    settings   the launcher's own settings, read from `CG_*` variables only, so every argument
               after the agent's name is the agent's
    mitm       the mitmdump command line with the packaged addon (`context-guru proxy` too)
    proxy      a proxy found serving on the chosen port, or one started and stopped by PID
    child      the agent run in the foreground: terminal, signals and exit status passed through
    closing    the one line said at the end: what this session saved
    run        the order of it all
"""
