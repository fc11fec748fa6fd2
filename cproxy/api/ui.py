"""Serves the operator console (``cproxy.ui``) at ``GET /ui`` and its assets under ``/ui/``.

The page and its assets need no token: they hold no data. Every API call the page makes
carries the operator's bearer token and is checked like any other ``/v1`` call.
"""

from __future__ import annotations

from cproxy.errors import NotFound
from cproxy.ui import load_assets

from .endpoint import Call, Endpoint
from .errors import Reply, reply

_ASSETS = load_assets()
#: The console changes only with the package: let browsers revalidate rather than guess.
_HEADERS = ((b"cache-control", b"no-cache"), (b"x-content-type-options", b"nosniff"))


async def console(call: Call[None, None]) -> Reply:
    """The console page. Its asset and API links are relative to ``/ui``, so the console also
    works behind a reverse proxy that mounts cproxy under a path prefix."""
    return _asset("index.html")


async def console_slash(call: Call[None, None]) -> Reply:
    # Relative links resolve differently under "/ui/": send the browser to the one true URL.
    return reply(b"", 308, b"text/plain", (b"location", b"../ui"))


async def asset(call: Call[None, None]) -> Reply:
    return _asset(call.params["name"])


def _asset(name: str) -> Reply:
    found = _ASSETS.get(name)
    if found is None:
        raise NotFound(f"no console asset named {name!r}")
    content, media_type = found
    return reply(content, 200, media_type.encode(), *_HEADERS)


#: Not in the OpenAPI document (``answers`` empty): the console is no part of the API.
ENDPOINTS = [
    Endpoint("GET", "/ui", console, action=None, summary="console", answers={}),
    Endpoint("GET", "/ui/", console_slash, action=None, summary="console/", answers={}),
    Endpoint("GET", "/ui/{name}", asset, action=None, summary="console asset", answers={}),
]
