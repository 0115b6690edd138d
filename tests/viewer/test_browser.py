"""The viewer page in a real headless Chromium (Debian's `chromium`, installed by `scripts/setup.sh --test` as root)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from agentic_rl.viewer import build_view

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "playwright is not installed (it is in the 'test' extra)"
    if reason is None and CHROMIUM is None:
        reason = "no chromium on PATH: scripts/setup.sh --test installs Debian's chromium when run as root"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {reason}")
        pytest.skip(reason)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _open(browser, path):
    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto(path.resolve().as_uri())
    return page, problems


@pytest.mark.slow
def test_page_lists_a_real_rollout_and_shows_a_known_turn_with_its_tool_call(browser, rollout_run):
    records = [json.loads(line) for line in (rollout_run / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 6 and not any(r["failed"] for r in records), [r["error"] for r in records]
    page, problems = _open(browser, build_view(rollout_run, page_size=4))

    assert page.inner_text("#count") == "6 of 6 trajectories"
    assert page.locator("tr.traj-row").count() == 4  # first page of 4
    assert page.inner_text("#page") == "page 1 / 2"
    page.click("#next")
    assert page.locator("tr.traj-row").count() == 2

    known = next(r for r in records if r["idx"] == 1)
    call, result = known["chat_completions"][2]["content"], known["chat_completions"][3]["content"]
    expression = json.loads(call.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]["expression"]
    page.click("#prev")
    page.locator("tr.traj-row", has_text="What is 17 * 23?").click()
    assert page.inner_text("#detail-title").startswith("trajectory 1")
    turn = page.locator('section.turn[data-turn="1"]')
    tokens = turn.locator(".tokens").inner_text()
    assert expression in tokens and "<|im_start|>tool" in tokens  # sampled call, then the inserted observation
    assert turn.locator(".box.call").inner_text() == f'calculator({{"expression":"{expression}"}})'
    assert turn.locator(".box.result").inner_text() == f"[tool] {result}"
    sampled = turn.locator(".tokens .tok:not(.env)")
    assert sampled.count() == known["steps"][0]["info"]["sampled_tokens"]
    assert "logprob" in sampled.first.get_attribute("title")
    assert turn.locator(".tokens .tok.env").count() > 0
    assert known["termination_reason"] in page.inner_text(".meta")

    two_turns = sum(1 for r in records if r["metrics"]["steps"] >= 2)
    page.fill("#f-turns-min", "2")
    assert page.inner_text("#count") == f"{two_turns} of 6 trajectories"
    page.fill("#f-turns-min", "")
    page.select_option("#f-status", "failed")
    assert page.inner_text("#count") == "0 of 6 trajectories"
    assert page.locator("tr.traj-row").count() == 0
    page.select_option("#f-status", "")
    page.fill("#f-reward-min", "0.5")
    rewarded = sum(1 for r in records if r["trajectory_reward"] >= 0.5)
    assert page.inner_text("#count") == f"{rewarded} of 6 trajectories"
    assert problems == []
    page.close()


def test_page_of_many_trajectories_renders_one_page_and_opens_from_the_address(browser, make_record, write_run,
                                                                               tmp_path, tokenizer):  # fmt: skip
    records = [make_record(i, reward=float(i % 2), failed=i % 10 == 0, reason="error" if i % 10 == 0 else "env_done")
               for i in range(2000)]  # fmt: skip
    run = write_run(tmp_path / "big", records)
    path = build_view(run, tokenizer=tokenizer)
    page, problems = _open(browser, path)
    assert page.inner_text("#count") == "2000 of 2000 trajectories"
    assert page.locator("tr.traj-row").count() == 100 and page.locator(".tok").count() == 0  # nothing rendered yet
    page.select_option("#f-status", "failed")
    assert page.inner_text("#count") == "200 of 2000 trajectories"
    page.goto(path.resolve().as_uri() + "#t=1234")
    page.reload()
    assert page.inner_text("#detail-title").startswith("trajectory 1234")
    assert page.locator('section.turn[data-turn="2"] .tokens').inner_text() == "The answer is 391.<|im_end|>"
    assert problems == []
    page.close()


def test_a_weight_version_change_inside_a_turn_is_marked_and_each_token_names_its_version(browser, make_record,
                                                                                        write_run, tmp_path, tokenizer):  # fmt: skip
    record = make_record()
    mask = record["response_mask"]
    start = len(mask) - mask[::-1].index(0)  # the second turn
    record["weight_versions"] = [3 if m else -1 for m in mask[:start]] + [3, 3] + [4] * (len(mask) - start - 2)
    page, problems = _open(browser, build_view(write_run(tmp_path / "versions", [record]), tokenizer=tokenizer))
    page.locator("tr.traj-row").first.click()
    first, second = page.locator('section.turn[data-turn="1"]'), page.locator('section.turn[data-turn="2"]')
    assert first.locator(".wv").count() == 0 and "weights 3" in first.locator("h3").inner_text()
    assert second.locator(".wv").count() == 1 and "weights 3→4" in second.locator("h3").inner_text()
    assert second.locator(".tokens").inner_text() == "The answer is 391.<|im_end|>"  # the marker adds no text
    sampled = second.locator(".tokens .tok:not(.env)")
    assert "weight version 3" in sampled.nth(1).get_attribute("title")
    assert "weight version 4" in sampled.nth(2).get_attribute("title")
    assert problems == []
    page.close()
