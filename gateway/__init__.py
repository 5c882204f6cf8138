"""kembed.gateway: the HTTP edge of kembed, everything CPU-side before the GPU.

It serves OpenAI-, Cohere- (v1, v2), TEI- and Perplexity-shaped routes: parses and validates the JSON,
tokenizes with the Rust `tokenizers` library (prompts and truncation as sentence-transformers does
them; small requests inline, larger ones on threads, bulk ones in child processes), admits by tokens,
splits each request into chunks of at most `chunk_tokens`, sends each chunk to the worker replica with
the fewest outstanding tokens (gRPC, or the data port's frames; hedged when slow, moved off a stalled
replica), reassembles the rows in input order, and answers: `dimensions`, normalisation, float,
base64 or quantised encodings, sparse and multi-vector outputs.

Layers, checked by import-linter: routes → service → worker pool → transports. It must not import
torch, transformers, sentence-transformers or anything of `kembed.worker` or `kembed.operator`: it
shares only `kembed.proto` with the worker. It never runs a model.
"""
