"""kembed.worker.engine.models: the model families and what a model directory holds: which family a
directory builds (`families`), the one forward every family implements (`served`), each family's
module (`bert`; `decoder` and the families it serves, `qwen3`, `qwen2`, `eurobert`; `cross_encoder`,
`llm_reranker`, `splade`), the directory's config and pipeline (`model_dir`), sentence-transformers'
Dense and LogitScore modules (`dense`, `logit_score`) and BGE-M3's extra heads (`heads`).

A family composes the shared `layers` and `kernels`; it knows nothing of buckets, graphs or queues.
"""
