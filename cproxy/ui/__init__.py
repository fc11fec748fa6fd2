"""The operator console: a static page, its script modules and stylesheet (docs/console.md).

The assets live in ``static/`` next to this file and ship as package data, so the console
works without internet access, a CDN or a build step. The page talks to the ``/v1`` API from
the browser with the operator's bearer token; serving it (``cproxy.api.ui``) needs no auth.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable

#: File suffix -> Content-Type of the console's assets (anything else is not served).
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


def static_dir() -> Traversable:
    """The directory holding ``index.html`` and the assets it loads."""
    return files(__name__) / "static"


def load_assets() -> dict[str, tuple[bytes, str]]:
    """Every servable asset by file name: ``{name: (content, media_type)}``.

    Read once at start-up: the set is small (tens of KiB) and fixed, and serving from a dict
    keyed by exact name rules out path traversal by construction.
    """
    assets: dict[str, tuple[bytes, str]] = {}
    for entry in static_dir().iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in MEDIA_TYPES:
            assets[entry.name] = (entry.read_bytes(), MEDIA_TYPES[suffix])
    return assets
