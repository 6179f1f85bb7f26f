"""An order service: POST /orders answers 201 once the order's message is guaranteed.

A Starlette app served by uvicorn, with eoguard's AsyncGuardedProducer started and closed by
the app's lifespan. The endpoint awaits ``producer.send``: by the time the client reads 201,
the order is in the Redis outbox (persist-first) or acknowledged by Kafka, and no crash of
this process loses it (a restarted one resends what its predecessor left in the outbox).
The message id is derived from the order id (``message_id_for``), so a client that retries
a request whose answer it lost sends the same message, which consumers handle once::

    pip install 'eoguard[asgi-example]'
    python -m eoguard.stack up
    python examples/asgi_orders.py --bootstrap 127.0.0.1:19092 \\
        --redis redis://127.0.0.1:16379/0 --topic orders --port 8000
    curl -X POST localhost:8000/orders -d '{"order_id": "o-1", "amount": "12.50"}'

Answers: 201 ``{"message_id": ..., "instance": ...}``; 400 for a body without an
``order_id`` string (or a message eoguard refuses); 503 when eoguard cannot guarantee the
order now (Redis or Kafka unavailable, queue full, shutting down): the client may retry.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import uvicorn
from stack_args import stack_parser
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from eoguard import (
    AsyncGuardedProducer,
    InvalidInputError,
    KeySpace,
    ProducerConfig,
    RedisConfig,
    StateError,
    UnavailableError,
    message_id_for,
)


def create_app(config: ProducerConfig, topic: str) -> Starlette:
    """The app; its lifespan starts the producer (recovering the outbox) and closes it."""
    producer = AsyncGuardedProducer(config)

    async def place_order(request: Request) -> JSONResponse:
        try:
            order = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        order_id = order.get("order_id") if isinstance(order, dict) else None
        if not isinstance(order_id, str) or not order_id:
            return JSONResponse({"error": "order_id must be a non-empty string"},
                                status_code=400)
        try:
            message_id = await producer.send(
                topic, json.dumps(order).encode(), key=order_id,
                message_id=message_id_for("orders", order_id))
        except InvalidInputError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except (UnavailableError, StateError) as exc:  # retry later
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse({"message_id": message_id, "instance": producer.instance_id},
                            status_code=201)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"instance": producer.instance_id})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with producer:
            yield

    return Starlette(routes=[Route("/orders", place_order, methods=["POST"]),
                             Route("/health", health)], lifespan=lifespan)


def main(argv: list[str] | None = None) -> None:
    parser = stack_parser(__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--lease-s", type=float, default=10.0,
                        help="liveness lease: a crashed instance's outbox is resent after it")
    parser.add_argument("--recover-interval-s", type=float, default=5.0)
    parser.add_argument("--linger-ms", type=int, default=5,
                        help="librdkafka's linger.ms: how long a record may wait for a batch")
    args = parser.parse_args(argv)
    config = ProducerConfig(kafka={"bootstrap.servers": args.bootstrap,
                                   "linger.ms": args.linger_ms},
                            redis=RedisConfig(url=args.redis),
                            keyspace=KeySpace(prefix=args.prefix), lease_s=args.lease_s,
                            recover_interval_s=args.recover_interval_s)
    uvicorn.run(create_app(config, args.topic), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
