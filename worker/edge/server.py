"""The worker's gRPC edge: the only module that touches grpc and protobuf.

Decodes ragged batches, validates them against the model, admits them into the scheduler and
awaits their rows; it never blocks the event loop on the device. The same Embed and Score serve the
unary RPCs and the multiplexed `Stream` (streams.py). Errors from every layer are
translated to status codes once, in `ErrorInterceptor`; a shared token, when set, is checked in front
of it (auth.py). The standard `grpc.health.v1.Health` service (Kubernetes' gRPC probes) and kembed's
own Health answer from one `Readiness`: NOT_SERVING until `set_serving`, SERVING, NOT_SERVING from
`drain` on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeAlias

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2_grpc as health_grpc

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.proto.accuracy import MIN_COSINE
from kembed.proto.outputs import DENSE, OutputShape, names_of
from kembed.proto.version import VERSION
from kembed.worker.buckets import Bucket, BucketTable
from kembed.worker.edge.auth import AuthInterceptor
from kembed.worker.edge.readiness import Readiness
from kembed.worker.edge.streams import StreamServer
from kembed.worker.edge.validation import sequences_problem, spans_of, token_types_problem
from kembed.worker.edge.vocabulary import check_asks, compact
from kembed.worker.errors import InvalidInput, StartupError, Unsupported, WorkerError
from kembed.worker.info import ModelInfo
from kembed.worker.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)

# A 4096-token chunk is 16 KiB in; a 64 x 1024-dim float32 answer 256 KiB out. 64 MiB leaves room for
# big chunks of big models without letting one message eat the pod (gRPC messages and data frames).
MAX_MESSAGE_BYTES = 64 << 20


_MALFORMED = object()  # a request message that did not parse

# A unary RPC's context (a string: grpcio's class is not subscriptable at run time).
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


# grpc-stubs makes the interceptor generic, grpcio's class is not subscriptable at run time.
class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Maps `WorkerError`s to their status codes and anything else to INTERNAL, for every RPC."""

    async def intercept_service(  # type: ignore[override]  # grpc.aio's continuation may answer None
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner, deserialize = handler.unary_unary, handler.request_deserializer

        def tolerant(data: bytes) -> object:
            if deserialize is None:  # a handler of raw bytes
                return data
            try:
                return deserialize(data)
            except DecodeError:  # answered below, as the caller's error, without a traceback
                return _MALFORMED

        async def guarded(request: object, context: Context) -> Any:
            if request is _MALFORMED:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{handler_call_details.method}: malformed request message",
                )
            try:
                # grpc-stubs types a handler's context as the synchronous grpc.ServicerContext
                return await inner(request, context)  # type: ignore[arg-type]
            except WorkerError as exc:
                await context.abort(grpc.StatusCode[exc.status], str(exc))
            except Exception:
                log.exception("%s failed", handler_call_details.method)
                await context.abort(grpc.StatusCode.INTERNAL, "internal error in the worker (see its log)")

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=tolerant,
            response_serializer=handler.response_serializer,
        )


def decode_batch(batch: pb.TokenBatch, info: ModelInfo) -> tuple[np.ndarray, np.ndarray]:
    """(token_ids int32 [num_tokens], lengths int32 [num_seqs]) from the wire, checked against the model."""
    if len(batch.token_ids) % 4:
        raise InvalidInput(f"token_ids holds {len(batch.token_ids)} bytes, not a whole number of int32")
    token_ids = np.frombuffer(batch.token_ids, dtype="<i4")
    lengths = np.asarray(batch.lengths, dtype=np.int64)
    problem = sequences_problem(token_ids, lengths, info)
    if problem is not None:
        raise InvalidInput(problem)
    return token_ids, lengths.astype(np.int32)


def decode_spans(batch: pb.TokenBatch, lengths: np.ndarray) -> list[np.ndarray | None] | None:
    """Per sequence, None (pooled as usual) or its span boundaries; None for the whole batch when it
    asks for no span pooling (validation.spans_of)."""
    if not batch.num_spans and not batch.span_bounds:
        return None
    return spans_of(np.asarray(batch.num_spans), np.asarray(batch.span_bounds), lengths)


def decode_token_types(batch: pb.TokenBatch, num_tokens: int) -> np.ndarray | None:
    """The batch's token_type_ids (int32 [num_tokens]), or None when absent (all zeros)."""
    if not batch.token_type_ids:
        return None
    if len(batch.token_type_ids) != 4 * num_tokens:
        raise InvalidInput(
            f"token_type_ids holds {len(batch.token_type_ids)} bytes; {num_tokens} int32 values were expected"
        )
    types = np.frombuffer(batch.token_type_ids, dtype="<i4")
    problem = token_types_problem(types)
    if problem is not None:
        raise InvalidInput(problem)
    return types


def task_types(task: str, lengths: np.ndarray, info: ModelInfo) -> np.ndarray | None:
    """An Embed request's task adapter as its tokens' type ids (jina_v3.py: 0 the default task,
    t + 1 task t) for a model with tasks; None for one without. InvalidInput naming the tasks
    where `task` is not one of them."""
    if not info.tasks:
        if task:
            raise InvalidInput(f"model {info.model_name} has no task adapters (asked for task {task!r})")
        return None
    if task and task not in info.tasks:
        raise InvalidInput(f"task {task!r} is not one of model {info.model_name}'s: {', '.join(info.tasks)}")
    chosen = info.tasks.index(task) + 1 if task else 0
    return np.full(int(lengths.sum()), chosen, np.int32)


class EngineOps(Protocol):
    """What the server asks of the engine besides batches (which go through the scheduler); all of
    it runs on the scheduler's launcher thread."""

    info: ModelInfo

    @property
    def buckets(self) -> BucketTable | None:
        """The bucket table admin calls are checked against, or None for an engine without one (a
        benchmark's stand-in): then any batch shape is taken."""

    def captured_buckets(self) -> list[Bucket]:
        """What a smoke test of "every captured bucket" runs, one bucket per turn on the device."""

    def bucket_stats(self) -> list[tuple[Bucket, int, bool]]: ...

    def prewarm(self, buckets: list[Bucket]) -> list[Bucket]: ...

    def smoke_test(self, buckets: list[Bucket], min_cosine: float, seed: int) -> list[Any]:
        """engine.smoke's SmokeResults (the server does not import the engine)."""


# InfoResponse's fields that say how this worker serves rather than what model it serves; every
# other field is ModelInfo's of the same name (a test holds the two sets to the message's fields).
SERVING_FIELDS = frozenset(
    {"max_batch_tokens", "max_queued_tokens", "revision", "version", "data_port", "frame_port",
     "frame_idle_timeout_ms"}
)  # fmt: skip


def info_response(info: ModelInfo, **serving: Any) -> pb.InfoResponse:
    """The Info answer: every ModelInfo field copied by name, plus the `serving` fields given."""
    assert set(serving) <= SERVING_FIELDS, sorted(set(serving) - SERVING_FIELDS)
    return pb.InfoResponse(**dataclasses.asdict(info), **serving)


class EmbedderService(pb_grpc.EmbedderServicer):
    """kembed.v1.Embedder over one model and its scheduler."""

    def __init__(self, engine: EngineOps, scheduler: Scheduler, max_batch_tokens: int, revision: str) -> None:
        info = engine.info
        self._engine = engine
        self._info = info
        self._scheduler = scheduler
        # Admin calls (prewarm, smoke tests) one at a time, each bucket its own turn on the device.
        self._admin = asyncio.Lock()
        table = engine.buckets
        self._bucket_table = frozenset(table.reachable()) if table is not None else None
        self._bucket_limits = (
            (f"1..{table.max_seqs}", f"{table.token_sizes[0]}..{table.max_tokens}")
            if table is not None
            else ("", "")
        )
        self.streams = StreamServer(self._embed, self._score)
        self.readiness = Readiness()
        self._info_response = info_response(
            info,
            max_batch_tokens=max_batch_tokens,
            max_queued_tokens=scheduler.max_queued_tokens,
            revision=revision,
            version=VERSION,
        )

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        return await self._embed(request)

    async def _embed(self, request: pb.EmbedRequest) -> pb.EmbedResponse:
        if self._info.task != "embed":
            raise Unsupported(f"model {self._info.model_name} is a {self._info.task} model, not an embedder")
        token_ids, lengths = decode_batch(request.batch, self._info)
        spans = decode_spans(request.batch, lengths)
        types = task_types(request.task, lengths, self._info)  # a multi-task model's adapter, else None
        if self._info.sparse_vocabulary:  # SPARSE alone, its nonzero weights alone answered
            check_asks(self._info, request.outputs)
            if spans is not None:
                raise InvalidInput("span pooling asks for dense rows alone")
            _, rows = compact(
                np.array([len(lengths)]),
                await self._scheduler.submit(token_ids, lengths, priority=request.priority),
            )
        elif request.outputs > DENSE:
            info = self._info
            lacking = request.outputs & ~info.outputs
            if lacking or spans is not None:
                raise InvalidInput(
                    "span pooling asks for dense rows alone"
                    if not lacking
                    else f"model {info.model_name} has no {'/'.join(names_of(lacking))} output "
                    f"(it has: {', '.join(names_of(info.outputs))})"
                )
            outputs = np.full(len(lengths), request.outputs, np.uint8)
            shape = OutputShape(info.dimensions, info.colbert_dimensions, info.hidden_size)
            rows = await self._scheduler.submit(
                token_ids,
                lengths,
                types,
                priority=request.priority,
                outputs=outputs,
                rows_per_seq=shape.rows_of(lengths, outputs),
            )
        else:
            rows = await self._scheduler.submit(token_ids, lengths, types, spans, priority=request.priority)
        return pb.EmbedResponse(
            embeddings=rows.astype("<f4", copy=False).tobytes(),
            num_sequences=rows.shape[0],
            dimensions=rows.shape[1],
        )

    async def Stream(
        self,
        request_iterator: object,
        context: grpc.aio.ServicerContext[pb.StreamRequest, pb.StreamResponse],
    ) -> None:
        await self.streams.serve(context)

    def advertise_data_port(self, port: int, idle_timeout_s: float = 0.0) -> None:
        """Info tells callers where the data port (frames.py) listens, and after how long it closes
        an idle connection (so that they keep theirs open)."""
        self._info_response.frame_port = port
        self._info_response.frame_idle_timeout_ms = round(idle_timeout_s * 1000)

    @property
    def data_port(self) -> int:
        return self._info_response.frame_port

    async def Info(self, request: pb.InfoRequest, context: Context) -> pb.InfoResponse:
        return self._info_response

    async def Health(self, request: pb.HealthRequest, context: Context) -> pb.HealthResponse:
        readiness = self.readiness
        return pb.HealthResponse(
            status=pb.HealthResponse.SERVING if readiness.is_serving else pb.HealthResponse.NOT_SERVING,
            queued_tokens=self._scheduler.queued_tokens,
            tokens_per_s=self._scheduler.steps.tokens_per_s,
            reason=readiness.reason,
        )

    async def set_serving(self) -> None:
        """The engine is loaded and the scheduler runs: health checks answer SERVING."""
        await self.readiness.set_serving()

    async def drain(self, timeout_s: float) -> None:
        """Health checks answer NOT_SERVING from now on; new stream requests are refused UNAVAILABLE,
        those in flight answered (up to `timeout_s`), then the streams and data connections end."""
        await self.readiness.drain()
        await self.streams.drain(timeout_s)

    async def Score(self, request: pb.ScoreRequest, context: Context) -> pb.ScoreResponse:
        return await self._score(request)

    async def _score(self, request: pb.ScoreRequest) -> pb.ScoreResponse:
        if self._info.task != "score":
            raise Unsupported(
                f"model {self._info.model_name} is a {self._info.task} model, not a cross-encoder: "
                "it cannot score pairs"
            )
        token_ids, lengths = decode_batch(request.batch, self._info)
        if request.batch.num_spans or request.batch.span_bounds:
            raise InvalidInput("span pooling (num_spans, span_bounds) is for Embed, not Score")
        token_type_ids = decode_token_types(request.batch, len(token_ids))
        logits = await self._scheduler.submit(token_ids, lengths, token_type_ids, priority=request.priority)
        return pb.ScoreResponse(
            scores=logits.astype("<f4", copy=False).tobytes(),
            num_sequences=logits.shape[0],
            num_labels=logits.shape[1],
        )

    async def BucketStats(self, request: pb.BucketStatsRequest, context: Context) -> pb.BucketStatsResponse:
        stats = await self._scheduler.run_on_device(self._engine.bucket_stats)
        return pb.BucketStatsResponse(
            buckets=[
                pb.BucketStat(bucket=_to_pb(b), hits=hits, captured=captured) for b, hits, captured in stats
            ]
        )

    async def Prewarm(self, request: pb.PrewarmRequest, context: Context) -> pb.PrewarmResponse:
        buckets = self._buckets(request.buckets)
        captured: list[Bucket] = []
        async with self._admin:
            for bucket in buckets:  # one at a time: batches are launched in between
                captured += await self._scheduler.run_on_device(self._engine.prewarm, [bucket])
        missing = sorted(set(buckets) - set(captured))
        return pb.PrewarmResponse(
            captured=[_to_pb(b) for b in captured],
            errors=[f"bucket {b} was not captured" for b in missing],
        )

    async def SmokeTest(self, request: pb.SmokeTestRequest, context: Context) -> pb.SmokeTestResponse:
        min_cosine = request.min_cosine or MIN_COSINE
        buckets = self._buckets(request.buckets)
        async with self._admin:
            if not buckets:  # every captured bucket, as the engine would
                buckets = await self._scheduler.run_on_device(self._engine.captured_buckets)
            if not buckets:
                results = await self._scheduler.run_on_device(
                    self._engine.smoke_test, [], min_cosine, request.seed
                )
            else:
                results = []
                for bucket in buckets:  # one at a time: batches are launched in between
                    results += await self._scheduler.run_on_device(
                        self._engine.smoke_test, [bucket], min_cosine, request.seed
                    )
        return pb.SmokeTestResponse(
            passed=bool(results) and all(r.passed for r in results),
            results=[
                pb.SmokeTestResult(bucket=_to_pb(r.bucket), min_cosine=r.min_cosine,
                                   has_nonfinite=r.has_nonfinite, passed=r.passed)
                for r in results
            ],
        )  # fmt: skip

    def _buckets(self, buckets: Iterable[pb.Bucket]) -> list[Bucket]:
        """The request's buckets, each one this worker can form (from its bucket table), so an admin
        call can neither allocate for a shape no batch has nor keep work for shapes past the table."""
        out = [Bucket(b.num_sequences, b.num_tokens) for b in buckets]
        if self._bucket_table is None:  # an engine without buckets (a benchmark's stand-in)
            for bucket in out:
                if not 1 <= bucket.num_seqs <= bucket.num_tokens:
                    raise InvalidInput(f"bucket {bucket} is not a batch shape: need 1 <= sequences <= tokens")
            return out
        if len(out) > len(self._bucket_table):
            raise InvalidInput(f"{len(out)} buckets asked for; this worker has {len(self._bucket_table)}")
        for bucket in out:
            if bucket not in self._bucket_table:
                raise InvalidInput(
                    f"bucket {bucket} is not one of this worker's: sequences {self._bucket_limits[0]}, "
                    f"tokens {self._bucket_limits[1]}"
                )
        return out


def _to_pb(bucket: Bucket) -> pb.Bucket:
    return pb.Bucket(num_sequences=bucket.num_seqs, num_tokens=bucket.num_tokens)


def build_server(
    service: EmbedderService, host: str, port: int, auth_token: str = "", is_data_guarded: bool = True
) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server with the service, the standard health service and the interceptors, bound to
    host:port (port 0 picks one). With `auth_token`, admin RPCs need it, and data RPCs too if
    `is_data_guarded` (auth.py)."""
    interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] = [ErrorInterceptor()]
    if auth_token:  # first: a refused call reaches no handler and is never deserialized
        interceptors.insert(0, AuthInterceptor(auth_token, is_data_guarded))
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC sets SO_REUSEPORT by default: a second worker started on a taken port would bind
            # it too and silently get a share of the connections (a stale worker keeps serving).
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_EmbedderServicer_to_server(service, server)
    health_grpc.add_HealthServicer_to_server(service.readiness.servicer, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpc's "Failed to bind to address"
        bound = 0
    if bound == 0:
        raise StartupError(
            f"cannot listen on {host}:{port} for gRPC (--port): another process holds the port, "
            "or the address is not this machine's"
        )
    return server, bound
