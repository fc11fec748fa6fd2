"""Drives the console page in the browser: open it, read numbers, click, confirm.

The console re-renders every refresh, so an element found a moment ago may be gone: reads and
clicks retry on stale elements until their deadline (the same deadline-polling as the rest of
the suite, never a bare sleep).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from selenium.common.exceptions import (
    ElementClickInterceptedException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

T = TypeVar("T")
#: Refresh period of the page under test (the console's ``?refresh_ms=``): fast, so tests are.
REFRESH_MS = 300
_TRANSIENT = (NoSuchElementException, StaleElementReferenceException)


class ConsolePage:
    def __init__(self, driver: WebDriver, base_url: str) -> None:
        self.driver = driver
        self.base_url = base_url

    def open(self, wait_for_data: bool = True) -> None:
        self.driver.get(f"{self.base_url}/ui?refresh_ms={REFRESH_MS}")
        self.driver.get_log("browser")  # start each page with an empty console log
        if wait_for_data:
            self.wait(lambda: self.polls() >= 1, "the first refresh")

    def wait(self, predicate: Callable[[], T], message: str, timeout_s: float = 10.0) -> T:
        """Poll ``predicate`` (elements missing or stale count as "not yet") until truthy."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            try:
                last = predicate()
                if last:
                    return last
            except _TRANSIENT as exc:
                last = exc
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s}s waiting for {message}: {last!r}"
                )
            time.sleep(0.05)

    # ---- reading ------------------------------------------------------------------------

    def polls(self) -> int:
        value = self.driver.execute_script("return document.body.dataset.polls || '0'")
        return int(value)

    def text(self, css: str) -> str:
        """The element's rendered text, read in one script turn (so a refresh cannot replace
        the element half-way through the read); a missing element raises like Selenium."""
        value = self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : null", css
        )
        if value is None:
            raise NoSuchElementException(css)
        return str(value).strip()

    def visible(self, css: str) -> bool:
        return bool(
            self.driver.execute_script(
                "const e = document.querySelector(arguments[0]);return !!e && e.checkVisibility()",
                css,
            )
        )

    def attr(self, css: str, name: str) -> str:
        value = self.driver.execute_script(
            "const e = document.querySelector(arguments[0]);"
            "return e ? e.getAttribute(arguments[1]) || '' : null",
            css,
            name,
        )
        if value is None:
            raise NoSuchElementException(css)
        return str(value)

    def group(self, name: str) -> str:
        return f'article.group[data-group="{name}"]'

    def stat(self, group: str, name: str) -> str:
        return self.text(f'{self.group(group)} [data-stat="{name}"] dd')

    def wait_stat(self, group: str, name: str, expected: str) -> None:
        self.wait(
            lambda: self.stat(group, name) == expected,
            f"group {group} {name} to read {expected!r}",
        )

    # ---- acting -------------------------------------------------------------------------

    def click(self, css: str, timeout_s: float = 10.0) -> None:
        """Click the element (re-finding it if a refresh replaced it)."""

        def attempt() -> bool:
            try:
                self.driver.find_element(By.CSS_SELECTOR, css).click()
            except ElementClickInterceptedException:
                return False
            return True

        self.wait(attempt, f"clicking {css}", timeout_s)

    def confirm(self) -> None:
        """Press Confirm in the open confirmation dialog and wait for it to close."""
        self.wait(lambda: self.visible("#confirm[open]"), "the confirmation dialog")
        self.click("#confirm-ok")
        self.wait(lambda: not self.visible("#confirm[open]"), "the dialog to close")

    def dialog_error(self) -> str:
        return self.text("#confirm-error")

    def script_errors(self) -> list[str]:
        """Browser-console errors other than failed fetches (401/404 answers are expected)."""
        return [
            entry["message"]
            for entry in self.driver.get_log("browser")
            if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]
        ]
