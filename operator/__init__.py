"""kembed.operator: the kopf operator that reconciles `EmbeddingModel` resources (kembed.dev).

Renders gateway and worker Deployments per revision, runs prewarm and smoke-test Jobs and gates
rollouts on them. It imports neither the gateway nor the worker: its Jobs run the worker image's own
command-line tools. (Built in a later issue; this package only reserves the layer.)
"""
