"""The gateway's one configuration object, parsed once in `__main__` and passed to constructors."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from kembed.proto.model_files import ModelSpec

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything the gateway reads at start. Nothing mutates it; nothing re-reads the environment."""

    model_dir: Path
    """Local Hugging Face-format model directory. The gateway reads only its tokenizer and
    sentence-transformers configs (tokenizer.json, sentence_bert_config.json, prompts), never weights."""

    worker_addresses: tuple[str, ...] = ()
    """gRPC `host:port` of each worker replica; one channel each. Default: 127.0.0.1:50051 (the
    worker's own default) unless worker_service is set."""

    worker_service: str = ""
    """`host:port` of a DNS name whose every address is a worker replica, such as a Kubernetes
    headless Service (which lists the ready pods): re-resolved every worker_resolve_interval_s, a
    new address gets a channel and its own share of the work, a vanished one gets no new work and is
    closed once its requests are answered. With a plain Service each channel would stick to whichever
    pod its connection reached, and a new pod would get nothing. Several, comma-separated, are one
    pool (the operator's stepwise rollout: two revisions that answer alike)."""

    worker_resolve_interval_s: float = 2.0
    """How often worker_service is resolved again, in seconds: a pod that became ready (or went)
    is seen within this, plus the DNS server's own cache (CoreDNS: 5 s for a headless Service's
    records by default)."""

    host: str = "127.0.0.1"
    """Interface to bind. Loopback by default so a hand-started gateway is not exposed by accident."""

    port: int = 8080
    """TCP port for HTTP. 8080 is what TEI and most sidecar-free deployments expect."""

    processes: int = 1
    """Gateway processes serving `port` (SO_REUSEPORT; the kernel spreads connections over them). One
    process does its HTTP, JSON, tokenization and worker I/O on one event loop, so one core bounds
    its requests per second; more processes serve more where cores are free (docs/benchmarks.md,
    online serving). Each keeps its own connection to each worker replica. Metrics are summed
    over the processes."""

    served_model_names: tuple[str, ...] = ()
    """Names a request's `model` may carry; the first is the one reported. Empty: the worker's
    Info.model_name. More than one name gives aliases (like vLLM's repeated --served-model-name)."""

    models: str = ""
    """Several models behind this one endpoint, as a JSON list of one object a model: `model_dir`,
    `worker_addresses` (a list) or `worker_service`, optionally `name` (what a request's `model`
    names; default: the directory's name) or `served_model_names`, and any other field of this
    config set for that model alone (prompts, max_seq_length, chunk_tokens, the hold's bounds, ...).
    The HTTP edge's fields (host, port, connection bounds, api_key, max_request_bytes, log_level)
    are the endpoint's (endpoint.py). Empty: the one model of model_dir, served as it always was."""

    default_model: str = ""
    """With several `models`: the one a request goes to when it names none (TEI's routes have no
    model field) and no `X-Kembed-Model` header or `/models/<name>/` path prefix picks another.
    Empty: the first listed."""

    max_request_bytes: int = 8 * MIB
    """Largest HTTP body accepted, in bytes (413 above). 8 MiB holds 2048 inputs of ~1k tokens of
    English text with room to spare, and bounds what one request can make us buffer."""

    max_client_batch_size: int = 2048
    """Most inputs in one request (413 above). 2048 is OpenAI's own limit for /v1/embeddings."""

    max_answer_bytes: int = 64 * MIB
    """Largest answer one request is given, in bytes as encoded, estimated before the model runs
    from what is asked (inputs and their tokens, outputs, dimensions, encoding: float JSON ~13 bytes
    a value, base64 5.3, base64_int8 1.3; answer_size.py); 413 above, naming the estimate. ColBERT
    and token vectors grow with every token (256 BGE-M3 inputs of 512 tokens as ColBERT floats are
    ~1.7 GB of JSON), and an answer is built whole in this process's memory, about three times its
    size while it is encoded, and on its one core. 64 MiB holds every dense answer of 2048 inputs
    (max_client_batch_size) up to 4096 dimensions as base64, the openai SDK's default (45 MB), and
    up to 2500 dimensions as float JSON; about 5000 ColBERT vectors of BGE-M3's 1024 values as
    float JSON, 12,000 as base64."""

    max_tokenize_chars: int = 256 * 1024
    """Most characters one /tokenize request may hold, all inputs together; 413 above, before it is
    tokenized. It bounds the time a refused request costs; what an answer costs is bounded by
    max_tokenize_tokens (CJK text has about a token a character, English ~4 characters a token)."""

    max_tokenize_tokens: int = 64 * 1024
    """Most tokens one /tokenize request is answered, all inputs together; 413 as soon as they are
    counted past it (the rest is never tokenized). It answers every token, untruncated, ~60-100 B
    of JSON each: 65,536 tokens are a ~4-6 MB answer, built a piece at a time (tokenize_answer.py);
    that many are ~260,000 characters of English, ~65,000 of CJK."""

    max_context_documents: int = 512
    """Most documents in one `/v1/contextualizedembeddings` request (413 above). 512 is Perplexity's
    own limit for the route."""

    max_context_chunks: int = 16_000
    """Most chunks in one `/v1/contextualizedembeddings` request, all documents together (413 above):
    Perplexity's limit. A document's own chunk count is bounded by it and by its tokens (each chunk
    has one at least)."""

    max_document_tokens: int = 0
    """Most tokens of one document of `/v1/contextualizedembeddings`, special tokens and prompt
    included (413 above, never truncated: its last chunks would be lost). 0: the model's
    max_seq_length, the most one sequence can hold; a lower value bounds a document's step below it."""

    max_concurrent_requests: int = 512
    """Requests handled at once; one more is refused with 429 at once rather than queued without
    bound in front of the tokenizer threads. 512 is TEI's default."""

    auto_truncate: bool = True
    """Default of TEI's `truncate` and the OpenAI route's behaviour: cut inputs to the model's
    max_seq_length as sentence-transformers does, rather than refusing them with 413."""

    chunk_tokens: int = 4096
    """Most tokens in one chunk sent to a worker. A few times the worker's batch-token saturation
    point (~512 for a sub-1B model): large enough to amortise an RPC, small enough that one big
    request spreads over replicas and does not monopolise a worker's queue."""

    max_chunk_sequences: int = 64
    """Most sequences in one chunk. Bounds the response size of short-text chunks and keeps the
    worker's sequence-count buckets small."""

    max_inflight_frames: int = 0
    """Frames to one worker replica this gateway process keeps unanswered before chunks wait for
    one to be answered (then they go together in the next frame); 0: no limit, the chunks of each
    turn of the event loop leave at once in one frame. A worker answers a frame's requests as its
    batches finish, so chunks held here would mostly have waited in its queue; a limit makes fewer,
    fuller frames where the worker's CPU is short, at the cost of a wait here."""

    worker_transport: str = "frames"
    """How chunks travel to a worker: `frames`, one TCP connection per replica to the worker's data
    port (its Info's frame_port), carrying every chunk of this process, many a frame (no HTTP/2, no
    gRPC completion-queue thread waking the loop for each read and write); `unary`, one Embed/Score
    RPC per chunk. Chosen once per replica when its Info is read: a worker without a data port, or
    one whose data port does not answer then, is served by unary calls (its data port tried again
    30 s later)."""

    max_attempts: int = 3
    """Distinct replicas a chunk is tried on when one answers UNAVAILABLE or RESOURCE_EXHAUSTED or
    is found stalled. Bounded so a fleet-wide outage fails fast instead of cycling. A replica tried
    already may take the chunk again once it serves again (marked down, then SERVING to a probe),
    which needs a probe's round trip each time, within the chunk's deadline."""

    max_rejoin_wait_s: float = 10.0
    """How long, in seconds, a chunk already sent (its request admitted, part of its work done) that
    finds no replica to go to (the one it was on died, the others are down) waits for a replica to
    serve again, within its deadline, before failing 503: a worker resumed after a stop, or one that
    answers its probes again, is found within a probe or two (0.25 s apart while none serves). 10 s:
    about what a stopped or overloaded worker takes to answer again, short of the 60 s deadline, so
    an outage of the whole fleet still fails a request well before its deadline. 0: fail at once."""

    hedge_after_s: float = 0.25
    """An interactive chunk still unanswered this long after it was sent (or, if longer, after
    `hedge_multiple` times what its tokens and those ahead of it take at the replica's measured
    rate) is sent again to another serving replica; the first answer is taken, the other attempt
    cancelled (attempts.py). 0.25 s: well past a query's p99 on a healthy GPU or CPU worker (a few
    to tens of ms), well short of what a client notices as a hang. The replica stops getting new
    work until a probe sent at once says it serves. 0: no hedging."""

    bulk_hedge_after_s: float = 2.0
    """`hedge_after_s` for a bulk chunk: thousands of tokens behind others of their kind."""

    hedge_multiple: float = 4.0
    """How many times its expected time a chunk may take before it is hedged (see hedge_after_s)."""

    max_hedge_share: float = 0.02
    """The most hedges may add to the chunks sent, as a share: each chunk sent earns this much of a
    hedge, and a hedge is sent only with a whole one in hand (at most 10 saved), so a slow fleet
    sees at most 2 % more work, never a storm of duplicates. Never more than one hedge per chunk."""

    request_timeout_s: float = 60.0
    """Deadline of one HTTP request, in seconds, tokenization included (504 after). 60 s matches the
    OpenAI SDK's patience for a large batch on a loaded fleet without holding sockets forever."""

    max_queue_wait_s: float = 10.0
    """Longest a request may be expected to wait behind the work already admitted, in seconds, at the
    rate the workers have lately been finishing tokens; a request that would wait longer is refused
    with 429 at once (admission.py), so that under overload the admitted requests finish in time and
    the rest are told to come back. 10 s: a bulk client backs off before its deadline (60 s) is at
    risk, while a burst a healthy fleet clears in seconds is still taken. Never more than
    request_timeout_s."""

    priority_classes: bool = True
    """Tell the workers each request's class (docs/scheduling.md) and admit by class. Off (set it
    as the workers' `priority_classes`): every request is sent as interactive and admitted alike,
    as workers without classes serve them."""

    interactive_max_inputs: int = 8
    """A request is interactive (served before bulk work by the workers, docs/scheduling.md) when
    it has at most this many inputs and `interactive_max_tokens` tokens, unless its
    `X-Kembed-Priority` header says otherwise; bulk else. 8: a search query with a few rewrites."""

    interactive_max_tokens: int = 1024
    """Token limit of an interactive request (see interactive_max_inputs): two 512-token passages."""

    bulk_queue_share: float = 0.75
    """Bulk requests are refused (429) once what they would wait behind passes this share of what
    the workers' queues hold, and interactive ones only past all of it: when the fleet fills with
    indexing, queries still get in (the workers keep the same share for them)."""

    header_timeout_s: float = 10.0
    """Seconds a client has to send a request's head (request line and headers), counted from the
    connection opening or from the head's first byte on a kept-alive connection; 408 and close
    after. A connection that sends nothing at all is closed quietly at the same age (connections.py)."""

    body_timeout_s: float = 60.0
    """Seconds a client has to send a request's whole body once its head is in; 408 and close after.
    60 s takes the largest body (max_request_bytes) at ~1.1 Mbit/s, and frees the connection of a
    client that trickles its body."""

    keep_alive_timeout_s: float = 30.0
    """Seconds an idle kept-alive connection stays open after a response. Longer than the 5 s for which
    the OpenAI SDK's HTTP pool (httpx) keeps an idle connection, so that the client, not the gateway,
    closes it and a request never races the close."""

    max_header_bytes: int = 64 * 1024
    """Largest request head (request line and header fields) in bytes; 431 as soon as a head passes
    it, before the rest is parsed. 64 KiB holds any API key and tracing headers with room to spare."""

    max_headers: int = 128
    """Most header fields in one request; 431 above."""

    max_connections: int = 4096
    """Client connections one gateway process keeps open (lowered to fit its open-file limit, which it
    raises to the hard limit at start). Past it, the longest-open connection not being served (idle,
    or still sending its head) is closed for the new one; if all are busy the new one gets 503. An
    idle connection costs ~10-20 KB of memory."""

    health_interval_s: float = 2.0
    """Seconds between Health probes of each replica. Short enough that a restarted worker rejoins
    within a couple of seconds; each probe is a tiny unary RPC."""

    health_timeout_s: float = 1.0
    """Deadline of one Health or Info probe, in seconds. A worker that cannot answer a no-op within
    a second is not one to send traffic to."""

    max_health_age_s: float = 10.0
    """A replica counts as ready only if its last SERVING answer is younger than this, in seconds
    (five missed probes at the default interval)."""

    max_seq_length: int = 0
    """Truncation limit in tokens, special tokens included; 0 keeps the model's own (its
    sentence_bert_config.json max_seq_length, as sentence-transformers reads it)."""

    token_ids: str = "framed"
    """Which token-id inputs are embedded. `framed`: only ids this model's tokenizer makes, framed as it
    frames a sequence (its special tokens first and last, `[CLS] ... [SEP]` for BERT; for a tokenizer
    that adds none, ids that decode and encode back to themselves): another tokenizer's ids, such as
    the tiktoken ids langchain-openai sends by default, are refused (400) rather than embedded as wrong
    vectors, and an over-long sequence is cut inside its frame, as its text would be. `any`: every id
    below the vocabulary size, as-is (for clients that send this model's own ids without its special
    tokens)."""

    prompts: str = ""
    """Extra or overriding prompts as a JSON object of name to prefix text (e.g.
    `{"query": "query: "}`), merged over config_sentence_transformers.json's; empty adds none."""

    api_key: str = field(default="", repr=False)
    """API key every request must carry as `Authorization: Bearer <key>` (except /health, /ready and
    /metrics); empty: no key required. Read from a file (`--api-key-file`, a mounted Secret) or
    KEMBED_GATEWAY_API_KEY (on Kubernetes, from a Secret), never from a flag's value; never logged."""

    worker_auth_token: str = field(default="", repr=False)
    """The workers' shared token (their `--auth-token-file`), sent with every call to them as gRPC
    metadata `authorization: Bearer <token>` and as the first frame of each data-port connection;
    empty: none sent. A worker without a token ignores it. Read from a file
    (`--worker-auth-token-file`, a mounted Secret) or KEMBED_GATEWAY_WORKER_AUTH_TOKEN, never from a
    flag's value; never logged."""

    max_held_requests: int = 0
    """Requests held while the model has no serving worker (scaled to zero, or every worker
    restarting), until one serves or wake_timeout_s passes (then 503 with Retry-After); past this
    many held, or max_held_bytes, a request is answered so at once. What is held is the demand that
    wakes a model at zero (`kembed_gateway_held_requests`, docs/metrics.md). 0: none held, a
    request with no serving worker is answered 503 at once."""

    max_held_bytes: int = 64 * MIB
    """Most request-body bytes held at once (see max_held_requests): the memory a burst at zero
    workers may take, eight bodies at the largest max_request_bytes."""

    wake_timeout_s: float = 120.0
    """Longest a request is held for a worker to serve, in seconds (see max_held_requests). 120 s:
    a pod started on a node that has its image, a sub-1B model loaded and self-checked, well within
    the patience of a client's first request after a quiet hour (the OpenAI SDK waits 600 s)."""

    retry_after_s: int = 1
    """Value of the Retry-After header on 429, in seconds. Worker queues drain in well under that."""

    tokenization_workers: int = 4
    """Threads that run batch tokenization off the event loop. The Rust tokenizer releases the GIL
    and parallelises a batch internally, so a few threads keep the loop free without oversubscribing."""

    max_inline_tokenize_chars: int = 512
    """Requests whose texts add up to at most this many characters are tokenized on the event loop,
    larger ones on the tokenization threads. A hand-off to a thread and back costs more than
    tokenizing a query (~60 µs against ~35 µs for 80 characters; tokenizing takes ~0.3 µs a
    character), and 512 characters block the loop for ~150 µs at most. 0: always on the threads."""

    bulk_tokenization_processes: int = 0
    """Child processes that tokenize the texts of requests classed bulk (tokenizer_processes.py),
    off this process's GIL and event loop, spawned on the first such request; each holds its own
    copy of the tokenizer (~100 MB for BGE-M3's). Off by default: on a 2-core machine it did not
    lower a query's latency beside bulk (the cores, not the GIL, were short there), though it raised
    bulk throughput beside queries (docs/benchmarks-history.md); worth trying where the gateway has cores to
    spare. 0: bulk requests are tokenized on the tokenization threads like the others."""

    max_grpc_message_bytes: int = 64 * MIB
    """gRPC send/receive cap, in bytes. A chunk's response is at most max_chunk_sequences x dims x 4
    bytes (1 MiB for 4096-dim models); the default 4 MiB gRPC cap would be too tight for larger chunks."""

    log_level: str = "info"
    """Python/uvicorn log level name."""

    @property
    def worker_services(self) -> tuple[str, ...]:
        """worker_service's names, each `host:port`."""
        return tuple(part.strip() for part in self.worker_service.split(",") if part.strip())

    @property
    def static_workers(self) -> tuple[str, ...]:
        """The fixed worker addresses: those given, else the default when no service is given."""
        if self.worker_addresses or self.worker_service:
            return self.worker_addresses
        return ("127.0.0.1:50051",)

    def __post_init__(self) -> None:
        for service in self.worker_services:
            host, _, port = service.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"worker_service must be host:port (comma-separated), not {service!r}")
        if self.worker_resolve_interval_s <= 0:
            raise ValueError(
                f"worker_resolve_interval_s must be positive, got {self.worker_resolve_interval_s}"
            )
        positive = {
            "max_request_bytes": self.max_request_bytes,
            "max_client_batch_size": self.max_client_batch_size,
            "max_answer_bytes": self.max_answer_bytes,
            "max_tokenize_chars": self.max_tokenize_chars,
            "max_tokenize_tokens": self.max_tokenize_tokens,
            "max_context_documents": self.max_context_documents,
            "max_context_chunks": self.max_context_chunks,
            "max_concurrent_requests": self.max_concurrent_requests,
            "chunk_tokens": self.chunk_tokens,
            "max_chunk_sequences": self.max_chunk_sequences,
            "max_attempts": self.max_attempts,
            "request_timeout_s": self.request_timeout_s,
            "health_interval_s": self.health_interval_s,
            "health_timeout_s": self.health_timeout_s,
            "max_health_age_s": self.max_health_age_s,
            "tokenization_workers": self.tokenization_workers,
            "max_grpc_message_bytes": self.max_grpc_message_bytes,
            "header_timeout_s": self.header_timeout_s,
            "body_timeout_s": self.body_timeout_s,
            "keep_alive_timeout_s": self.keep_alive_timeout_s,
            "max_header_bytes": self.max_header_bytes,
            "max_headers": self.max_headers,
            "max_connections": self.max_connections,
            "max_held_bytes": self.max_held_bytes,
            "wake_timeout_s": self.wake_timeout_s,
        }
        positive["processes"] = self.processes
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.processes > 1 and self.port == 0:
            raise ValueError("several gateway processes need a fixed port, not 0")
        for name in (
            "max_seq_length",
            "max_inline_tokenize_chars",
            "max_inflight_frames",
            "max_document_tokens",
            "bulk_tokenization_processes",
            "max_rejoin_wait_s",
            "max_held_requests",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.prompts:
            try:
                prompts = json.loads(self.prompts)
            except json.JSONDecodeError as error:
                raise ValueError(f"prompts must be a JSON object: {error}") from None
            if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
                raise ValueError('prompts must be a JSON object of strings, e.g. {"query": "query: "}')
        if self.token_ids not in ("framed", "any"):
            raise ValueError(f"token_ids must be framed or any, not {self.token_ids!r}")
        if self.worker_transport not in ("frames", "unary"):
            raise ValueError(f"worker_transport must be frames or unary, not {self.worker_transport!r}")
        if self.interactive_max_inputs < 0 or self.interactive_max_tokens < 0:
            raise ValueError("interactive_max_inputs and interactive_max_tokens must be >= 0")
        if not 0 < self.bulk_queue_share <= 1:
            raise ValueError(f"bulk_queue_share must be in (0, 1], got {self.bulk_queue_share}")
        if min(self.hedge_after_s, self.bulk_hedge_after_s, self.hedge_multiple) < 0:
            raise ValueError("hedge_after_s, bulk_hedge_after_s and hedge_multiple must be >= 0")
        if not 0 <= self.max_hedge_share <= 1:
            raise ValueError(f"max_hedge_share must be in [0, 1], got {self.max_hedge_share}")
        if self.max_queue_wait_s <= 0:
            raise ValueError(f"max_queue_wait_s must be positive, got {self.max_queue_wait_s}")
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")


def with_overrides(spec: ModelSpec, config: GatewayConfig) -> ModelSpec:
    """The model directory's tokenization facts with the deployment's overrides (max length, prompts):
    what the gateway tokenizes by, and the golden check too (golden.py)."""
    prompts = {**spec.prompts, **(json.loads(config.prompts) if config.prompts else {})}
    return dataclasses.replace(
        spec, max_seq_length=config.max_seq_length or spec.max_seq_length, prompts=prompts
    )
