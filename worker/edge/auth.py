"""The worker's optional shared token (`WorkerConfig.auth_token`): who may call what.

Callers present it as gRPC metadata `authorization: Bearer <token>` (the data port: in a first frame
of its own, frames.py). With a token set, the admin RPCs (every `kembed.v1.Embedder` method that is
not a data or health method, so one added later is guarded too) refuse a call without it
UNAUTHENTICATED; with `auth_data` the data RPCs (Embed, Score, Stream, Info) do too. kembed's own
Health and the standard `grpc.health.v1.Health` stay open: probes carry no secret. The comparison is
constant-time, and a refused call's message is never deserialized.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn

import grpc

from kembed.proto import embedder_pb2 as pb

EMBEDDER = pb.DESCRIPTOR.services_by_name["Embedder"].full_name  # "kembed.v1.Embedder"
OPEN_METHODS = frozenset({"Health"})
DATA_METHODS = frozenset({"Embed", "Score", "Stream", "Info"})


class TokenCheck:
    """Constant-time comparison against the expected token."""

    def __init__(self, token: str) -> None:
        assert token, "an empty token would let anyone in"
        self._expected = token.encode()

    def matches(self, given: str | bytes) -> bool:
        return hmac.compare_digest(given.encode() if isinstance(given, str) else given, self._expected)

    def matches_bearer(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        """Whether gRPC `metadata` ((key, value) pairs) carries `authorization: Bearer <token>`;
        the scheme is case-insensitive (RFC 9110)."""
        for key, value in metadata or ():
            if key == "authorization":
                scheme, _, token = str(value).partition(" ")
                return scheme.lower() == "bearer" and self.matches(token.strip())
        return False


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata a client sends with every call (none for an empty token)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


# grpc-stubs makes the interceptor generic, grpcio's class is not subscriptable at run time.
class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses guarded methods UNAUTHENTICATED unless the call carries the token."""

    def __init__(self, token: str, is_data_guarded: bool) -> None:
        self._check = TokenCheck(token)
        self._is_data_guarded = is_data_guarded

    def is_guarded(self, method: str) -> bool:
        """`method` is gRPC's full name, `/kembed.v1.Embedder/Prewarm`."""
        service, _, name = method.lstrip("/").rpartition("/")
        if service != EMBEDDER or name in OPEN_METHODS:
            return False
        return self._is_data_guarded or name not in DATA_METHODS

    async def intercept_service(  # type: ignore[override]  # grpc.aio's continuation may answer None
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if (
            handler is None
            or not self.is_guarded(method)
            or self._check.matches_bearer(handler_call_details.invocation_metadata)
        ):
            return handler
        return _refusing(handler, method)


def _refusing(handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of `handler`'s shape that answers UNAUTHENTICATED; its request stays raw bytes."""

    async def refuse(request_or_iterator: object, context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{method}: missing or wrong token: send the metadata `authorization: Bearer <token>`",
        )

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.stream_stream_rpc_method_handler(refuse)
