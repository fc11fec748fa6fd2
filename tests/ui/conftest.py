"""A real headless Chromium for the console tests (Debian's ``chromium`` + ``chromium-driver``).

The test suite never installs anything on the host: ``.ci/run`` installs the browser
explicitly (README, "Tests"). Without it, every test here is skipped with the reason printed.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
except ImportError:  # pragma: no cover - selenium is in the dev extra
    webdriver = None  # type: ignore[assignment]

BROWSERS = ("chromium", "chromium-browser")
#: What provides them on Debian and Ubuntu (what ``.ci/run`` installs).
APT_PACKAGES = ("chromium", "chromium-driver")
#: The flags this machine needs (no sandbox as root, no GPU, nothing phoning home).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)


def _find() -> tuple[str, str] | None:
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Paths of the Chromium binary and its driver, or a skip saying what is missing."""
    if webdriver is None:
        pytest.skip("selenium is not installed (pip install -e '.[dev]')")
    found = _find()
    if found is None:
        reason = (
            "chromium/chromedriver not found: install them to run the console tests "
            f"(apt-get install {' '.join(APT_PACKAGES)}, as .ci/run does)"
        )
        print(f"tests/ui skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def browser(
    chromium: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[webdriver.Chrome]:
    """One headless browser per test module, with a fresh profile."""
    binary, driver_path = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    profile: Path = tmp_path_factory.mktemp("chromium-profile")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path keeps Selenium Manager from trying to download one.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
