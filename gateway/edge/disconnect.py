"""A client that leaves cancels its request: its chunks waiting in the gateway are dropped and, through
the data path's `cancel`, its sequences leave the worker's queue, instead of running to the deadline
while other clients wait behind them.

An ASGI server learns of a disconnect only when the app awaits `receive()` again after the body, so
a watcher task does that. It is started only for a request still running `watch_after_s` after its
body arrived: a one-query request is answered in a few milliseconds, before a watcher would pay for
itself (a task per request is ~5 % of the gateway's CPU at load). The cancelled request is recorded
with status 499 (the convention for "client closed request"); nothing is sent, nobody listens. A
client that leaves while its body is read (Starlette's `ClientDisconnect`) is recorded as 499 too,
never as the gateway's failure (a 500 and its traceback would let anyone fire the 5xx alerts).
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CLIENT_CLOSED = 499


class CancelOnDisconnect:
    """ASGI middleware; place it inside the request metrics so they record the 499."""

    def __init__(self, app: ASGIApp, watch_after_s: float = 0.05) -> None:
        self.app = app
        self._watch_after_s = watch_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        request_task = asyncio.current_task()
        assert request_task is not None
        timer: asyncio.TimerHandle | None = None
        watcher: asyncio.Task[None] | None = None
        is_answered = has_left = False

        async def watch() -> None:
            nonlocal has_left
            message = await receive()  # the body is read: this returns only at a disconnect or the end
            if message["type"] == "http.disconnect" and not is_answered:
                has_left = True
                request_task.cancel()

        def start_watching() -> None:
            nonlocal watcher
            watcher = loop.create_task(watch(), name="kembed-gateway-disconnect")

        async def receive_body() -> Message:
            nonlocal timer
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body") and timer is None:
                timer = loop.call_later(self._watch_after_s, start_watching)
            return message

        async def send_answer(message: Message) -> None:
            nonlocal is_answered
            if message["type"] == "http.response.body" and not message.get("more_body"):
                is_answered = True
            await send(message)

        try:
            await self.app(scope, receive_body, send_answer)
        except ClientDisconnect:  # it left while its body was read: its own outcome, not a 500
            with contextlib.suppress(Exception):  # the server drops it: the client is gone
                await send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})
        except asyncio.CancelledError:
            if not has_left:
                raise
            request_task.uncancel()
            with contextlib.suppress(Exception):  # the server drops it: the client is gone
                await send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})
        finally:
            if timer is not None:
                timer.cancel()
            if watcher is not None:
                watcher.cancel()
