"""Serves the operator console (``cproxy.ui``) at ``GET /ui`` and its assets under ``/ui/``.

The page and its assets need no token: they hold no data. Every API call the page makes
carries the operator's bearer token and is checked like any other ``/v1`` call.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import RedirectResponse, Response

from cproxy.errors import NotFound
from cproxy.ui import load_assets

router = APIRouter(tags=["console"], include_in_schema=False)

_ASSETS = load_assets()
#: The console changes only with the package: let browsers revalidate rather than guess.
_HEADERS = {"cache-control": "no-cache", "x-content-type-options": "nosniff"}


@router.get("/ui")
async def console() -> Response:
    """The console page. Its asset and API links are relative to ``/ui``, so the console also
    works behind a reverse proxy that mounts cproxy under a path prefix."""
    return _asset("index.html")


@router.get("/ui/")
async def console_slash() -> Response:
    # Relative links resolve differently under "/ui/": send the browser to the one true URL.
    return RedirectResponse("../ui", status_code=308)


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    return _asset(name)


def _asset(name: str) -> Response:
    found = _ASSETS.get(name)
    if found is None:
        raise NotFound(f"no console asset named {name!r}")
    content, media_type = found
    return Response(content, media_type=media_type, headers=_HEADERS)
