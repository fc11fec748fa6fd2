"""Route dependencies shared by the routers.

Dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in its
threadpool, which would add a thread round trip to every request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from cproxy.broker import Broker


async def _broker(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


BrokerDep = Annotated[Broker, Depends(_broker)]
