"""kembed.worker.engine.models: the model families and what a model directory holds: which family a
directory builds (`families`), the one forward every family implements (`served`), each family's
module (`bert`, `qwen3`, `cross_encoder`, `splade`), the directory's config and pipeline
(`model_dir`), sentence-transformers' Dense modules (`dense`) and BGE-M3's extra heads (`heads`).

A family composes the shared `layers` and `kernels`; it knows nothing of buckets, graphs or queues.
"""
