"""``--allow-pods NAMESPACE/SELECTOR``: the allow-list follows the prefill pods of the pool.

A list/watch of the namespace's pods matching the label selector (the InferencePool's selector
plus ``llm-d.ai/role=prefill``, say) keeps the allow-list at their pod IPs: a pod that is not
Running or has no IP yet is not allowed. The sidecar needs ``get/list/watch pods`` in that
namespace (deploy/components/pd-disaggregation/).
"""

from __future__ import annotations

import logging
from typing import Any

from pdsidecar.allowlist import AllowList

log = logging.getLogger(__name__)


def pod_ips(pods: dict[str, dict[str, Any]]) -> set[str]:
    """IPs of the Running pods of a watch cache (name -> pod object)."""
    out = set()
    for pod in pods.values():
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") == "Running" and isinstance(ip, str) and ip:
            out.add(ip)
    return out


def parse_ref(ref: str) -> tuple[str, str]:
    namespace, sep, selector = ref.partition("/")
    if not sep or not namespace or not selector:
        raise ValueError(
            f"--allow-pods {ref!r} must be NAMESPACE/LABEL_SELECTOR, e.g. llm/app=llama,llm-d.ai/role=prefill"
        )
    return namespace, selector


def follow_pods(allow: AllowList, ref: str) -> Any:
    """Start the watch (a `gateway.kube.watch.Reflector` thread) and return it; `stop()` ends it."""
    import kubernetes

    from gateway.kube.watch import Reflector, default_api_client

    namespace, selector = parse_ref(ref)
    core = kubernetes.client.CoreV1Api(default_api_client())

    def list_pods(**kw: Any) -> Any:  # no return annotation: the watch yields raw dicts
        return core.list_namespaced_pod(namespace, **kw)

    def synced(pods: dict[str, dict[str, Any]], _selector: str) -> None:
        ips = pod_ips(pods)
        allow.set_pods(ips)
        log.info("allowed prefill pods (%s): %s", ref, ", ".join(sorted(ips)) or "none")

    def fatal(exc: Any) -> bool:
        log.error("cannot watch pods %s: %s", ref, exc)
        return False

    reflector = Reflector(
        f"pods/{namespace}", list_pods, synced, fatal,
        selector_kind="label_selector", selector=selector, backoff_s=1.0, watch_timeout_s=300,
    )  # fmt: skip
    reflector.start()
    return reflector
