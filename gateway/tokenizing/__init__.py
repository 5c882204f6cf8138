"""kembed.gateway.tokenizing: texts to token ids as sentence-transformers makes them, with the Rust
`tokenizers` library: inline for a query, on threads, or in child processes for bulk work
(`tokenization`, the one entry, over `tokenizer_processes`, `tokenizer_load`, `windows`,
`encode_groups`); late-chunking documents (`documents`); `/tokenize`'s answer (`tokenize_answer`);
freed memory given back after large requests (`heap`).

It knows no HTTP framework and no worker.
"""
