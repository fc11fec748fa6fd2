"""Python client for cproxy: produce messages, and consume them in order per key.

>>> from consumer_sdk import Producer, Consumer, Message
>>> producer = Producer("http://127.0.0.1:9713")
>>> producer.send("rides", {"ride": 7, "event": "pickup"}, key="ride-7")  # doctest: +SKIP
>>> def handle(msg: Message) -> None: ...          # return = ack, raise = fail (retried)
>>> Consumer("http://127.0.0.1:9713", group="billing", topics=["rides"],
...          handler=handle).run()  # doctest: +SKIP

See ``docs/sdk.md`` for delivery semantics and every option.
"""

from consumer_sdk._ledger import ConsumerStats
from consumer_sdk.async_consumer import AsyncConsumer
from consumer_sdk.client import AsyncClient, Client
from consumer_sdk.config import NO_RETRY, ConsumerConfig, ConsumerOptions, RetryPolicy
from consumer_sdk.consumer import Consumer
from consumer_sdk.errors import (
    ApiError,
    BadRequest,
    CertificateError,
    ClientError,
    ConnectError,
    ConsumerError,
    DuplicateInProgress,
    NotAuthenticated,
    PayloadTooLarge,
    PermissionDenied,
    ProtocolError,
    RequestTimeout,
    ResourceConflict,
    ResourceNotFound,
    ServerError,
    ServiceUnavailable,
    Throttled,
    TransportError,
    ValidationFailed,
)
from consumer_sdk.idempotency import (
    Claim,
    IdempotencyStore,
    MemoryIdempotencyStore,
    SQLiteIdempotencyStore,
    idempotent,
)
from consumer_sdk.ids import IdGenerator, new_message_id
from consumer_sdk.models import (
    AckResult,
    ExtendResult,
    GroupInfo,
    Message,
    MessageRef,
    OutgoingMessage,
    Produce,
    PullResult,
    QueueResult,
    SendResult,
    TopicInfo,
)
from consumer_sdk.producer import AsyncProducer, Producer

__version__ = "0.1.0"

__all__ = [
    "NO_RETRY",
    "AckResult",
    "ApiError",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "BadRequest",
    "CertificateError",
    "Claim",
    "Client",
    "ClientError",
    "ConnectError",
    "Consumer",
    "ConsumerConfig",
    "ConsumerError",
    "ConsumerOptions",
    "ConsumerStats",
    "DuplicateInProgress",
    "ExtendResult",
    "GroupInfo",
    "IdGenerator",
    "IdempotencyStore",
    "MemoryIdempotencyStore",
    "Message",
    "MessageRef",
    "NotAuthenticated",
    "OutgoingMessage",
    "PayloadTooLarge",
    "PermissionDenied",
    "Produce",
    "Producer",
    "ProtocolError",
    "PullResult",
    "QueueResult",
    "RequestTimeout",
    "ResourceConflict",
    "ResourceNotFound",
    "RetryPolicy",
    "SQLiteIdempotencyStore",
    "SendResult",
    "ServerError",
    "ServiceUnavailable",
    "Throttled",
    "TopicInfo",
    "TransportError",
    "ValidationFailed",
    "idempotent",
    "new_message_id",
]
