"""The worker replicas: one gRPC channel each, health probing, least-outstanding-tokens balancing.

Replicas are the configured addresses plus, with `worker_service`, every address its DNS name
resolves to, resolved again every `worker_resolve_interval_s` (a Kubernetes headless Service lists
its ready pods): a new address is added and probed at once; one that is gone gets no new work and
is closed once nothing it holds is outstanding. Resolution is a port (`Resolve`), faked in tests.

A request's sequences are split into chunks; every chunk goes, concurrently, to the serving replica
with the fewest outstanding tokens at the moment it is sent (counted up at send, down on completion,
so a slow replica stops attracting work); a chunk that runs long is hedged on another replica, and
one whose replica is found stalled is moved (attempts.py). Each replica has one transport
(transports.py), chosen when its Info is read: its data port, where chunks sent in one turn of the
loop share a frame, or, for a worker without one or whose data port cannot be reached, unary gRPC
calls. A replica that answers UNAVAILABLE is marked down until its next successful probe and the
chunk is retried elsewhere; RESOURCE_EXHAUSTED (a full queue) is retried elsewhere without marking
it down. Tries are bounded; every chunk carries the request's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from functools import partial

import grpc
import numpy as np

from kembed.gateway.config import GatewayConfig
from kembed.gateway.metrics import GatewayMetrics
from kembed.gateway.pool.attempts import Attempts, Hedging, first_of
from kembed.gateway.pool.batches import Part, split_into_chunks
from kembed.gateway.pool.fanout import chunk_parts, gather_all, joined_rows
from kembed.gateway.pool.model_check import ModelCheck
from kembed.gateway.pool.pacing import Window, paced
from kembed.gateway.pool.replicas import Replica, Resolve, resolve_dns, translate_error
from kembed.gateway.pool.transports import (
    FrameTransport,
    Transport,
    UnaryTransport,
    close_quietly,
    data_port_host,
)
from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub
from kembed.proto.model_identity import ModelIdentity
from kembed.proto.outputs import OutputShape

log = logging.getLogger(__name__)

# After a replica's data port failed to connect (a network policy, a worker restarting), its chunks go
# as unary gRPC calls; its Info is read again and the data port tried again this long after.
DATA_PORT_RETRY_S = 30.0

# While no replica serves (the gateway just started, or every worker is down), probes come this often
# rather than every health interval: a first probe that missed its deadline on a loaded machine, or a
# worker that finished loading its model, then makes the gateway ready within this long, not after a
# whole interval of answering 503 with a worker that serves.
UNREADY_PROBE_S = 0.25


class WorkerPool:
    """All replicas behind one gateway. `start` probes them once; a background task keeps probing."""

    def __init__(
        self,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        check: ModelCheck,
        resolve: Resolve = resolve_dns,
    ) -> None:
        self._config = config
        self._model_check = check  # each replica's model against the gateway's (model_check.py)
        self._metrics = metrics
        self._resolve = resolve
        self.replicas: list[Replica] = []
        self._health_task: asyncio.Task[None] | None = None
        self._resolve_task: asyncio.Task[None] | None = None
        self._was_ready: bool | None = None  # at the last probe; None before the first
        self._num_picks = 0
        self._hedging = Hedging(config)
        self._checks: set[asyncio.Task[None]] = set()  # probes of suspect replicas in flight
        self._serving_again: asyncio.Future[None] | None = None  # set when a replica serves again
        self._probe_soon: asyncio.Future[None] | None = None  # set: the health loop probes now
        # Called with a chunk's tokens each time one comes back answered (the admission's drain rate).
        self.on_chunk_served: Callable[[int], None] | None = None
        token = config.worker_auth_token  # sent with every call; a worker without a token ignores it
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        metrics.watch_workers(self.num_serving, self.num_refused)

    async def start(self) -> None:
        for address in self._config.static_workers:
            self._add(address)
        if self._config.worker_service:
            await self._discover()
        await self._probe_all()
        self._say_readiness()
        self._health_task = asyncio.create_task(self._health_loop(), name="kembed-gateway-health")
        if self._config.worker_service:
            self._resolve_task = asyncio.create_task(self._resolve_loop(), name="kembed-gateway-resolve")

    def _add(self, address: str, *, is_discovered: bool = False) -> Replica:
        options = [
            ("grpc.max_send_message_length", self._config.max_grpc_message_bytes),
            ("grpc.max_receive_message_length", self._config.max_grpc_message_bytes),
            # A restarted worker should be reconnected to within about a probe interval, not gRPC's
            # default backoff of up to two minutes.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", int(self._config.health_interval_s * 1000)),
        ]
        channel = grpc.aio.insecure_channel(address, options=options)
        stub = EmbedderStub(channel)
        unary = UnaryTransport(stub, self._metadata)
        replica = Replica(address, channel, stub, unary, is_discovered=is_discovered)
        self.replicas.append(replica)
        return replica

    async def _discover(self) -> None:
        """Replicas for the addresses worker_service resolves to now: new ones added and probed,
        vanished ones leaving (no new work), leaving ones without outstanding work closed. A failed
        resolution changes nothing (the replicas known stay, their probes say if they serve)."""
        addresses: list[str] = []
        for service in self._config.worker_services:
            host, _, port = service.rpartition(":")
            try:
                addresses += await self._resolve(host.strip("[]"), int(port))
            except OSError as error:
                log.warning("cannot resolve worker service %s: %s", service, error)
                return
        current = {r.address: r for r in self.replicas if r.is_discovered}
        added = [self._add(a, is_discovered=True) for a in addresses if a not in current]
        for replica in added:
            log.info("worker %s found through %s", replica.address, self._config.worker_service)
        for address, replica in current.items():
            is_gone = address not in addresses
            if is_gone and not replica.is_leaving:
                log.info("worker %s is gone from %s: draining it", address, self._config.worker_service)
            elif replica.is_leaving and not is_gone:
                log.info("worker %s is back in %s", address, self._config.worker_service)
            replica.is_leaving = is_gone
        await asyncio.gather(*(self._probe(r) for r in added))
        leaving = [r for r in self.replicas if r.is_leaving and r.outstanding_tokens == 0]
        for replica in leaving:
            self.replicas.remove(replica)
        await asyncio.gather(*(self._close_replica(r) for r in leaving))

    async def _resolve_loop(self) -> None:
        while True:
            await asyncio.sleep(self._config.worker_resolve_interval_s)
            try:
                await self._discover()
            except Exception:  # a bug in discovery must not stop it for good
                log.exception("worker discovery failed")

    async def _choose_transport(self, replica: Replica) -> None:
        """The replica's transport, from its Info: its data port (when configured, advertised and
        reachable now), else unary calls; a restarted worker may have moved its port."""
        host = data_port_host(replica.address)
        port = replica.info.frame_port if replica.info is not None else 0
        current = replica.transport
        if isinstance(current, FrameTransport) and (current.port, current.host) == (port, host):
            return
        chosen: Transport = UnaryTransport(replica.stub, self._metadata)
        if self._config.worker_transport == "frames" and port and host is not None:
            frames = FrameTransport(
                replica.address,
                host,
                port,
                max_frame_bytes=self._config.max_grpc_message_bytes,
                connect_timeout_s=self._config.health_timeout_s,
                max_inflight_frames=self._config.max_inflight_frames,
                auth_token=self._config.worker_auth_token,
                worker_idle_timeout_s=replica.info.frame_idle_timeout_ms / 1000 if replica.info else 0.0,
            )
            try:
                await frames.connect()
                chosen = frames
            except OSError as error:
                log.warning(
                    "worker %s: no connection to its data port %s:%d (%s); using unary gRPC calls for "
                    "it, trying the data port again in %.0f s",
                    replica.address, host, port, error, DATA_PORT_RETRY_S,
                )  # fmt: skip
                replica.data_port_lost_at = asyncio.get_running_loop().time()
        if chosen.name == current.name == "unary":
            return
        replica.transport = chosen
        await close_quietly(current)

    async def close(self) -> None:
        tasks = [t for t in (self._health_task, self._resolve_task) if t is not None]
        tasks += self._checks
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        replicas, self.replicas = self.replicas, []
        await asyncio.gather(*(self._close_replica(r) for r in replicas))

    @staticmethod
    async def _close_replica(replica: Replica) -> None:
        await close_quietly(replica.transport)
        # grpc-stubs makes grace required; grpcio's default is None (cancel every call at once)
        await replica.channel.close()  # type: ignore[call-arg]

    def _is_available(self, replica: Replica, now: float) -> bool:
        return (
            replica.is_serving
            and not replica.refusal
            and not replica.is_leaving
            and now - replica.last_serving_at < self._config.max_health_age_s
        )

    def num_serving(self) -> int:
        """Replicas a chunk could be sent to now."""
        now = asyncio.get_running_loop().time()
        return sum(self._is_available(r, now) for r in self.replicas)

    @property
    def model(self) -> ModelIdentity:
        """The model this gateway tokenizes for, as replicas are checked against it."""
        return self._model_check.own

    def num_refused(self) -> int:
        """Replicas refused for serving another model than the gateway's (model_check.py)."""
        return sum(bool(r.refusal) for r in self.replicas)

    def is_ready(self) -> bool:
        now = asyncio.get_running_loop().time()
        return any(self._is_available(r, now) for r in self.replicas)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the serving replicas' queues take together (their Info's max_queued_tokens)."""
        now = asyncio.get_running_loop().time()
        return sum(
            r.info.max_queued_tokens
            for r in self.replicas
            if r.info is not None and self._is_available(r, now)
        )

    def _window(self) -> Window | None:
        """One request's tokens in flight at most: half of what the serving workers' queues take for
        bulk work, at least a chunk (pacing.py); None while no worker has said what its queue holds."""
        capacity = self.capacity_tokens
        if not capacity:
            return None
        return Window(max(self._config.chunk_tokens, int(capacity * self._config.bulk_queue_share / 2)))

    @property
    def tokens_per_s(self) -> float:
        """Tokens a second the serving replicas' devices embed together (their Health's measure);
        0 while none has said."""
        now = asyncio.get_running_loop().time()
        return sum(r.tokens_per_s for r in self.replicas if self._is_available(r, now))

    @property
    def info(self) -> pb.InfoResponse | None:
        """What the replicas serve (from the first that answered Info and serves the gateway's model),
        None before any did."""
        return next((r.info for r in self.replicas if r.info is not None and not r.refusal), None)

    async def _probe(self, replica: Replica) -> None:
        timeout = self._config.health_timeout_s
        try:
            health = await replica.stub.Health(pb.HealthRequest(), timeout=timeout, metadata=self._metadata)
            # Info again whenever a replica comes (back) up: a restarted worker may serve another revision.
            lost_for = asyncio.get_running_loop().time() - replica.data_port_lost_at
            is_retry_due = DATA_PORT_RETRY_S <= lost_for < math.inf
            if health.status == pb.HealthResponse.SERVING and (
                replica.info is None or not replica.is_serving or is_retry_due
            ):
                replica.info = await replica.stub.Info(
                    pb.InfoRequest(), timeout=timeout, metadata=self._metadata
                )
                if self._refuse(replica, replica.info):
                    return
                replica.data_port_lost_at = -math.inf
                await self._choose_transport(replica)
        except grpc.aio.AioRpcError as error:
            replica.last_error = f"{error.code().name}: {error.details()}"
            # A slow answer from a worker busy at full load is not a dead worker: only a refused
            # connection takes it out at once; a missed deadline makes it suspect (probed again at
            # once, down if that is missed too while another serves); else it ages out after
            # max_health_age_s.
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and replica.is_serving:
                self.check(replica)
            if error.code() == grpc.StatusCode.UNAVAILABLE or replica.info is None:
                if replica.is_serving:
                    log.warning("worker %s is down: %s", replica.address, error.code().name)
                replica.mark_down(replica.last_error)
            return
        self._heard(replica, health)

    def _refuse(self, replica: Replica, info: pb.InfoResponse) -> bool:
        """Whether `replica`, answering `info`, serves another model than the gateway's: then it is
        down with the reason (logged when it changes) until a later Info says otherwise."""
        # The replicas serving now, and those accepted by a probe of the same pass that has not yet
        # heard them serve (probes run concurrently: two replicas of different models probed at start
        # must not both pass for want of a serving one to compare with).
        now = asyncio.get_running_loop().time()
        serving = (
            r.info
            for r in self.replicas
            if r is not replica
            and r.info is not None
            and not r.refusal
            and (self._is_available(r, now) or now - r.accepted_at < self._config.max_health_age_s)
        )
        refusal = self._model_check.refusal(info, serving)
        if refusal != replica.refusal:
            if refusal:
                log.error("worker %s refused: %s", replica.address, refusal)
            elif replica.refusal:
                log.info("worker %s serves this gateway's model now", replica.address)
        elif not refusal and self._model_check.is_unchecked(info) and not replica.is_serving:
            log.warning(
                "worker %s does not report the digests of its model (an older kembed, or no "
                "tokenizer.json in its directory): this gateway cannot check it serves %s",
                replica.address, self._config.model_dir,
            )  # fmt: skip
        replica.refusal = refusal
        if refusal:
            replica.mark_down(refusal)
        else:
            replica.accepted_at = now
        return bool(refusal)

    def _heard(self, replica: Replica, health: pb.HealthResponse) -> None:
        """What a Health answer says of `replica` (a probe's or a suspect's check)."""
        was_serving = replica.is_serving
        replica.queued_tokens = health.queued_tokens
        replica.tokens_per_s = health.tokens_per_s
        if health.status == pb.HealthResponse.SERVING:
            replica.is_serving, replica.is_suspect = True, False
            replica.last_serving_at = asyncio.get_running_loop().time()
            replica.last_error = ""
            if not was_serving:
                log.info("worker %s is serving", replica.address)
                replica.num_rejoins += 1
                self._say_serving()
        elif health.reason.startswith("stalled") and was_serving and not self._others_serve(replica):
            # A lone replica is never marked down for being slow (it cannot tell a slow device from
            # a stuck one): it keeps its work as a suspect, which waits for it within its deadline
            # rather than failing 503 with nowhere else to go; marked down once another serves.
            if not replica.is_suspect:
                log.warning("worker %s says %s; the only one serving: kept", replica.address, health.reason)
            replica.is_suspect, replica.last_error = True, f"NOT_SERVING: {health.reason}"
        else:
            reason = pb.HealthResponse.Status.Name(health.status)
            if was_serving:
                log.warning("worker %s is not serving: %s", replica.address, health.reason or reason)
            replica.mark_down(f"{reason}: {health.reason}" if health.reason else reason)

    def _others_serve(self, replica: Replica) -> bool:
        """Whether a replica other than `replica`, and not suspect, could take its work now."""
        now = asyncio.get_running_loop().time()
        others = (r for r in self.replicas if r is not replica and not r.is_suspect)
        return any(self._is_available(r, now) for r in others)

    def _say_serving(self) -> None:
        """A replica is serving that was not: chunks waiting for one try again (attempts.py)."""
        if self._serving_again is not None and not self._serving_again.done():
            self._serving_again.set_result(None)
        self._serving_again = None

    async def _wait_serving(self, until: float) -> None:
        """Until a replica is heard SERVING that was not, or loop.time() reaches `until`. The health
        loop probes at once and then every UNREADY_PROBE_S while none is available, so a worker
        that runs again is found within a fraction of a second, not a health interval."""
        if self._serving_again is None or self._serving_again.done():
            self._serving_again = asyncio.get_running_loop().create_future()
        self._probe_now()
        # first_of, not wait_for: Python 3.11's wait_for can lose a cancel that meets the future
        # done (a request whose client left, or whose deadline passed, would carry on)
        await first_of([self._serving_again], until, asyncio.get_running_loop())

    def _probe_now(self) -> None:
        if self._probe_soon is not None and not self._probe_soon.done():
            self._probe_soon.set_result(None)

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(r) for r in self.replicas))

    async def _health_loop(self) -> None:
        while True:
            interval = self._config.health_interval_s
            loop = asyncio.get_running_loop()
            self._probe_soon = loop.create_future()  # a chunk with nowhere to go wakes it early
            wait_s = interval if self.is_ready() else min(interval, UNREADY_PROBE_S)
            await first_of([self._probe_soon], loop.time() + wait_s, loop)
            try:
                await self._probe_all()
                self._say_readiness()
            except Exception:  # a bug in probing must not stop it for good
                log.exception("health probe failed")

    def _say_readiness(self) -> None:
        """Logs when the gateway starts or stops having a worker to send to: a user starting it
        before the workers (which load a model first) sees what it waits for, then that it serves."""
        is_ready = self.is_ready()
        if is_ready == self._was_ready:
            return
        self._was_ready = is_ready
        serving = sum(self._is_available(r, asyncio.get_running_loop().time()) for r in self.replicas)
        if is_ready:
            log.info("serving: %d of %d worker(s) ready", serving, len(self.replicas))
        else:
            where = ", ".join(r.address for r in self.replicas) or self._config.worker_service
            log.warning("waiting for a worker to serve (%s); /ready answers 503 until then", where)

    def _pick(self, is_allowed: Callable[[Replica], bool]) -> Replica | None:
        """The available replica `is_allowed` (by a chunk's attempts) with the fewest outstanding
        tokens. Ties go round-robin (the scan starts one further each time), so an idle fleet still
        shares sequential requests."""
        replicas = self.replicas
        if not replicas:
            return None
        now = asyncio.get_running_loop().time()
        start = self._num_picks % len(replicas)
        self._num_picks += 1
        best: Replica | None = None
        for offset in range(len(replicas)):
            replica = replicas[(start + offset) % len(replicas)]
            if not self._is_available(replica, now) or not is_allowed(replica):
                continue
            key = (replica.is_suspect, replica.outstanding_tokens)  # a suspect only if none else serves
            if best is None or key < (best.is_suspect, best.outstanding_tokens):
                best = replica
        return best

    async def _send(self, kind: str, part: Part) -> np.ndarray:
        """One chunk's rows from the least loaded replica: retried on others if refused or down,
        hedged if it runs long, moved if its replica stalls (attempts.py)."""
        loop = asyncio.get_running_loop()
        attempts = Attempts(
            part,
            pick=self._pick,
            request=lambda replica: replica.transport.submit(kind, part, part.deadline - loop.time()),
            answered=self._answered,
            hedging=self._hedging,
            check=self.check,
            mark_down=self._mark_down,
            wait_serving=self._wait_serving,
            translate=translate_error,
            metrics=self._metrics,
            max_attempts=self._config.max_attempts,
            max_rejoin_wait_s=self._config.max_rejoin_wait_s,
        )
        return await attempts.run()

    def _answered(self, replica: Replica, part: Part) -> None:
        """An attempt of `part` on `replica` came back with its rows."""
        replica.num_chunks_served += 1
        replica.is_suspect = False  # it answers: alive
        if replica.is_serving:  # as good as a SERVING probe: a lone slow replica does not age out
            replica.last_serving_at = asyncio.get_running_loop().time()
        if self.on_chunk_served is not None:
            self.on_chunk_served(part.num_tokens)

    def _mark_down(self, replica: Replica, reason: str) -> None:
        if replica.is_serving:
            log.warning("worker %s is down: %s; retrying elsewhere", replica.address, reason)
        replica.mark_down(reason)

    def check(self, replica: Replica) -> None:
        """An attempt on `replica` ran past its budget: it is suspect (no new work while another
        serves) and is probed now, unless a probe of it is in flight (attempts.py)."""
        replica.is_suspect = True
        if replica.is_checking:
            return
        replica.is_checking = True
        task = asyncio.create_task(self._check(replica), name=f"kembed-gateway-check-{replica.address}")
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check(self, replica: Replica) -> None:
        """SERVING clears the suspicion; NOT_SERVING, or no answer within health_timeout_s while
        another replica serves, marks it down (its attempts move; the health loop lets it rejoin)."""
        try:
            health = await replica.stub.Health(
                pb.HealthRequest(), timeout=self._config.health_timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as error:
            now = asyncio.get_running_loop().time()
            others = [r for r in self.replicas if r is not replica and self._is_available(r, now)]
            if replica.is_suspect and others and any(not r.is_suspect for r in others):
                replica.num_stalls += 1
                self._mark_down(replica, f"stalled: no answer to a health probe ({error.code().name})")
                self._say_readiness()
            return
        finally:
            replica.is_checking = False
        if health.status != pb.HealthResponse.SERVING:
            replica.num_stalls += health.reason.startswith("stalled")
        self._heard(replica, health)
        self._say_readiness()

    async def embed(
        self,
        sequences: Sequence[np.ndarray],
        request_id: str,
        deadline: float,
        spans: Sequence[np.ndarray | None] | None = None,
        *,
        priority: int = pb.PRIORITY_INTERACTIVE,
        outputs: int = 0,
        task: tuple[str, int] = ("", 0),
    ) -> np.ndarray:
        """Raw pooled vectors of `sequences`, [len(sequences), dims], in input order; with `spans`
        (per sequence None or its span bounds), one row per span instead, in order. A sequence is
        never split across chunks, so its spans travel with it. `outputs` (an Output bitmask): each
        sequence's rows as kembed.proto.outputs lays them out, sequence after sequence. `task`: a
        multi-task model's adapter (name, number in a RequestFrame: 0 the workers' default)."""
        return await self._run("embed", sequences, None, spans, request_id, deadline, priority, outputs, task)

    async def score(
        self,
        ids: Sequence[np.ndarray],
        type_ids: Sequence[np.ndarray],
        request_id: str,
        deadline: float,
        *,
        priority: int = pb.PRIORITY_INTERACTIVE,
    ) -> np.ndarray:
        """Raw logits of templated pairs, [len(ids), num_labels], in input order; chunked and balanced
        over replicas like `embed` (a rerank of many long documents is as large as any embedding)."""
        return await self._run("score", ids, type_ids, None, request_id, deadline, priority)

    async def _run(
        self,
        kind: str,
        sequences: Sequence[np.ndarray],
        type_ids: Sequence[np.ndarray] | None,
        spans: Sequence[np.ndarray | None] | None,
        request_id: str,
        deadline: float,
        priority: int,
        outputs: int = 0,
        task: tuple[str, int] = ("", 0),
    ) -> np.ndarray:
        """A request's rows: its sequences in chunks, each chunk on a replica, the rows in order."""
        chunks = split_into_chunks(
            [len(s) for s in sequences],
            max_tokens=self._config.chunk_tokens,
            max_sequences=self._config.max_chunk_sequences,
        )
        info = self.info
        shape = OutputShape(info.dimensions, info.colbert_dimensions, info.hidden_size) if info else None
        is_vocabulary = info is not None and info.sparse_vocabulary
        parts = chunk_parts(
            chunks,
            sequences,
            type_ids,
            spans,
            request_id,
            deadline,
            priority,
            outputs,
            shape,
            is_vocabulary,
            task,
        )
        # A request of one chunk is refused at once if every queue is full (its client backs off); one
        # of several is paced, and its chunks wait for room a while (pacing.py).
        window = self._window() if len(chunks) > 1 else None
        wait_s = self._config.max_queue_wait_s if len(chunks) > 1 else 0.0
        rows = await gather_all(
            [paced(partial(self._send, kind, part), part.num_tokens, window, wait_s) for part in parts]
        )
        return joined_rows(rows, kind)
