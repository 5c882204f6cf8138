"""The gateway's routes that need a model of one task ("embed", "score"): the others answer for any
model. The gateway documents and answers its routes by this table (openapi.py's `Operation.task`); the
worker's check-model lists a model directory's routes from it. Every route here takes a POST."""

TASK_ROUTES: dict[str, tuple[str, ...]] = {
    "embed": (
        "/v1/embeddings",
        "/v1/contextualizedembeddings",
        "/v1/embed",
        "/embed",
        "/embed_sparse",
        "/embed_all",
        "/v2/embed",
        "/similarity",
    ),
    "score": ("/rerank", "/v1/rerank", "/v2/rerank"),
}
