"""The global tier's manifests: the routers (deploy/global) and each member's reporter
(components/global-reporter, the chart's globalReporter values) fit together: valid objects,
the console scripts the image installs, a router configuration the router parses, and every
address a container dials naming a Service port that exists."""

from __future__ import annotations

import importlib
import importlib.util
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from globalrouter.config import parse_config as parse_router_config
from tests.k8s.kustomize_lite import build
from tests.k8s.test_manifests import DEPLOY, render, validate_objects

Obj = dict[str, Any]
SCRIPTS = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["scripts"]


def _one(objs: list[Obj] | tuple[Obj, ...], kind: str, name: str) -> Obj:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def _container(objs: list[Obj] | tuple[Obj, ...], name: str, kind: str = "Deployment") -> Obj:
    return dict(_one(objs, kind, name)["spec"]["template"]["spec"]["containers"][0])


def _args(container: Obj) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for arg in container["args"]:
        key, _, value = arg.partition("=")
        out.setdefault(key, []).append(value)
    return out


def _runs(container: Obj, module: str) -> None:
    """The container's command is a console script of this package, calling `module`'s main."""
    (command,) = container["command"]
    target, _, func = SCRIPTS[command].partition(":")
    assert target == module, (command, SCRIPTS[command])
    assert callable(getattr(importlib.import_module(target), func))


def _service_port(objs: list[Obj] | tuple[Obj, ...], host_port: str) -> Obj:
    """The Service that `name.namespace.svc.cluster.local:port` (or `name:port`) names, checked."""
    host, _, port = host_port.rpartition(":")
    name, _, rest = host.partition(".")
    namespace = rest.split(".")[0] if rest else None
    service = _one(
        [o for o in objs if not namespace or o["metadata"].get("namespace") == namespace], "Service", name
    )
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}, (host_port, service["spec"]["ports"])
    return service


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    """A member cluster: overlays/sim with the reporter component."""
    root = tmp_path_factory.mktemp("member")
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / "sim", root)],
                "components": [os.path.relpath(DEPLOY / "components" / "global-reporter", root)],
            }
        )
    )
    return build(root)


def test_the_routers_run_the_console_script_on_a_config_the_router_parses() -> None:
    objs = render("global")
    validate_objects(objs)
    router = _container(objs, "global-router", "StatefulSet")
    _runs(router, "globalrouter.__main__")
    args = _args(router)
    (config_path,) = args["--config"]
    mount = next(m for m in router["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(
        v
        for v in _one(objs, "StatefulSet", "global-router")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == mount["name"]
    )
    text = _one(objs, "ConfigMap", volume["configMap"]["name"])["data"][Path(config_path).name]
    config = parse_router_config(yaml.safe_load(text))
    # Its rate limits count in the Valkey these manifests run.
    assert config.rate_limits.redis_url is not None
    _service_port(objs, config.rate_limits.redis_url.removeprefix("redis://").split("/")[0])
    assert (
        args["--port"] == ["9100"]
        and _service_port(objs, "global-router:9100")["spec"]["clusterIP"] == "None"
    )


def test_a_member_reports_its_epp_to_every_router(member: list[Obj]) -> None:
    validate_objects(member)
    routers = render("global")
    reporter = _container(member, "global-reporter")
    _runs(reporter, "globalrouter.reporter")
    args = _args(reporter)
    # The EPP's metrics Service port, admitted by the EPP's NetworkPolicy for the reporter.
    (epp_admin,) = args["--epp-admin"]
    _service_port(member, epp_admin.removeprefix("http://"))
    policy = _one(member, "NetworkPolicy", "epp")
    assert {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "global-reporter"}}}],
            "ports": [{"protocol": "TCP", "port": "metrics"}]} in policy["spec"]["ingress"]  # fmt: skip
    # Every router replica by its stable name (each must get every heartbeat; one channel to the
    # Service name would reach one), and a member name of theirs.
    statefulset = _one(routers, "StatefulSet", "global-router")
    service = statefulset["spec"]["serviceName"]
    namespace = statefulset["metadata"]["namespace"]
    assert _one(routers, "Service", service)["spec"]["clusterIP"] == "None"
    assert args["--router"] == [
        f"global-router-{i}.{service}.{namespace}.svc.cluster.local:9100"
        for i in range(statefulset["spec"]["replicas"])
    ]
    for router in args["--router"]:
        _service_port(routers, router.split(".", 1)[1])
    config = _one(routers, "ConfigMap", "global-router-config")["data"]["router.yaml"]
    assert args["--cluster"][0] in {m.name for m in parse_router_config(yaml.safe_load(config)).members}


def test_the_chart_renders_the_reporter_when_asked() -> None:
    if importlib.util.find_spec("helm_sdkpy") is None:
        if os.environ.get("CI"):
            raise RuntimeError("helm-sdkpy is missing: the Makefile's venv step installs it")
        pytest.skip("helm-sdkpy not installed (make test installs it)")
    from tests.k8s.helm_render import render_chart

    values = {
        "globalReporter": {"enabled": True, "cluster": "east-a", "routers": ["global-router.g.svc:9100"]}
    }
    result = render_chart(
        DEPLOY / "helm" / "inference-gateway",
        [
            {"namespace": "ml", "values": values},
            {"namespace": "ml", "values": {"globalReporter": {"enabled": True}}},
        ],
    )
    ok, missing = result["renders"]
    assert "error" not in ok, ok
    objs = [o for o in yaml.safe_load_all(ok["manifest"]) if o]
    validate_objects(objs)
    reporter = _container(objs, "global-reporter")
    _runs(reporter, "globalrouter.reporter")
    assert "--epp-admin=http://epp.ml.svc.cluster.local:9090" in reporter["args"]
    assert "--router=global-router.g.svc:9100" in reporter["args"]
    assert "global-reporter" in str(_one(objs, "NetworkPolicy", "epp")["spec"]["ingress"])
    assert "globalReporter.cluster" in missing["error"]  # no member name: refused, saying which value
