"""kembed.worker.engine.kernels: fused CUDA kernels the families call where they run on a GPU: encoder
fusions (`fused`), decoder fusions (`fused_decoder`) and fp8 linears (`fp8`), each with its plain-torch
form.
"""
