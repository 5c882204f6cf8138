"""kembed.operator: the kopf operator that reconciles `EmbeddingModel` resources (kembed.dev/v1alpha1).

Renders gateway and worker Deployments per revision (pure builders, golden-tested), runs prewarm and
smoke-test (and golden) Jobs and promotes a revision only when they pass (`rollout.py`, a pure state
machine whose state lives in the resource's status). It imports neither the gateway nor the worker
(of `kembed.proto`, only the accuracy bar, `rollout.minCosine`'s default): its Jobs run
the worker image's own command-line tools, and it speaks to them only through flags and environment.
"""
