"""Runs a task's steps (``busscrape.steps``) in a Playwright page.

A step that times out is retryable (the page may be slow today); a step that cannot work on
this page (a bad selector, ``evaluate`` not allowed) is permanent. Navigations made by
``goto`` steps pass the same network policy as the task's URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page
from playwright.async_api import TimeoutError as PlaywrightTimeout

from busscrape.errors import InvalidTask, NavigationTimeout
from busscrape.model.steps import (
    Click,
    Evaluate,
    Fill,
    Goto,
    Press,
    Screenshot,
    Scroll,
    Sleep,
    Step,
    WaitFor,
    WaitStable,
)
from busscrape.telemetry import tracing
from busscrape.worker.page_errors import first_line

# Resolves once the DOM has been quiet for `quiet` ms, or after `timeout` ms (false then).
_WAIT_STABLE_JS = """
([quiet, timeout]) => new Promise((resolve) => {
  let timer;
  const started = performance.now();
  const done = (stable) => { observer.disconnect(); clearTimeout(timer); clearTimeout(cap); resolve(stable); };
  const observer = new MutationObserver(() => { clearTimeout(timer); timer = setTimeout(() => done(true), quiet); });
  observer.observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
  timer = setTimeout(() => done(true), quiet);
  const cap = setTimeout(() => done(false), timeout);
})
"""

_HEIGHT_JS = "() => Math.max(document.body ? document.body.scrollHeight : 0, document.documentElement.scrollHeight)"

ShotTaker = Callable[[str, bool], Awaitable[None]]
UrlChecker = Callable[[str], Awaitable[None]]


async def run_steps(page: Page, steps: tuple[Step, ...], *, default_timeout: float, allow_evaluate: bool,
                    check_url: UrlChecker, take_screenshot: ShotTaker) -> None:
    """Execute ``steps`` in order; raises NavigationTimeout or InvalidTask."""
    for index, step in enumerate(steps):
        try:
            with tracing.span(f"step {step.action}", **{"busscrape.step": index + 1}):
                await _run(page, step, default_timeout, allow_evaluate, check_url, take_screenshot)
        except PlaywrightTimeout as exc:
            raise NavigationTimeout(f"step {index + 1} ({step.action}) timed out: {first_line(exc, 300)}",
                                    reason="step_timeout") from None
        except PlaywrightError as exc:
            if "Timeout" in exc.message:
                raise NavigationTimeout(f"step {index + 1} ({step.action}) timed out: {first_line(exc, 300)}",
                                        reason="step_timeout") from None
            raise InvalidTask(f"step {index + 1} ({step.action}) failed: {first_line(exc, 300)}",
                              reason="step_failed") from None


async def _run(page: Page, step: Step, default_timeout: float, allow_evaluate: bool, check_url: UrlChecker,
               take_screenshot: ShotTaker) -> None:
    timeout_ms = (getattr(step, "timeout", None) or default_timeout) * 1000
    match step:
        case Goto():
            await check_url(step.url)
            await page.goto(step.url, wait_until=step.wait_until, timeout=timeout_ms)
        case WaitFor(selector=str() as selector):
            await page.wait_for_selector(selector, state=step.selector_state, timeout=timeout_ms)
        case WaitFor():
            await page.wait_for_load_state(step.state, timeout=timeout_ms)
        case Click():
            await page.click(step.selector, button=step.button, timeout=timeout_ms)
        case Fill():
            await page.fill(step.selector, step.value, timeout=timeout_ms)
        case Press(selector=str() as selector):
            await page.press(selector, step.key, timeout=timeout_ms)
        case Press():
            await page.keyboard.press(step.key)
        case Scroll():
            await _scroll(page, step)
        case WaitStable():
            await page.evaluate(_WAIT_STABLE_JS, [step.quiet * 1000, step.timeout * 1000])
        case Sleep():
            await asyncio.sleep(step.duration)
        case Screenshot():
            await take_screenshot(step.name, step.full_page)
        case Evaluate():
            if not allow_evaluate:
                raise InvalidTask("the evaluate step is disabled on this worker (BUSSCRAPE_WORKER__ALLOW_EVALUATE)",
                                  reason="evaluate_disabled")
            await page.evaluate(step.script)


async def _scroll(page: Page, step: Scroll) -> None:
    """To the bottom once, or (infinite) until the page stops growing or the cap is reached."""
    rounds = 1 if step.mode == "bottom" else step.max_scrolls
    unchanged = 0
    height = await page.evaluate(_HEIGHT_JS)
    for _ in range(rounds):
        await page.evaluate("() => window.scrollTo(0, document.documentElement.scrollHeight)")
        if step.mode == "bottom":
            return
        await asyncio.sleep(step.delay)
        new_height = await page.evaluate(_HEIGHT_JS)
        unchanged = unchanged + 1 if new_height <= height else 0
        height = max(height, new_height)
        if unchanged >= 2:  # two rounds without growth: the feed has ended
            return
