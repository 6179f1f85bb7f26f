"""The HTTP client of the ASGI crash test: N order requests at once, from one event loop.

    python orders_client.py URL N CONNECTIONS RESULTS_JSON

N tasks each POST one order (``order_id`` ``o-<i>``) over at most CONNECTIONS connections
(the rest wait for one: a request waits on the client until it can be sent). A request whose
connection could not be opened (the app is down) never reached the app: it is tried again
until the app answers. Any other failure after the request may have been sent (the app was
killed mid-request) is recorded as an error, never retried. Prints "ok <i>" per 2xx answer,
then writes ``{order_id: {"status": int | None, "body": ..., "error": str | None}}`` to
RESULTS_JSON and prints "done".
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx

RETRY_S = 0.05
GIVE_UP_S = 180.0


async def place(client: httpx.AsyncClient, url: str, i: int,
                results: dict[str, dict[str, object]]) -> None:
    order_id = f"o-{i}"
    body = {"order_id": order_id, "amount": f"{i % 97}.{i % 100:02d}"}
    loop = asyncio.get_running_loop()
    give_up = loop.time() + GIVE_UP_S
    while True:
        try:
            response = await client.post(url, json=body)
        except httpx.ConnectError as exc:  # not connected: the request was never sent
            if loop.time() > give_up:
                results[order_id] = {"status": None, "body": None, "error": repr(exc)}
                return
            await asyncio.sleep(RETRY_S)
            continue
        except httpx.HTTPError as exc:  # sent, maybe handled: recorded, not retried
            results[order_id] = {"status": None, "body": None, "error": repr(exc)}
            return
        try:
            answer: object = response.json()
        except ValueError:
            answer = response.text
        results[order_id] = {"status": response.status_code, "body": answer, "error": None}
        if response.is_success:
            print(f"ok {i}", flush=True)
        return


async def main(url: str, n: int, connections: int, out: str) -> None:
    results: dict[str, dict[str, object]] = {}
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    timeout = httpx.Timeout(60.0, pool=None)  # waiting for a free connection is not a failure
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        await asyncio.gather(*(place(client, url, i, results) for i in range(n)))
    with open(out, "w") as f:
        json.dump(results, f)
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
