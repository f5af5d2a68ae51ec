"""A minimal tool-using agent on the official SDKs: the loop every SDK user writes.

    agent = SdkAgent("anthropic", is_async=True, stream=False, base_url=proxy.url)
    text = await agent.run(task)

It sends the transcript with two tools (`Bash`, `Read`), runs the tool calls the model answers
with (`echo X` prints X; Read returns the file), appends the assistant message as the SDK gave
it and the results, and repeats until an answer calls no tool. A call to any other tool — e.g.
`context_guru_expand`, which only the proxy may see — fails the run. Every request's exact bytes
are kept (`sent`), tagged `x-e2e-id`, for tests/e2e/agents.py's `audit`.

`base_url=None` leaves the SDK on its default host (api.anthropic.com, api.openai.com) and its
default httpx client on the environment: HTTPS_PROXY and SSL_CERT_FILE (regular proxy mode).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai

from tests.e2e.agents import SECRET, Sent, Turn, audit, wait_settled
from tests.e2e.harness import Capture, Proxy, new_id
from tests.support.agent_script import EXPAND_TOOL, AgentScript, session
from tests.support.fakeprovider import FakeProvider

API_KEY = "sk-sdk-agent-e2e"
SYSTEM = "You are a coding agent. Use the tools; answer when the task is done."
_SCHEMAS = {
    "Bash": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"],
    },
    "Read": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
    },
}
ANTHROPIC_TOOLS = [
    {"name": n, "description": f"The {n} tool.", "input_schema": s} for n, s in _SCHEMAS.items()
]
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": n, "description": f"The {n} tool.", "parameters": s}}
    for n, s in _SCHEMAS.items()
]


def execute(name: str, args: Any) -> str:
    if name == "Bash":
        command = str(args["command"])
        assert command.startswith("echo "), command
        return command.removeprefix("echo ")
    if name == "Read":
        return Path(args["file_path"]).read_text(encoding="utf-8")
    raise AssertionError(f"the model called {name!r}, a tool this agent never declared")


class SdkAgent:
    def __init__(
        self,
        dialect: str,
        *,
        is_async: bool,
        stream: bool,
        base_url: str | None = None,
        http: dict[str, Any] | None = None,
    ) -> None:
        """`http`: more arguments for the SDK's httpx client (e.g. `proxy` and `verify` for a
        base URL reached through a regular proxy)."""
        self.dialect = dialect
        self.is_async = is_async
        self.stream = stream
        self.capture = Capture()
        hooks = self.capture.async_hooks() if is_async else self.capture.hooks()
        local = base_url is not None  # reverse mode: nothing from the environment
        more = http or {}
        kw: dict[str, Any] = {"api_key": API_KEY, "max_retries": 0}
        self.client: Any
        make: Any
        cls: Any
        if dialect == "anthropic":
            make = anthropic.DefaultAsyncHttpxClient if is_async else anthropic.DefaultHttpxClient
            http = make(event_hooks=hooks, trust_env=not local, **more)
            cls = anthropic.AsyncAnthropic if is_async else anthropic.Anthropic
            self.client = cls(base_url=base_url, http_client=http, **kw)
        else:
            make = openai.DefaultAsyncHttpxClient if is_async else openai.DefaultHttpxClient
            http = make(event_hooks=hooks, trust_env=not local, **more)
            url = f"{base_url}/v1" if local else None
            cls = openai.AsyncOpenAI if is_async else openai.OpenAI
            self.client = cls(base_url=url, http_client=http, **kw)
        self.tool_names: list[str] = []  # every tool the model called, in order

    @property
    def sent(self) -> list[Sent]:
        return [
            Sent(
                r.headers["x-e2e-id"],
                r.method,
                r.url.raw_path.decode("ascii"),
                [(k, v) for k, v in r.headers.multi_items() if k.lower() != "x-e2e-id"],
                r.content,
            )
            for r in self.capture.sent
        ]

    async def close(self) -> None:
        if self.is_async:
            await self.client.close()
        else:
            self.client.close()

    async def run(self, task: str, max_turns: int = 40) -> str:
        messages: list[Any] = [{"role": "user", "content": task}]
        if self.dialect == "openai":
            messages.insert(0, {"role": "system", "content": SYSTEM})
        for _ in range(max_turns):
            extra = {"x-e2e-id": new_id()}
            if self.dialect == "anthropic":
                done = await self._anthropic(messages, extra)
            else:
                done = await self._openai(messages, extra)
            if done is not None:
                return done
        raise AssertionError(f"no final answer in {max_turns} turns")

    async def _anthropic(self, messages: list[Any], extra: dict[str, str]) -> str | None:
        kw = {
            "model": "claude-test",
            "max_tokens": 1024,
            "system": SYSTEM,
            "tools": ANTHROPIC_TOOLS,
            "messages": messages,
            "extra_headers": extra,
        }
        c = self.client
        if self.is_async and self.stream:
            async with c.messages.stream(**kw) as s:
                msg = await s.get_final_message()
        elif self.is_async:
            msg = await c.messages.create(**kw)
        elif self.stream:
            with c.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = c.messages.create(**kw)
        calls = [b for b in msg.content if b.type == "tool_use"]
        self.tool_names += [b.name for b in calls]
        if not calls:
            return "".join(b.text for b in msg.content if b.type == "text")
        messages.append({"role": "assistant", "content": msg.content})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": execute(b.name, b.input)}
            for b in calls
        ]
        messages.append({"role": "user", "content": results})
        return None

    async def _openai(self, messages: list[Any], extra: dict[str, str]) -> str | None:
        kw: dict[str, Any] = {
            "model": "gpt-test",
            "tools": OPENAI_TOOLS,
            "messages": messages,
            "extra_headers": extra,
        }
        c = self.client.chat.completions
        if self.stream:
            # Raw chunks, accumulated the way agents do (the SDK's .stream() helper insists on
            # strict tools).
            kw["stream"] = True
            kw["stream_options"] = {"include_usage": True}
            chunks = await c.create(**kw) if self.is_async else c.create(**kw)
            acc = _Accumulator()
            if self.is_async:
                async for chunk in chunks:
                    acc.add(chunk)
            else:
                for chunk in chunks:
                    acc.add(chunk)
            content, calls = acc.content, acc.calls()
        else:
            done = await c.create(**kw) if self.is_async else c.create(**kw)
            msg = done.choices[0].message
            content = msg.content
            calls = [(t.id, t.function.name, t.function.arguments) for t in msg.tool_calls or []]
        self.tool_names += [name for _, name, _ in calls]
        if not calls:
            return str(content)
        messages.append(
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for i, n, a in calls
                ],
            }
        )
        for i, n, a in calls:
            messages.append(
                {"role": "tool", "tool_call_id": i, "content": execute(n, json.loads(a))}
            )
        return None


class _Accumulator:
    """Chat Completions chunks -> the assistant's content and tool calls."""

    def __init__(self) -> None:
        self.content: str | None = None
        self.slots: dict[int, list[str]] = {}
        self.usage: Any = None

    def add(self, chunk: Any) -> None:
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            if d.content:
                self.content = (self.content or "") + d.content
            for tc in d.tool_calls or []:
                slot = self.slots.setdefault(tc.index, ["", "", ""])
                slot[0] = tc.id or slot[0]
                if tc.function is not None:
                    slot[1] = tc.function.name or slot[1]
                    slot[2] += tc.function.arguments or ""

    def calls(self) -> list[tuple[str, str, str]]:
        assert self.usage is not None, "include_usage asked for, no usage chunk came"
        return [(i, n, a) for _, (i, n, a) in sorted(self.slots.items())]


async def run_scripted(
    fake: FakeProvider, proxy: Proxy, workdir: Path, agent: SdkAgent, steps: int = 8
) -> tuple[AgentScript, list[Turn]]:
    """One scripted session of `steps` steps (two parallel calls at step 3, a Read at step 5)
    with the model calling context_guru_expand once, through `proxy`; audited turn by turn."""
    notes = workdir / "notes.txt"
    notes.write_text(SECRET + "\n")
    tag = f"CG-{workdir.name}"
    script = AgentScript(
        tag,
        session(steps, parallel_at=(3,), read_at={5: str(notes)}),
        expand=True,
        before=lambda step: wait_settled(proxy),
    )
    fake.responder = script
    try:
        text = await agent.run(f"{tag}: run the scripted steps.")
    finally:
        fake.responder = None
        await agent.close()
    assert text == script.final_text
    assert script.refusals == [], script.refusals
    assert set(agent.tool_names) == {"Bash", "Read"}, agent.tool_names  # never the expand tool
    assert "4711" in str(script.results.values())  # the loop really ran its tools
    sent = agent.sent
    assert len(sent) == steps + 1, f"the agent made {len(sent)} requests for {steps} steps"
    for s in sent:
        assert EXPAND_TOOL.encode() not in s.body  # it never learned of the tool
    return script, audit(sent, fake, proxy, agent.dialect)
