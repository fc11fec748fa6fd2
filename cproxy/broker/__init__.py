"""Drives the pure engine with a store: the broker facade and its per-group runners.

The HTTP layer and the metrics see only this package: the ``Broker`` facade and the plain
records it takes and returns, re-exported here so that nothing above the broker imports the
engine's modules.
"""

from cproxy.engine.group_config import GroupConfig
from cproxy.engine.records import Result
from cproxy.engine.snapshots import BlockedKey, GroupStats, Handout, Outcome

from .broker import Broker, Output
from .message_json import Delivered, delivery_json, message_json
from .push import PushStats
from .runner import Pulled
from .topics import SeekTarget
from .views import GroupSummary, GroupView
from .waiters import WatchGone, watch_with_task

__all__ = [
    "BlockedKey",
    "Broker",
    "Delivered",
    "GroupConfig",
    "GroupStats",
    "GroupSummary",
    "GroupView",
    "Handout",
    "Outcome",
    "Output",
    "Pulled",
    "PushStats",
    "Result",
    "SeekTarget",
    "WatchGone",
    "delivery_json",
    "message_json",
    "watch_with_task",
]
