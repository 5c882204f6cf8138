"""kembed.worker.engine.layers: the blocks families share: attention over packed sequences with its
backends (`attention`, `attention_backends`, `triton_attention`), rotary positions (`rope`) and pooling
(`pooling`).
"""
