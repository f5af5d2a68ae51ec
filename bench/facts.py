"""What the simulator's corpus adds to `bench.corpus`'s transcript so that every fact kind
retention counts (docs/behaviour.md#retention) occurs all through a session, varied:

- **human prompts that state constraints** ("Do not touch the migrations directory; keep the
  public API of parser.py unchanged"), where the transcript has a human prompt mid-session;
- **tool outputs with errors**: a failing test run (`FAILED tests/test_x.py::test_y -
  AssertionError: …`), an application log ending in a traceback, Rust compiler errors
  (`error[E0425]: …`), each with the command that ran it;
- **file edits and shell commands**: `Edit` and `Write` calls on a few dozen paths, and Bash
  commands of many shapes (`sed -n`, `git diff`, `ruff check`, `rg`, `ls`).

Everything is drawn from the round's own content RNG, so the transcript stays deterministic and
its structure (how many messages, where the turns end) is the one `bench.corpus` gives.
"""

from __future__ import annotations

import random
from typing import Any

# A call of one of these kinds is drawn instead of `bench.corpus`'s own with this probability.
P_FACT_CALL = 0.3
KINDS = ("failing", "traceback", "rustc", "write", "modify", "shell")
_WEIGHTS = (3, 2, 2, 2, 4, 6)
FAILING = frozenset({"failing", "traceback", "rustc"})

_MODULES = (
    "config", "parser", "cli", "store/sqlite", "store/memory", "http/client", "http/retry",
    "auth", "cache", "schema", "migrate", "report", "render", "plugins/loader", "plugins/hooks",
    "util/paths", "util/timefmt", "server", "worker", "queue",
)  # fmt: skip
_DIRS = (
    "migrations",
    "vendor",
    "src/app/store",
    "docs/api",
    "scripts",
    "src/app/http",
    "tests/data",
)
_CRATES = ("core", "wire", "store", "cli", "macros")
_IDENTS = (
    "retries", "host_list", "cfg", "parsed", "token", "cursor", "offset", "reader", "backoff",
    "session_id", "payload", "limit", "schema_v2", "row", "timeout_ms", "entry",
)  # fmt: skip
_CONSTRAINTS = (
    "Do not touch the {dir} directory; keep the public API of {base}.py unchanged.",
    "Keep {path} compatible with Python 3.9 and do not add any new dependency for this.",
    "Stop editing {path}; the bug is in {path2}. Run only tests/test_{base2}.py until it passes.",
    "Leave the {dir} directory as it is and never commit without running the full suite first.",
    "Use the existing {ident} helper instead of writing a new one, and leave {path} alone.",
    "Don't change anything under {dir}; add a regression test to tests/test_{base}.py instead.",
    "Please keep the error messages of {base}.py exactly as they are, other tools parse them.",
    "No force pushes and no rebases on main; put the fix for {base2} on a branch of its own.",
    "The {ident} field must stay optional in {path}; old config files do not have it.",
    "Only the {dir} directory may gain new files, and keep the diff under 200 lines.",
)
_LOG = (
    "INFO app.{mod}: loading {path}",
    "INFO app.{mod}: {n} entries read in {ms} ms",
    "DEBUG app.{mod}: cache hit for key {ident}:{n}",
    "INFO app.worker: job {n} queued ({ms} ms)",
    "DEBUG app.http.client: GET /v1/items?offset={n} -> 200 in {ms} ms",
)
_EXCEPTIONS = (
    "KeyError: '{ident}'",
    "ValueError: invalid literal for int() with base 10: '{ident}'",
    "AttributeError: 'NoneType' object has no attribute '{ident}'",
    "FileNotFoundError: [Errno 2] No such file or directory: '{path}'",
    "TypeError: {ident}() missing 1 required positional argument: 'limit'",
)
_RUSTC = (
    ("E0425", "cannot find value `{ident}` in this scope"),
    ("E0308", "mismatched types: expected `u32`, found `Option<u32>`"),
    ("E0599", "no method named `{ident}` found for struct `Reader` in the current scope"),
    ("E0382", "borrow of moved value: `{ident}`"),
    ("E0433", "failed to resolve: use of undeclared crate or module `{ident}`"),
)
ROOT = "/home/dev/project"


def _mod(rng: random.Random) -> str:
    return rng.choice(_MODULES)


def _base(mod: str) -> str:
    return mod.rsplit("/", 1)[-1]


def _fill(rng: random.Random, template: str) -> str:
    mod, mod2 = _mod(rng), _mod(rng)
    return template.format(
        dir=rng.choice(_DIRS),
        path=f"src/app/{mod}.py",
        path2=f"src/app/{mod2}.py",
        base=_base(mod),
        base2=_base(mod2),
        mod=mod.replace("/", "."),
        ident=rng.choice(_IDENTS),
        n=rng.randint(2, 9999),
        ms=rng.randint(1, 900),
    )


def constraint(rng: random.Random) -> str:
    """A human prompt mid-session that states a constraint (sometimes two)."""
    text = _fill(rng, rng.choice(_CONSTRAINTS))
    if rng.random() < 0.3:
        text += " " + _fill(rng, rng.choice(_CONSTRAINTS))
    return text


def call(rng: random.Random, step: int) -> tuple[str, str, dict[str, Any]]:
    """(kind, tool name, input) of one call of `KINDS`."""
    kind = rng.choices(KINDS, _WEIGHTS)[0]
    mod = _mod(rng)
    path = f"{ROOT}/src/app/{mod}.py"
    if kind == "failing":
        test = f"tests/test_{_base(mod)}.py"
        cmd = f"cd {ROOT} && python -m pytest -q --tb=no -rA {test}"
        return kind, "Bash", {"command": cmd, "description": f"Run {test} (step {step})"}
    if kind == "traceback":
        sub = rng.choice(("import", "sync", "report", "serve --once", "migrate --dry-run"))
        cmd = f"cd {ROOT} && python -m app.cli {sub} --config tests/data/{_base(mod)}.toml"
        return kind, "Bash", {"command": cmd, "description": "Reproduce with the CLI"}
    if kind == "rustc":
        crate = rng.choice(_CRATES)
        cmd = f"cd {ROOT}/native && cargo {rng.choice(('build', 'check', 'test --no-run'))} -p app-{crate}"
        return kind, "Bash", {"command": cmd, "description": "Build the native crate"}
    if kind == "write":
        name = f"{ROOT}/src/app/{mod}_{rng.choice(_IDENTS)}.py"
        body = f'"""Helpers for {_base(mod)}."""\n\n\ndef {rng.choice(_IDENTS)}(x):\n    return x\n'
        return kind, "Write", {"file_path": name, "content": body}
    if kind == "modify":
        ident = rng.choice(_IDENTS)
        return (
            kind,
            "Edit",
            {
                "file_path": path,
                "old_string": f"    {ident} = None\n",
                "new_string": f"    {ident} = default_{ident}()\n",
            },
        )
    shapes = (
        f"sed -n '{rng.randint(1, 300)},{rng.randint(301, 600)}p' src/app/{mod}.py",
        f"git diff --stat -- src/app/{mod}.py tests/",
        f"ruff check src/app/{mod}.py --select E,F,B",
        f'rg -n "{rng.choice(_IDENTS)}" src/app tests',
        f"ls -la src/app/{mod.rsplit('/', 1)[0] if '/' in mod else ''}",
        f"git log --oneline -{rng.randint(3, 30)} -- src/app/{mod}.py",
        f"wc -l src/app/{mod}.py tests/test_{_base(mod)}.py",
    )
    cmd = f"cd {ROOT} && {rng.choice(shapes)}"
    return kind, "Bash", {"command": cmd, "description": "Look around"}


def _pad(rng: random.Random, lines: tuple[str, ...] | list[str], chars: int) -> list[str]:
    out: list[str] = []
    size = 0
    while size < chars:
        line = _fill(rng, rng.choice(lines))
        out.append(line)
        size += len(line) + 1
    return out


def output(rng: random.Random, kind: str, args: dict[str, Any], chars: int) -> str:
    """The tool output of a call of `KINDS`, about `chars` long; a failing kind's first line
    that states an error is its own (the test, the exception, the compiler error)."""
    mod = _mod(rng)
    if kind == "failing":
        test = args["command"].rsplit(" ", 1)[-1]
        name = f"test_{rng.choice(_IDENTS)}_{rng.randint(1, 99)}"
        passed = [
            f"PASSED {test}::test_{rng.choice(_IDENTS)}_{n}" for n in range(max(1, chars // 48))
        ]
        a, b = rng.randint(0, 99), rng.randint(100, 199)
        return "\n".join(
            [
                "." * min(len(passed), 60) + "F" + " " * 8 + "[100%]",
                "=========================== short test summary info ============================",
                *passed,
                f"FAILED {test}::{name} - AssertionError: assert {a} == {b}",
                f"1 failed, {len(passed)} passed in {rng.randint(1, 30) / 10:.2f}s",
            ]
        )
    if kind == "traceback":
        frames = [
            f'  File "{ROOT}/src/app/{_mod(rng)}.py", line {rng.randint(10, 900)}, in '
            f"{rng.choice(_IDENTS)}\n    {rng.choice(_IDENTS)} = load({rng.choice(_IDENTS)})"
            for _ in range(rng.randint(3, 8))
        ]
        when = (
            f"2026-11-30 {rng.randint(8, 18):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        )
        return "\n".join(
            [
                *_pad(rng, _LOG, max(0, chars - 900)),
                f"{when} ERROR app.{mod.replace('/', '.')}: {rng.choice(('import', 'sync', 'load'))}"
                f" of {ROOT}/tests/data/{_base(mod)}.toml aborted",
                "Traceback (most recent call last):",
                *frames,
                _fill(rng, rng.choice(_EXCEPTIONS)),
            ]
        )
    if kind == "rustc":
        crate = args["command"].rsplit("app-", 1)[-1]
        code, what = rng.choice(_RUSTC)
        ident = rng.choice(_IDENTS)
        line, col = rng.randint(5, 800), rng.randint(1, 60)
        compiling = [
            f"   Compiling {rng.choice(('serde', 'tokio', 'bytes', 'memchr', 'itoa', 'libc'))}"
            f" v1.{rng.randint(0, 40)}.{rng.randint(0, 9)}"
            for _ in range(max(1, (chars - 400) // 36))
        ]
        return "\n".join(
            [
                *compiling,
                f"   Compiling app-{crate} v0.{rng.randint(1, 9)}.0 ({ROOT}/native/{crate})",
                f"error[{code}]: {what.format(ident=ident)}",
                f"  --> {crate}/src/{rng.choice(_IDENTS)}.rs:{line}:{col}",
                "   |",
                f"{line:>3} |     let n = {ident}.len();",
                f"    |             {'^' * len(ident)} not found in this scope",
                "",
                f"error: could not compile `app-{crate}` (lib) due to 1 previous error",
            ]
        )
    if kind == "write":
        return f"File created successfully at: {args['file_path']}"
    if kind == "modify":
        head = f"The file {args['file_path']} has been updated. Here's the result of running `cat -n` on a snippet of the edited file:"
        body = [
            f"{n:>6}\t    {rng.choice(_IDENTS)} = {rng.choice(_IDENTS)}({n})"
            for n in range(1, max(2, chars // 40))
        ]
        return "\n".join([head, *body])
    return "\n".join(_pad(rng, _LOG, chars) if rng.random() < 0.3 else [
        f"src/app/{_mod(rng)}.py:{rng.randint(1, 900)}:    {rng.choice(_IDENTS)} = {rng.choice(_IDENTS)}"
        for _ in range(max(1, chars // 60))
    ])  # fmt: skip
