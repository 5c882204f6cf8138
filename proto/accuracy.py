"""kembed's accuracy bar, one number for every check that two runs give the same embeddings: the worst
row's cosine between a CUDA graph's replay and an eager run (the worker's smoke test and start-up self
check), between pods and against golden embeddings (the rollout's Jobs), and the operator's default
`rollout.minCosine`. bf16 replay against eager gives ~0.9999; fp8 linears fall below the bar."""

MIN_COSINE = 0.999
