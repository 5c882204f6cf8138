"""kembed.operator.build: pure builders of what the operator creates, from a spec: names and labels
(`naming`), a revision's hash (`revision`), Deployments, Services and ConfigMaps (`manifests`, with
`pod_fields`, `placement`), budgets and policies (`policies`), the rollout Jobs (`jobs`), the model
fetch's Jobs and init containers (`model_fetch`), autoscalers (`autoscaling`) and image digests
(`images`).

Functions that return dicts, checked by golden tests; no API calls.
"""
