"""Sources of the endpoint set: each one calls `on_change(list[Endpoint])` when the set changes.

`epp.datalayer.discovery.kubernetes.InferencePoolDiscovery` follows an InferencePool and its pods through
the Kubernetes API. Modules are imported explicitly so that users of one source do not pay for
the others' dependencies.
"""
