"""The metric names and label sets our dialects read, from the engines' own definitions.

vLLM's loggers and SGLang's collector import their whole engines, so their source is read as
an AST, not run: every call with `name=` and `documentation=` (prometheus_client's metric
constructors) gives a metric, its name and `labelnames` evaluated from string constants,
`self.x = "..."` attributes, local lists and `+` / `*` of those; a `labels.keys()` stays a
named placeholder that the engine's section resolves (vLLM's CacheConfig fields, SGLang's
labels dict). No TensorRT-LLM wheel is installed: its definitions are the ones read from its
source (cited in TRTLLM_SOURCE). Each engine's page is then written from those
definitions and parsed by the EPP's own parser (epp/datalayer/metric_dialects.py), which must read back the
values written.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from devstack.engine_check.report import Check
from epp.datalayer.endpoint_records import Metrics
from epp.datalayer.metric_dialects import DIALECTS, parse_metrics


@dataclass(frozen=True)
class Placeholder:
    """Label names known only at run time, e.g. the keys of a `labels` dict."""

    source: str


Label = str | Placeholder


@dataclass
class _Scope:
    """What names mean inside one function of the engine's source."""

    attrs: dict[str, str]  # `self.x = "..."` anywhere in the file
    strings: dict[str, str] = field(default_factory=dict)  # `x = "..."` in the function
    lists: dict[str, list[Label]] = field(default_factory=dict)  # `x = [...]` in the function


def _str(node: ast.expr, scope: _Scope) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _str(node.left, scope), _str(node.right, scope)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return scope.attrs.get(node.attr)
    if isinstance(node, ast.Name):
        return scope.strings.get(node.id)
    return None


def _labels(node: ast.expr | None, scope: _Scope) -> list[Label] | None:
    if node is None:
        return []
    if isinstance(node, ast.List | ast.Tuple):
        out: list[Label] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                inner = _labels(element.value, scope)
                if inner is None:
                    return None
                out += inner
            elif (one := _str(element, scope)) is not None:
                out.append(one)
            else:
                return None
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _labels(node.left, scope), _labels(node.right, scope)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Name) and node.id in scope.lists:
        return list(scope.lists[node.id])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys":
        return [Placeholder(ast.unparse(node.func.value))]
    return None


def _self_strings(tree: ast.AST) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    if isinstance(node.value.value, str):
                        out[target.attr] = node.value.value
    return out


def _function_scope(func: ast.AST, attrs: dict[str, str]) -> _Scope:
    scope = _Scope(attrs)
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                scope.strings[name] = value.value  # e.g. `name = "vllm:cache_config_info"`
            elif isinstance(value, ast.List | ast.Tuple) and (labels := _labels(value, scope)) is not None:
                scope.lists[name] = labels
    return scope


def metric_definitions(source: str) -> dict[str, list[Label] | None]:
    """metric name -> its label names (None where they could not be evaluated)."""
    tree = ast.parse(source)
    attrs = _self_strings(tree)
    out: dict[str, list[Label] | None] = {}
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        scope = _function_scope(func, attrs)
        for call in ast.walk(func):
            if not isinstance(call, ast.Call):
                continue
            keywords = {k.arg: k.value for k in call.keywords if k.arg}
            if "name" not in keywords or "documentation" not in keywords:
                continue
            name = _str(keywords["name"], scope)
            if name is not None and name not in out:
                out[name] = _labels(keywords.get("labelnames"), scope)
    return out


def class_fields(source: str, class_name: str) -> list[str]:
    """The annotated attributes of `class_name` (a dataclass's fields, private ones too)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
    raise LookupError(f"class {class_name} not found")


def dict_keys_assigned(source: str, variable: str, must_have: str) -> tuple[list[str], list[str]]:
    """(keys of the dict literal assigned to `variable` that has key `must_have`, keys set
    later by `variable["k"] = ...`): a label dict built in code, and its optional labels."""
    base: list[str] = []
    optional: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == variable and isinstance(node.value, ast.Dict):
            keys = [
                k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
            if must_have in keys:
                base = keys
        elif (
            isinstance(target, ast.Subscript)
            and isinstance(target.value, ast.Name)
            and target.value.id == variable
            and isinstance(target.slice, ast.Constant)
            and isinstance(target.slice.value, str)
        ):
            optional.append(target.slice.value)
    return base, sorted(set(optional) - set(base))


# -- the page each engine would serve, and what our parser must read from it -------------
def _series(name: str, labels: dict[str, str], value: float) -> str:
    block = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{block}}} {value}"


def _resolved(labels: list[Label] | None, placeholders: dict[str, list[str]]) -> list[str]:
    if labels is None:
        raise LookupError("label names not evaluable from the source")
    out: list[str] = []
    for label in labels:
        out += placeholders[label.source] if isinstance(label, Placeholder) else [label]
    return out


def _check_names(check: Check, engine: str, defs: dict[str, list[Label] | None]) -> None:
    dialect = DIALECTS[engine]
    for what, names in (
        ("waiting", dialect.waiting),
        ("running", dialect.running),
        ("KV usage", dialect.kv_usage),
    ):
        if not names:
            continue
        primary, *aliases = names
        check.expect(
            primary in defs, f"{engine} {what}: `{primary}` is defined", f"absent from {len(defs)} metrics"
        )
        for alias in aliases:
            check.saw(
                f"{engine} {what}: alias `{alias}` {'also defined' if alias in defs else 'not defined (an older release name)'}"
            )
    for info in (dialect.lora_info, dialect.cache_info):
        if info is not None:
            check.expect(info in defs, f"{engine} info series `{info}` is defined")


def _show(values: dict[str, object]) -> str:
    """`values` with sets sorted, so the report reads the same on every run."""
    return repr({k: sorted(v) if isinstance(v, frozenset) else v for k, v in values.items()})


def _check_parse(check: Check, engine: str, page: list[str], want: dict[str, object], how: str = "") -> None:
    metrics: Metrics = parse_metrics("\n".join(page) + "\n", engine, 0.0)
    got = {k: getattr(metrics, k) for k in want}
    what = f"{engine}: the EPP's parser reads {_show(want)} from a page of these series{how}"
    check.expect(got == want, what, _show(got))


def check_vllm(site: Path, check: Check) -> None:
    loggers = site / "vllm" / "v1" / "metrics" / "loggers.py"
    defs = metric_definitions(loggers.read_text())
    check.saw(f"vllm/v1/metrics/loggers.py: {len(defs)} metric definitions read")
    _check_names(check, "vllm", defs)
    cache_fields = class_fields((site / "vllm" / "config" / "cache.py").read_text(), "CacheConfig")
    # log_metrics_info: labels = CacheConfig.metrics_info() (every field) + "engine".
    placeholders = {"metrics_info": [*cache_fields, "engine"]}
    d = DIALECTS["vllm"]
    core = {n: _resolved(defs.get(n), placeholders) for n in (d.waiting[0], d.running[0], d.kv_usage[0])}
    for name, labels in core.items():
        check.expect(
            labels == ["model_name", "engine"],
            f"`{name}` labels {labels}: one series per model and DP engine, which the dialect aggregates",
        )
    assert d.lora_info is not None and d.cache_info is not None
    lora = _resolved(defs.get(d.lora_info), placeholders)
    check.expect(
        set(lora) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"},
        f"`{d.lora_info}` labels {lora}",
    )
    cache = _resolved(defs.get(d.cache_info), placeholders)
    check.expect(
        {"block_size", "num_gpu_blocks"} <= set(cache),
        f"`{d.cache_info}` labels include block_size, num_gpu_blocks ({len(cache)} labels)",
    )
    # Two data-parallel engines of one model: counts sum, KV fractions average.
    page = []
    for engine, (waiting, running, kv) in enumerate(((3, 2, 0.25), (4, 1, 0.75))):
        series = {"model_name": "m", "engine": str(engine)}
        page += [_series(d.waiting[0], series, waiting), _series(d.running[0], series, running)]
        page.append(_series(d.kv_usage[0], series, kv))
    page.append(
        _series(
            d.lora_info, {"max_lora": "4", "waiting_lora_adapters": "c", "running_lora_adapters": "a,b"}, 1.0
        )
    )
    info = {label: "None" for label in cache if label != "engine"} | {
        "block_size": "16",
        "num_gpu_blocks": "1000",
        "engine": "0",
    }
    page.append(_series(d.cache_info, info, 1.0))
    _check_parse(
        check,
        "vllm",
        page,
        {"waiting": 7.0, "running": 3.0, "kv_usage": 0.5, "running_adapters": frozenset({"a", "b"}),
         "waiting_adapters": frozenset({"c"}), "max_lora": 4, "block_size": 16, "num_gpu_blocks": 1000},
    )  # fmt: skip


def check_sglang(site: Path, check: Check) -> None:
    path = site / "sglang" / "srt" / "observability" / "metrics_collector.py"
    source = path.read_text()
    defs = metric_definitions(source)
    check.saw(f"sglang/srt/observability/metrics_collector.py: {len(defs)} metric definitions read")
    _check_names(check, "sglang", defs)
    base, optional = dict_keys_assigned(source, "labels", "model_name")
    check.saw(f"SchedulerMetricsCollector labels: {base}, optional {optional}")
    d = DIALECTS["sglang"]
    for name in (d.waiting[0], d.running[0], d.kv_usage[0]):
        check.expect(
            defs.get(name) == [Placeholder("labels")], f"`{name}` is labelled by the collector's labels dict"
        )
    labels = dict.fromkeys(base, "0") | {"model_name": "m", "engine_type": "unified"}
    page = [
        _series(d.waiting[0], labels, 5),
        _series(d.running[0], labels, 4),
        _series(d.kv_usage[0], labels, 0.5),
    ]
    _check_parse(check, "sglang", page, {"waiting": 5.0, "running": 4.0, "kv_usage": 0.5}, " (one rank)")
    # --enable-priority-scheduling: _log_gauge_queue_count writes the total under priority=""
    # and each priority's count under priority="<p>" (read from the same file).
    check.expect(
        "priority" in optional and "def _log_gauge_queue_count" in source,
        "the priority label and its breakdown writer exist",
    )
    with_priority = labels | {"priority": ""}
    page = [_series(d.waiting[0], with_priority, 5), _series(d.running[0], with_priority, 4)]
    page += [_series(d.waiting[0], labels | {"priority": str(p)}, v) for p, v in ((0, 2), (1, 3))]
    page += [_series(d.running[0], labels | {"priority": str(p)}, v) for p, v in ((0, 4), (1, 0))]
    page.append(_series(d.kv_usage[0], with_priority, 0.5))
    how = ' (priority scheduling: totals under priority="" beside each priority\'s count)'
    _check_parse(check, "sglang", page, {"waiting": 5.0, "running": 4.0, "kv_usage": 0.5}, how)


# TensorRT-LLM: tensorrt_llm/metrics/collector.py of NVIDIA/TensorRT-LLM, read at commit
# 050f80def8df236e326949c8bd9dee10fd896a83 (MetricsCollector.__init__): each metric is
# Gauge(name=self.metric_prefix + "<name>", labelnames=self.labels.keys()) with
# metric_prefix "trtllm_"; log_iteration_stats sets num_requests_running from
# numActiveRequests, num_requests_waiting from numQueuedRequests and kv_cache_utilization to
# usedNumBlocks / maxNumBlocks (a 0..1 fraction). The labels are the collector's `labels`
# dict (its docstring's example: model_name, engine_type).
TRTLLM_SOURCE = (
    "NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py @ 050f80def8df236e326949c8bd9dee10fd896a83"
)
TRTLLM_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_utilization")


def check_trtllm(check: Check) -> None:
    defs: dict[str, list[Label] | None] = {f"trtllm_{n}": [Placeholder("self.labels")] for n in TRTLLM_GAUGES}
    check.saw(f"as read from {TRTLLM_SOURCE} (no TensorRT-LLM wheel installed): {sorted(defs)}")
    _check_names(check, "trtllm", defs)
    d = DIALECTS["trtllm"]
    labels = {"model_name": "m", "engine_type": "trtllm"}
    page = [
        _series(d.waiting[0], labels, 6),
        _series(d.running[0], labels, 2),
        _series(d.kv_usage[0], labels, 0.4),
    ]
    _check_parse(check, "trtllm", page, {"waiting": 6.0, "running": 2.0, "kv_usage": 0.4})
