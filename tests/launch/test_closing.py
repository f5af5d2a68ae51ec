"""The closing line: this run's figures, the proxy's stats after the agent minus before it."""

from __future__ import annotations

from typing import Any

import pytest

from cg.launch.closing import line, retention


def stats(requests: int, rewritten: int, not_sent: int, saved: float | None, billed: float,
          turns: int, mean: float | None) -> dict[str, Any]:  # fmt: skip
    return {
        "requests": requests,
        "rewritten": rewritten,
        "tokens_before": 0,
        "tokens_after": 0,
        "savings": {"tokens_not_sent": not_sent, "saved_usd": saved, "billed_usd": billed},
        "retention": {"turns": turns, "mean": mean, "min": mean},
    }


def test_the_line_is_the_difference_over_this_run() -> None:
    before = stats(10, 4, 5_000, 1.0, 2.0, 4, 1.0)
    after = stats(17, 9, 12_500, 1.25, 2.5, 9, 0.9)
    text = line(before, after, "proxy 127.0.0.1:1 reused, left running")
    assert text == (
        "context-guru: 5 of 7 turns rewritten, 7,500 tokens not sent, retention 82.0%, "
        "$0.2500 saved (estimate; $0.5000 billed) — proxy 127.0.0.1:1 reused, left running"
    )
    assert "\n" not in text


def test_retention_is_the_mean_of_this_runs_turns_alone() -> None:
    assert retention(stats(0, 0, 0, 0, 0, 2, 0.5), stats(0, 0, 0, 0, 0, 4, 0.75)) == (2, 1.0)
    assert retention(stats(0, 0, 0, 0, 0, 2, 0.5), stats(0, 0, 0, 0, 0, 2, 0.5)) == (0, None)


def test_nothing_rewritten_says_so_and_an_unpriced_model_is_unknown_not_zero() -> None:
    text = line(stats(0, 0, 0, 0.0, 0.0, 0, None), stats(3, 0, 0, None, 0.1, 0, None), "here")
    assert "0 of 3 turns rewritten" in text
    assert "retention n/a (no rewritten turn measured)" in text
    assert "unknown saved" in text and "$0.1000 billed" in text


def test_a_loss_is_shown_as_one() -> None:
    text = line(stats(0, 0, 0, 0.0, 0.0, 0, None), stats(2, 1, -40, -0.5, 0.7, 1, 1.0), "here")
    assert "-40 tokens not sent" in text and "-$0.5000 saved" in text


def test_an_older_proxy_without_savings_counts_the_spliced_tokens() -> None:
    before = {"requests": 1, "rewritten": 0, "tokens_before": 100, "tokens_after": 100}
    after = {"requests": 3, "rewritten": 2, "tokens_before": 900, "tokens_after": 300}
    text = line(before, after, "here")
    assert "2 of 2 turns rewritten, 600 tokens not sent" in text
    assert "unknown saved (estimate; unknown billed)" in text


@pytest.mark.parametrize("doc", [{}, {"requests": "x", "savings": None}])
def test_a_malformed_answer_gives_a_line_not_an_error(doc: dict[str, Any]) -> None:
    assert line(doc, doc, "here").startswith("context-guru: 0 of 0 turns rewritten")


def test_a_subscriptions_dollars_are_labelled_plan_equivalent() -> None:
    before, after = stats(0, 0, 0, 0.0, 0.0, 0, None), stats(2, 1, 10, 0.2, 0.3, 1, 1.0)
    assert "at API list prices, plan-equivalent — here" in line(before, after, "here", plan=True)
    assert "plan-equivalent" not in line(before, after, "here")
