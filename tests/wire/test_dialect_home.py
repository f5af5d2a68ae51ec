"""What a wire format does lives in its dialect module (`cg/wire/dialects`), so a new dialect is
one module plus its tests: no code outside that package compares a value with a dialect's name,
or keys a table by one (read from the source with `ast`, as tests/test_layers.py reads
imports), and every registered dialect implements each method its base leaves open."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from cg.wire.dialects import DIALECTS, Dialect

CG = Path(__file__).resolve().parents[2] / "cg"
HOME = CG / "wire" / "dialects"
NAMES = frozenset(DIALECTS)


def _names_in(node: ast.AST) -> list[str]:
    """Dialect names spelled as string constants in `node` (itself, or a tuple/list/set)."""
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in NAMES]


def dialect_checks(source: str) -> list[tuple[int, str]]:
    """(line, name) of every comparison with a dialect's name (`==`, `!=`, `in`, `not in`, a
    `case` pattern) and every dict literal keyed by one."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                out += [(node.lineno, n) for n in _names_in(side)]
        elif isinstance(node, ast.Dict):
            out += [(node.lineno, n) for k in node.keys if k is not None for n in _names_in(k)]
        elif isinstance(node, ast.MatchValue):
            out += [(node.lineno, n) for n in _names_in(node.value)]
    return out


def test_the_check_finds_what_it_names() -> None:
    """Vacuity guard: each form the test forbids is found, and names outside a comparison
    (a default, a `Literal` of a config field) are not."""
    src = textwrap.dedent(
        """
        a = d == "anthropic"
        b = "openai" != d
        c = d in ("responses", "x")
        t = {"anthropic": 1}
        match d:
            case "openai":
                pass
        fine = cfg.get("provider", "anthropic")
        kind: Literal["anthropic", "openai"] = "openai"
        """
    )
    found = dialect_checks(src)
    assert [n for _, n in found] == ["anthropic", "openai", "responses", "anthropic", "openai"]


def test_no_dialect_name_is_compared_outside_the_dialects() -> None:
    files = [p for p in sorted(CG.rglob("*.py")) if HOME not in p.parents]
    assert len(files) > 50 and any(p.name == "stream.py" for p in files)  # the walk reached cg/
    found = [
        f"{p.relative_to(CG.parent)}:{line} compares with or keys by {name!r}"
        for p in files
        for line, name in dialect_checks(p.read_text(encoding="utf-8"))
    ]
    assert not found, "dialect knowledge outside cg/wire/dialects:\n" + "\n".join(found)


def _open_methods() -> list[str]:
    """The methods of `Dialect` whose body (past a docstring) only raises NotImplementedError."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Dialect)))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef)
    out = []
    for f in cls.body:
        if not isinstance(f, ast.FunctionDef):
            continue
        body = f.body[1:] if isinstance(f.body[0], ast.Expr) else f.body
        if len(body) == 1 and isinstance(body[0], ast.Raise):
            exc = body[0].exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                out.append(f.name)
    return out


def _open_attributes() -> list[str]:
    """The class attributes `Dialect` declares without a value."""
    return [n for n in Dialect.__annotations__ if not hasattr(Dialect, n)]


OPEN_METHODS = _open_methods()
OPEN_ATTRIBUTES = _open_attributes()


def test_the_base_leaves_methods_and_attributes_open() -> None:
    """Vacuity guard for the test below: there are dialects, and the base has open members."""
    assert len(DIALECTS) >= 3
    assert {"view", "call_begins", "summary_request", "usage_reader"} <= set(OPEN_METHODS)
    assert {"name", "path_suffix", "auto_cache", "key_env"} <= set(OPEN_ATTRIBUTES)


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_every_dialect_implements_the_base(name: str) -> None:
    cls = type(DIALECTS[name])
    missing = [m for m in OPEN_METHODS if getattr(cls, m) is getattr(Dialect, m)]
    missing += [a for a in OPEN_ATTRIBUTES if not hasattr(cls, a)]
    assert not missing, f"{name} leaves open: {missing}"
    assert cls.name == name
