"""`spec.model`: where an `EmbeddingModel`'s weights are (exactly one source: a PersistentVolumeClaim,
a host path, an image, a Hugging Face Hub repository or an S3 prefix) and how their output is
presented. Part of the spec (spec.py builds on it).

The Hub and S3 sources are fetched by the worker image's own `kembed-worker fetch-model` (the
operator renders it: model_fetch.py), into each pod's own volume or, with `cache`, once per
revision into a shared claim.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from kembed.operator.spec.spec_base import SpecModel

__all__ = [
    "HostPathSource",
    "HuggingFaceSource",
    "ImageSource",
    "ModelCache",
    "ModelSource",
    "ModelSpec",
    "PvcSource",
    "S3Source",
]

# Files a fetch never writes, whatever `files` says: pickled weights run code when loaded.
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
FILES_DESCRIPTION = (
    "Glob patterns of the files to fetch (fnmatch, matched against the path in the repository or "
    "under the prefix, e.g. '*.safetensors'). Empty: the safetensors weights and "
    "the JSON, tokenizer and sentence-transformers files (*.safetensors, *.json, vocab.txt, "
    "merges.txt, *.model, including those in module folders such as 1_Pooling/). Pickled weights "
    "(.bin, .pt, .pth, .pkl, .ckpt) are refused: they run code when loaded."
)
REFRESH_DESCRIPTION = (
    "How often the operator resolves the source again, in seconds (a branch's newest commit, the "
    "objects' ETags); new weights behind the same name are a new revision and go through the rollout "
    "gates. 0: only when this source changes. Between resolutions every pod fetches what was resolved, "
    "never the source as it is now. Not part of the revision."
)


class PvcSource(SpecModel):
    """Weights on a PersistentVolumeClaim, mounted read-only into every worker and gateway pod."""

    claim_name: str = Field(
        min_length=1,
        description="Name of the PersistentVolumeClaim in this namespace. "
        "Use a ReadOnlyMany claim when pods land on several nodes.",
    )
    path: str = Field(
        "",
        description="Directory inside the claim holding config.json, the safetensors and "
        "tokenizer.json (a subPath); empty means the claim's root.",
    )


class HostPathSource(SpecModel):
    """Weights in a directory on every node (pre-pulled by a DaemonSet or baked into the node image)."""

    path: str = Field(
        min_length=1,
        pattern="^/",
        description="Absolute directory on the node with config.json, the safetensors and tokenizer.json.",
    )


class ImageSource(SpecModel):
    """Weights shipped as an OCI image, mounted as an image volume (Kubernetes 1.31+, ImageVolume)."""

    reference: str = Field(
        min_length=1,
        description="Image reference holding the model directory, "
        "e.g. registry.example/models/bge-m3:v1. Pin a digest for reproducible revisions.",
    )
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the model image."
    )
    path: str = Field(
        "",
        description="Directory inside the image holding the model (a subPath); empty means the image's root.",
    )


FilePattern = Annotated[str, Field(min_length=1, max_length=256)]


def _refuse_pickles(files: list[str]) -> list[str]:
    pickled = [pattern for pattern in files if pattern.lower().endswith(PICKLED_SUFFIXES)]
    if pickled:
        raise ValueError(f"files {pickled}: pickled weights are refused (they run code when loaded)")
    return files


class HubTokenRef(SpecModel):
    """A key of a Secret in this namespace holding a Hugging Face access token (read scope)."""

    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field("token", min_length=1, description="Key within the Secret.")


class HuggingFaceSource(SpecModel):
    """A Hugging Face Hub model repository, fetched before the workers start. A branch or tag is
    resolved to its commit, which pins the revision: every pod of the revision fetches that commit,
    whatever the branch points at later. `status.model` shows it."""

    repo: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$",
        description="Repository id, e.g. BAAI/bge-m3.",
    )
    revision: str = Field(
        "main",
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        description="Branch, tag or commit sha. A branch or tag is resolved to its commit sha when the "
        "source is set (and every refreshSeconds); a 40-character sha is used as it is.",
    )
    token_secret_ref: HubTokenRef | None = Field(
        None,
        description="Secret key holding an access token, for private and gated repositories (the "
        "fetch reads it as HF_TOKEN). Unset: anonymous.",
    )
    files: list[FilePattern] = Field(default_factory=list, max_length=64, description=FILES_DESCRIPTION)
    endpoint: str = Field(
        "",
        pattern=r"^(https?://.+)?$",
        description="Hub endpoint (HF_ENDPOINT), for a mirror or a self-hosted Hub; empty: "
        "https://huggingface.co.",
    )
    refresh_seconds: int = Field(0, ge=0, description=REFRESH_DESCRIPTION)

    _files = field_validator("files")(_refuse_pickles)


class S3CredentialsRef(SpecModel):
    """A Secret in this namespace holding an access key pair, read as the AWS variables."""

    name: str = Field(min_length=1, description="Secret name.")
    access_key_id_key: str = Field(
        "AWS_ACCESS_KEY_ID", min_length=1, description="Key within the Secret holding the access key id."
    )
    secret_access_key_key: str = Field(
        "AWS_SECRET_ACCESS_KEY",
        min_length=1,
        description="Key within the Secret holding the secret access key.",
    )


class S3Source(SpecModel):
    """Objects under an S3 (or S3-compatible: MinIO, Ceph, R2, GCS's XML API) prefix, fetched before
    the workers start. The keys, sizes and ETags of the objects fetched (nothing else under the prefix)
    are resolved to one digest, which pins the revision; every pod fetches exactly those objects: by
    VersionId in a bucket that keeps versions, else while each still has its ETag (one replaced since is
    refused, naming it). Every object is verified against its ETag, or SHA256SUMS when there is one."""

    bucket: str = Field(
        min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$", description="Bucket name."
    )
    prefix: str = Field(
        "",
        max_length=1024,
        description="Key prefix of the model directory, e.g. models/bge-m3/ (a trailing / is added); "
        "empty: the bucket's root.",
    )
    endpoint_url: str = Field(
        "",
        pattern=r"^(https?://.+)?$",
        description="S3 endpoint for S3-compatible stores, e.g. http://minio.storage.svc:9000; empty: AWS.",
    )
    region: str = Field("", description="Region; empty: us-east-1 unless the endpoint implies one.")
    credentials_secret_ref: S3CredentialsRef | None = Field(
        None,
        description="Secret with the access key pair. Unset: the pod's own identity (IRSA or EKS Pod "
        "Identity through worker.serviceAccountName, an instance profile).",
    )
    files: list[FilePattern] = Field(default_factory=list, max_length=64, description=FILES_DESCRIPTION)
    refresh_seconds: int = Field(0, ge=0, description=REFRESH_DESCRIPTION)

    _files = field_validator("files")(_refuse_pickles)


SOURCE_NAMES = "pvc, hostPath, image, huggingFace or s3"


class ModelSource(SpecModel):
    """Where the weights are. Exactly one of pvc, hostPath, image, huggingFace or s3. The Hub and S3
    sources are fetched (verified, atomically) before a pod's containers start; nothing is downloaded
    while serving."""

    pvc: PvcSource | None = Field(None, description="Weights on a PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(None, description="Weights in a directory on the node.")
    image: ImageSource | None = Field(None, description="Weights in an OCI image mounted as a volume.")
    hugging_face: HuggingFaceSource | None = Field(
        None, description="Weights in a Hugging Face Hub repository, fetched before the workers start."
    )
    s3: S3Source | None = Field(
        None, description="Weights under an S3 prefix, fetched before the workers start."
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelSource:
        sources = (self.pvc, self.host_path, self.image, self.hugging_face, self.s3)
        if sum(source is not None for source in sources) != 1:
            raise ValueError(f"set exactly one model source: {SOURCE_NAMES}")
        return self

    @property
    def fetched(self) -> HuggingFaceSource | S3Source | None:
        """The source a fetch brings in (Hub or S3), None for a mounted one."""
        return self.hugging_face or self.s3


class ModelCache(SpecModel):
    """A ReadWriteMany claim the model is fetched into once per revision (by a Job), which every
    worker and gateway pod then mounts read-only: scale-out and restarts download nothing."""

    claim_name: str = Field(
        min_length=1,
        description="Name of a ReadWriteMany PersistentVolumeClaim in this namespace, large enough for "
        "the revisions kept (the serving one and a candidate). Each fetch is its own directory in it.",
    )


class ModelSpec(SpecModel):
    """What is served: the weights and how their output is presented."""

    source: ModelSource = Field(description="Where the weights are; exactly one source.")
    cache: ModelCache | None = Field(
        None,
        description="With a huggingFace or s3 source: fetch once per revision into this claim (a Job) "
        "instead of into every pod's own volume. Unset: each pod fetches into an emptyDir before it "
        "starts.",
    )
    served_name: str = Field(
        "",
        description="Name clients send in `model` and /v1/models reports; empty "
        "means the model directory's name.",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Weight and activation precision. auto: bfloat16 on CUDA, float32 on CPU "
        "(where half precision is slower).",
    )
    linear_dtype: Literal["auto", "fp8"] = Field(
        "auto",
        description="How the encoder layers' linears compute. auto: in dtype. fp8: float8 e4m3 weights "
        "and activations on fp8 tensor cores (GPUs of compute capability 8.9 or newer), for more bulk "
        "throughput (8-19% measured on an H200) at a loss of accuracy: cosine ~0.99 against float32 "
        "instead of >= 0.999, and slower batch-1 latency. Needs dtype auto or bfloat16 and a GPU worker; "
        "golden embeddings made without it need a lower rollout.minCosine.",
    )
    pooling: Literal["cls", "mean", "lasttoken"] | None = Field(
        None, description="Override of the pooling in the model's modules.json; unset keeps the model's own."
    )
    normalize: bool | None = Field(
        None,
        description="Override of L2 normalisation; unset keeps the model's sentence-transformers "
        "pipeline (a Normalize module means normalised).",
    )
    max_sequence_length: int | None = Field(
        None,
        ge=1,
        le=131072,
        description="Tokens kept per input before truncation; unset keeps the model's max_seq_length.",
    )
    prompts: dict[str, str] = Field(
        default_factory=dict,
        description="Prompt name to prefix (e.g. query: 'query: '), added to those in "
        "config_sentence_transformers.json; requests select one with prompt_name.",
    )

    @model_validator(mode="after")
    def _cache_for_a_fetched_source(self) -> ModelSpec:
        if self.cache is not None and self.source.fetched is None:
            raise ValueError(
                "cache holds what a huggingFace or s3 source fetches; a mounted source needs none"
            )
        return self

    @model_validator(mode="after")
    def _fp8_linears_in_bfloat16(self) -> ModelSpec:
        if self.linear_dtype == "fp8" and self.dtype not in ("auto", "bfloat16"):
            raise ValueError(f"linearDtype fp8 computes in bfloat16 around its GEMMs, not dtype {self.dtype}")
        return self


class ModelStatus(SpecModel):
    """What a huggingFace or s3 source resolved to (status.model): for which source, when, and for
    each kept revision what it was made from."""

    source: str = Field(description="The source, as hf://REPO@REVISION or s3://BUCKET/PREFIX/.")
    source_hash: str = Field("", description="Hash of the source as written that this was resolved for.")
    source_key: str = Field("", description="The source and its refresh interval this was resolved for.")
    resolved: str = Field(
        "",
        description="What the source resolved to: the Hub commit sha, or etags-sha256: and a digest of "
        "the keys, sizes and ETags of the objects fetched (nothing else under the prefix counts). Part "
        "of the revision.",
    )
    resolved_at: str = Field("", description="When it was resolved (RFC 3339).")
    revision: str = Field("", description="The revision made from it.")
    revisions: dict[str, str] = Field(
        default_factory=dict, description="What each kept revision (serving, candidate) was made from."
    )
    pins: dict[str, str] = Field(
        default_factory=dict,
        description="What a fetch asks for to get each of those resolutions again, whatever changed "
        "upstream since: for S3 the objects' VersionIds (a versioned bucket) or ETags; none for the "
        "Hub, whose commit sha is its own pin, or for an S3 resolution of too many objects to carry one.",
    )
    serving: str = Field("", description="What the serving revision was made from: what is served.")
