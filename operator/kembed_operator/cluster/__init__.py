"""kembed.operator.cluster: the operator against the API: one idempotent `reconcile` (`reconcile`) over
the `Cluster` port (`apply`, and `cluster`, its kubernetes client), the world it reads (`observed`),
the model sources' resolve and cache Jobs (`model_resolve`), the hot list kept current
(`hot_buckets`) and the RBAC rules it needs (`rbac`).
"""
