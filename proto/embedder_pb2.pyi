from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FrameKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FRAME_KIND_UNSPECIFIED: _ClassVar[FrameKind]
    FRAME_KIND_EMBED: _ClassVar[FrameKind]
    FRAME_KIND_SCORE: _ClassVar[FrameKind]

class Output(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_NONE: _ClassVar[Output]
    OUTPUT_DENSE: _ClassVar[Output]
    OUTPUT_SPARSE: _ClassVar[Output]
    OUTPUT_COLBERT: _ClassVar[Output]
    OUTPUT_TOKENS: _ClassVar[Output]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_INTERACTIVE: _ClassVar[Priority]
    PRIORITY_BULK: _ClassVar[Priority]
FRAME_KIND_UNSPECIFIED: FrameKind
FRAME_KIND_EMBED: FrameKind
FRAME_KIND_SCORE: FrameKind
OUTPUT_NONE: Output
OUTPUT_DENSE: Output
OUTPUT_SPARSE: Output
OUTPUT_COLBERT: Output
OUTPUT_TOKENS: Output
PRIORITY_UNSPECIFIED: Priority
PRIORITY_INTERACTIVE: Priority
PRIORITY_BULK: Priority

class RequestFrame(_message.Message):
    __slots__ = ("kind", "ids", "timeouts_ms", "priorities", "num_sequences", "lengths", "token_ids", "token_type_ids", "num_spans", "span_bounds", "cancel_ids", "auth_token", "outputs", "tasks")
    KIND_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUTS_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    NUM_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TYPE_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SPANS_FIELD_NUMBER: _ClassVar[int]
    SPAN_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_IDS_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    kind: FrameKind
    ids: bytes
    timeouts_ms: bytes
    priorities: bytes
    num_sequences: bytes
    lengths: bytes
    token_ids: bytes
    token_type_ids: bytes
    num_spans: bytes
    span_bounds: bytes
    cancel_ids: bytes
    auth_token: str
    outputs: bytes
    tasks: bytes
    def __init__(self, kind: _Optional[_Union[FrameKind, str]] = ..., ids: _Optional[bytes] = ..., timeouts_ms: _Optional[bytes] = ..., priorities: _Optional[bytes] = ..., num_sequences: _Optional[bytes] = ..., lengths: _Optional[bytes] = ..., token_ids: _Optional[bytes] = ..., token_type_ids: _Optional[bytes] = ..., num_spans: _Optional[bytes] = ..., span_bounds: _Optional[bytes] = ..., cancel_ids: _Optional[bytes] = ..., auth_token: _Optional[str] = ..., outputs: _Optional[bytes] = ..., tasks: _Optional[bytes] = ...) -> None: ...

class ResultFrame(_message.Message):
    __slots__ = ("ids", "num_rows", "rows", "width", "errors")
    IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ids: bytes
    num_rows: bytes
    rows: bytes
    width: int
    errors: _containers.RepeatedCompositeFieldContainer[FrameError]
    def __init__(self, ids: _Optional[bytes] = ..., num_rows: _Optional[bytes] = ..., rows: _Optional[bytes] = ..., width: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[FrameError, _Mapping]]] = ...) -> None: ...

class FrameError(_message.Message):
    __slots__ = ("ids", "code", "message")
    IDS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ids: bytes
    code: int
    message: str
    def __init__(self, ids: _Optional[bytes] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class TokenBatch(_message.Message):
    __slots__ = ("token_ids", "lengths", "token_type_ids", "num_spans", "span_bounds")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TYPE_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SPANS_FIELD_NUMBER: _ClassVar[int]
    SPAN_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    lengths: _containers.RepeatedScalarFieldContainer[int]
    token_type_ids: bytes
    num_spans: _containers.RepeatedScalarFieldContainer[int]
    span_bounds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[bytes] = ..., lengths: _Optional[_Iterable[int]] = ..., token_type_ids: _Optional[bytes] = ..., num_spans: _Optional[_Iterable[int]] = ..., span_bounds: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("batch", "request_id", "priority", "outputs", "task")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    batch: TokenBatch
    request_id: str
    priority: Priority
    outputs: int
    task: str
    def __init__(self, batch: _Optional[_Union[TokenBatch, _Mapping]] = ..., request_id: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., outputs: _Optional[int] = ..., task: _Optional[str] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "num_sequences", "dimensions")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    NUM_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    embeddings: bytes
    num_sequences: int
    dimensions: int
    def __init__(self, embeddings: _Optional[bytes] = ..., num_sequences: _Optional[int] = ..., dimensions: _Optional[int] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("batch", "request_id", "priority")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    batch: TokenBatch
    request_id: str
    priority: Priority
    def __init__(self, batch: _Optional[_Union[TokenBatch, _Mapping]] = ..., request_id: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "num_sequences", "num_labels")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    NUM_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    NUM_LABELS_FIELD_NUMBER: _ClassVar[int]
    scores: bytes
    num_sequences: int
    num_labels: int
    def __init__(self, scores: _Optional[bytes] = ..., num_sequences: _Optional[int] = ..., num_labels: _Optional[int] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("id", "embed", "score", "cancel", "timeout_ms", "auth_token")
    ID_FIELD_NUMBER: _ClassVar[int]
    EMBED_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: int
    embed: EmbedRequest
    score: ScoreRequest
    cancel: StreamCancel
    timeout_ms: int
    auth_token: str
    def __init__(self, id: _Optional[int] = ..., embed: _Optional[_Union[EmbedRequest, _Mapping]] = ..., score: _Optional[_Union[ScoreRequest, _Mapping]] = ..., cancel: _Optional[_Union[StreamCancel, _Mapping]] = ..., timeout_ms: _Optional[int] = ..., auth_token: _Optional[str] = ...) -> None: ...

class StreamCancel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("id", "embed", "score", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    EMBED_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    embed: EmbedResponse
    score: ScoreResponse
    error: StreamError
    def __init__(self, id: _Optional[int] = ..., embed: _Optional[_Union[EmbedResponse, _Mapping]] = ..., score: _Optional[_Union[ScoreResponse, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_name", "model_type", "task", "dimensions", "max_sequence_length", "vocab_size", "pooling", "normalize", "dtype", "device", "attention_backend", "max_batch_tokens", "max_queued_tokens", "revision", "version", "data_port", "frame_port", "frame_idle_timeout_ms", "outputs", "colbert_dimensions", "hidden_size", "sparse_vocabulary", "tokenizer_digest", "model_digest", "tasks", "default_task")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    FRAME_PORT_FIELD_NUMBER: _ClassVar[int]
    FRAME_IDLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    COLBERT_DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_VOCABULARY_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TASK_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_type: str
    task: str
    dimensions: int
    max_sequence_length: int
    vocab_size: int
    pooling: str
    normalize: bool
    dtype: str
    device: str
    attention_backend: str
    max_batch_tokens: int
    max_queued_tokens: int
    revision: str
    version: str
    data_port: int
    frame_port: int
    frame_idle_timeout_ms: int
    outputs: int
    colbert_dimensions: int
    hidden_size: int
    sparse_vocabulary: bool
    tokenizer_digest: str
    model_digest: str
    tasks: _containers.RepeatedScalarFieldContainer[str]
    default_task: str
    def __init__(self, model_name: _Optional[str] = ..., model_type: _Optional[str] = ..., task: _Optional[str] = ..., dimensions: _Optional[int] = ..., max_sequence_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., pooling: _Optional[str] = ..., normalize: _Optional[bool] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., attention_backend: _Optional[str] = ..., max_batch_tokens: _Optional[int] = ..., max_queued_tokens: _Optional[int] = ..., revision: _Optional[str] = ..., version: _Optional[str] = ..., data_port: _Optional[int] = ..., frame_port: _Optional[int] = ..., frame_idle_timeout_ms: _Optional[int] = ..., outputs: _Optional[int] = ..., colbert_dimensions: _Optional[int] = ..., hidden_size: _Optional[int] = ..., sparse_vocabulary: _Optional[bool] = ..., tokenizer_digest: _Optional[str] = ..., model_digest: _Optional[str] = ..., tasks: _Optional[_Iterable[str]] = ..., default_task: _Optional[str] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status", "queued_tokens", "tokens_per_s", "reason")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[HealthResponse.Status]
        SERVING: _ClassVar[HealthResponse.Status]
        NOT_SERVING: _ClassVar[HealthResponse.Status]
    UNKNOWN: HealthResponse.Status
    SERVING: HealthResponse.Status
    NOT_SERVING: HealthResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: HealthResponse.Status
    queued_tokens: int
    tokens_per_s: float
    reason: str
    def __init__(self, status: _Optional[_Union[HealthResponse.Status, str]] = ..., queued_tokens: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class Bucket(_message.Message):
    __slots__ = ("num_sequences", "num_tokens")
    NUM_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_sequences: int
    num_tokens: int
    def __init__(self, num_sequences: _Optional[int] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class BucketStat(_message.Message):
    __slots__ = ("bucket", "hits", "captured")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    CAPTURED_FIELD_NUMBER: _ClassVar[int]
    bucket: Bucket
    hits: int
    captured: bool
    def __init__(self, bucket: _Optional[_Union[Bucket, _Mapping]] = ..., hits: _Optional[int] = ..., captured: _Optional[bool] = ...) -> None: ...

class BucketStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BucketStatsResponse(_message.Message):
    __slots__ = ("buckets",)
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    buckets: _containers.RepeatedCompositeFieldContainer[BucketStat]
    def __init__(self, buckets: _Optional[_Iterable[_Union[BucketStat, _Mapping]]] = ...) -> None: ...

class PrewarmRequest(_message.Message):
    __slots__ = ("buckets",)
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    buckets: _containers.RepeatedCompositeFieldContainer[Bucket]
    def __init__(self, buckets: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ...) -> None: ...

class PrewarmResponse(_message.Message):
    __slots__ = ("captured", "errors")
    CAPTURED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    captured: _containers.RepeatedCompositeFieldContainer[Bucket]
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, captured: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class SmokeTestRequest(_message.Message):
    __slots__ = ("buckets", "min_cosine", "seed")
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    MIN_COSINE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    buckets: _containers.RepeatedCompositeFieldContainer[Bucket]
    min_cosine: float
    seed: int
    def __init__(self, buckets: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ..., min_cosine: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class SmokeTestResult(_message.Message):
    __slots__ = ("bucket", "min_cosine", "has_nonfinite", "passed")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    MIN_COSINE_FIELD_NUMBER: _ClassVar[int]
    HAS_NONFINITE_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    bucket: Bucket
    min_cosine: float
    has_nonfinite: bool
    passed: bool
    def __init__(self, bucket: _Optional[_Union[Bucket, _Mapping]] = ..., min_cosine: _Optional[float] = ..., has_nonfinite: _Optional[bool] = ..., passed: _Optional[bool] = ...) -> None: ...

class SmokeTestResponse(_message.Message):
    __slots__ = ("passed", "results")
    PASSED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    passed: bool
    results: _containers.RepeatedCompositeFieldContainer[SmokeTestResult]
    def __init__(self, passed: _Optional[bool] = ..., results: _Optional[_Iterable[_Union[SmokeTestResult, _Mapping]]] = ...) -> None: ...
