"""`spec.model`: where an `EmbeddingModel`'s weights are (exactly one source: a PersistentVolumeClaim,
a host path, or an image) and how their output is presented. Part of the spec (spec.py builds on it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kembed.operator.spec_base import SpecModel

__all__ = ["HostPathSource", "ImageSource", "ModelSource", "ModelSpec", "PvcSource"]


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


class ModelSource(SpecModel):
    """Where the weights are. Exactly one of pvc, hostPath or image. Nothing is downloaded at run time."""

    pvc: PvcSource | None = Field(None, description="Weights on a PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(None, description="Weights in a directory on the node.")
    image: ImageSource | None = Field(None, description="Weights in an OCI image mounted as a volume.")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelSource:
        if sum(source is not None for source in (self.pvc, self.host_path, self.image)) != 1:
            raise ValueError("set exactly one model source: pvc, hostPath or image")
        return self


class ModelSpec(SpecModel):
    """What is served: the weights and how their output is presented."""

    source: ModelSource = Field(description="Where the weights are; exactly one source.")
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
    def _fp8_linears_in_bfloat16(self) -> ModelSpec:
        if self.linear_dtype == "fp8" and self.dtype not in ("auto", "bfloat16"):
            raise ValueError(f"linearDtype fp8 computes in bfloat16 around its GEMMs, not dtype {self.dtype}")
        return self
