"""Every import in cg/ points down the stack (docs/architecture.md), read from the source with
`ast`: a module may import its own package and the layers below it, never one above, and only
cg.proxy imports mitmproxy. Lazy imports inside functions count the same as top-level ones."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CG = Path(__file__).resolve().parents[1] / "cg"
# Bottom to top. A top-level module (settings, components, cli) is its own layer.
LAYERS = [
    "frozen",
    "settings",
    "wire",
    "state",
    "billing",
    "expand",
    "retention",
    "pipeline",
    "summarize",
    "mask",
    "components",
    "proxy",
    "simulate",
    "eval",
    "launch",
    "cli",
    "__main__",
]
RANK = {name: i for i, name in enumerate(LAYERS)}
# What cg/state shows the layers above it: the store's interface (`cg.state`, its protocol and
# records, the factory that picks an engine) and the modules that are not the store. The engines
# (`sqlite`, `sqlite_file`, `pgstore`, `pgconn`) and what they share (`sql`, `schema`, `policy`)
# are internal: a caller that imported one would run an engine's line for the other engine.
STATE_PUBLIC = {
    "cg.state",
    "cg.state.interface",
    "cg.state.records",
    "cg.state.engines",
    "cg.state.facts",
    "cg.state.pending",
    "cg.state.session",
    "cg.state.tenant",
    "cg.state.tokens",
}


def layer(module: str) -> str:
    """`cg.wire.body` -> `wire`; `cg.settings` -> `settings`; `cg` (the package root) -> ``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(source: str) -> list[tuple[str, int]]:
    """(imported module, line) for every absolute import in `source`; `from cg import x` gives
    `cg.x` (x may be a module)."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "cg":
                out += [(f"cg.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
    return out


def problems(module: str, source: str) -> list[str]:
    """What is wrong with `module`'s imports, one line each."""
    own = layer(module)
    out = []
    for name, line in imports(source):
        if name.split(".")[0] == "mitmproxy" and own != "proxy":
            out.append(f"{module}:{line} imports {name}: only cg.proxy may import mitmproxy")
        if not name.startswith("cg.") or name.split(".")[1] not in RANK:
            continue  # `cg` itself (its __version__)
        target = layer(name)
        if own and target != own and RANK[target] > RANK[own]:
            out.append(f"{module}:{line} imports {name}: {own} is below {target}")
        elif (
            own in ("summarize", "mask") and target == "pipeline" and name != "cg.pipeline.contract"
        ):
            out.append(f"{module}:{line} imports {name}: a component imports only the contract")
        elif own != "state" and target == "state" and name not in STATE_PUBLIC:
            out.append(f"{module}:{line} imports {name}: outside cg/state, only its interface")
    return out


def modules() -> list[tuple[str, str]]:
    out = []
    for path in sorted(CG.rglob("*.py")):
        parts = path.relative_to(CG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path.read_text(encoding="utf-8")))
    return out


def test_every_import_points_down_the_stack() -> None:
    found = modules()
    assert len(found) > 60  # vacuity guard: the walk reached the package
    assert {layer(m) for m, _ in found} - {""} == set(LAYERS)  # every layer exists, no other
    edges = sum(1 for _, src in found for n, _ in imports(src) if n.startswith("cg."))
    assert edges > 150
    bad = [p for m, src in found for p in problems(m, src)]
    assert bad == []


def test_only_the_proxy_package_imports_mitmproxy() -> None:
    importers = {
        m for m, src in modules() for n, _ in imports(src) if n.split(".")[0] == "mitmproxy"
    }
    assert importers and {layer(m) for m in importers} == {"proxy"}


@pytest.mark.parametrize(
    ("module", "source", "complaint"),
    [
        ("cg.wire.body", "from cg.state.store import Store", "wire is below state"),
        ("cg.state.session", "def f():\n    import cg.proxy.addon\n", "state is below proxy"),
        ("cg.expand.tool", "from mitmproxy import http", "only cg.proxy may import mitmproxy"),
        ("cg.summarize.span", "from cg.pipeline.runner import run_pipeline", "only the contract"),
        ("cg.settings", "from cg.wire.usage import Usage", "settings is below wire"),
        ("cg.proxy.addon", "from cg.state.sqlite import SqliteStore", "only its interface"),
        ("cg.cli", "def f():\n    import cg.state.pgstore\n", "only its interface"),
        ("cg.billing.ledger", "from cg.state.sql import PG", "only its interface"),
    ],
)
def test_the_checker_catches_an_upward_import(module: str, source: str, complaint: str) -> None:
    (p,) = problems(module, source)
    assert complaint in p


def test_the_checker_allows_what_points_down() -> None:
    src = "from cg.wire.body import index_body\nfrom cg.pipeline.contract import Step\n"
    assert problems("cg.summarize.component", src) == []
    src = "from cg.state import Store\nfrom cg.state.records import Stash\n"
    assert problems("cg.proxy.addon", src) == []
    assert problems("cg.state.engines", "from cg.state.sqlite import SqliteStore") == []
    assert problems("cg.proxy.addon", "from mitmproxy import http\nimport cg") == []
