"""The mitmweb view of a masked turn (the addon configured with `pipeline: [mask]`): the record
carries the mask's count, savings and checkpoint; the view says so and lists each stub whole
(the tool, its input, the size it replaced, its id)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from mitmproxy.test import taddons

from cg.mask.component import Mask
from cg.proxy.addon import META, ContextGuru
from cg.proxy.view import RECORD, OriginalView, RewriteView, rebuild_original
from tests.proxy.test_view import flow_of, render
from tests.support.masking import BODIES, dumps, mask_config, replaced, words


async def test_a_masked_turn_shows_its_stubs_and_what_they_replaced(tmp_path: Path) -> None:
    cfg = tmp_path / "cg.yaml"
    cfg.write_text(yaml.safe_dump({"pipeline": ["mask"], "components": {"mask": mask_config()}}))
    cg = ContextGuru()
    with taddons.context(cg) as tctx:
        tctx.configure(cg, cg_preset="summarize", cg_config=str(cfg), cg_db=str(tmp_path / "db"))
        (comp,) = cg.components
        assert isinstance(comp, Mask)
        body = dumps(BODIES["anthropic"]([words(300, f"v{n}") for n in range(5)]))
        f = flow_of(body)
        cg.request(f)
        assert f.metadata[META]["outcome"] == "rewritten", f.metadata[META]  # vacuity
        rec = f.metadata[RECORD]
        assert rec["masked"] == {"masked": 3, "tokens_saved": rec["masked"]["tokens_saved"],
                                 "checkpoint": "first mask"}  # fmt: skip
        assert rec["masked"]["tokens_saved"] > 500
        assert rec["tokens"][1] == rec["tokens"][0] - rec["masked"]["tokens_saved"]
        assert len(json.dumps(rec)) < 1000
        assert f.comment.startswith("cg: rewritten 13→13 messages")

        view, original = cg.views
        assert isinstance(view, RewriteView) and isinstance(original, OriginalView)
        text = render(view, f)
        joined = "\n".join(text)
        assert "masked 3 old tool outputs" in joined and "checkpoint: first mask" in joined
        (at,) = [n for n, line in enumerate(text) if line.startswith("── 3 masked tool outputs")]
        stubs = [stub for _, stub in replaced(body, f.request.content or b"")]
        listed = " ".join(line.strip() for line in text[at + 1 : at + 12])
        for n, stub in zip((2, 4, 6), stubs, strict=True):
            assert f"[{n}] {stub}" in listed
        assert "characters" in listed and "#1" in listed

        # The original, one click away: each masked message back from the stash its id names,
        # byte for byte the client's body.
        head = " ".join(render(original, f)[:3])
        assert "rebuilt from the body sent and the masked outputs' stashes" in head
        assert f"{len(body):,} bytes, as the client sent" in head
        rec_ = f.metadata[RECORD]
        assert rebuild_original(f.request.content or b"", rec_, None, cg._stash) == body
        # A stash gone: said in one line, the body sent below.
        gone = OriginalView(lambda key: None)
        assert "no longer in the store" in render(gone, f)[0]
        cg.done()
