"""kembed.gateway: the HTTP edge of kembed, everything CPU-side before the GPU.

It parses OpenAI- and TEI-shaped JSON requests, tokenizes with the Rust `tokenizers` library (prompt
templates and truncation exactly as sentence-transformers does them), splits each request into chunks of
at most `chunk_tokens` tokens, sends every chunk to the worker replica with the fewest outstanding tokens
over gRPC (`kembed.proto`), reassembles the pooled vectors in input order, applies `dimensions` and
normalisation, and encodes them as floats or base64.

It must not import torch, transformers, sentence-transformers or anything under `kembed.worker`: the
only thing it shares with the worker is the `kembed.proto` contract. It never runs a model.
"""
