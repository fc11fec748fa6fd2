"""A real headless Chromium for the console tests (Debian's ``chromium`` + ``chromium-driver``).

The README's test command only installs the Python packages, so when the browser is missing
the session installs it with apt (as root), running ``apt-get update`` first if the install
fails. When it still has no browser, every test here is skipped with the reason printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        ["apt-get", *args], capture_output=True, text=True, env=env, timeout=900, check=False
    )


def _install() -> str:
    """Install the browser with apt; returns why it failed ("" on success)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "chromium/chromedriver are missing and installing them needs root"
    if shutil.which("apt-get") is None:
        return "chromium/chromedriver are missing and there is no apt-get to install them"
    print("tests/ui: installing chromium and chromium-driver with apt-get", file=sys.stderr)
    done = _apt("install", "-y", "-q", *APT_PACKAGES)
    if done.returncode != 0:
        _apt("update", "-q")
        done = _apt("install", "-y", "-q", *APT_PACKAGES)
    if done.returncode != 0:
        return f"apt-get install {' '.join(APT_PACKAGES)} failed: {done.stderr.strip()[-300:]}"
    return ""


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Paths of the Chromium binary and its driver, installed if need be, or a skip."""
    if webdriver is None:
        pytest.skip("selenium is not installed (pip install -e '.[dev]')")
    found = _find()
    if found is None:
        reason = _install()
        found = _find()
        if found is None:
            reason = reason or "chromium/chromedriver still not found after installing"
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
