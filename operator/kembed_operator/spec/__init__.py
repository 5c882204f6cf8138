"""kembed.operator.spec: the `EmbeddingModel` resource as typed records: its spec by section (`spec`
and the `*_spec` modules, on `spec_base`) and its status (`status`). The CRD is generated from them
(`kembed.operator.crd`).

Pure pydantic: no client, no manifests.
"""
