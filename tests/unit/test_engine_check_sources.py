"""devstack.engine_check reads metric definitions out of an engine's source: the shapes vLLM's,
SGLang's and TensorRT-LLM's code use (make check-engines runs it on the real files)."""

from __future__ import annotations

from devstack.engine_check.metric_sources import (
    Placeholder,
    class_fields,
    dict_keys_assigned,
    metric_definitions,
)

SOURCE = """
class Logger:
    def __init__(self, labels):
        labelnames = ["model_name", "engine"]
        self.metric_prefix = "x_"
        self.labelname_max = "max_lora"
        self.a = Gauge(name="e:a", documentation="", labelnames=labelnames)
        self.b = Gauge(name="e:b", documentation="", labelnames=labelnames + ["reason"])
        self.c = Gauge(name=self.metric_prefix + "c", documentation="", labelnames=labels.keys())
        self.d = Gauge(name="e:d", documentation="", labelnames=[self.labelname_max, *labels.keys()])
        self.e = Gauge(name="e:e", documentation="", labelnames=make())
        ignored = Something(name="e:f")

    def info(self, info):
        name = None
        if True:
            name = "e:info"
        Gauge(name=name, documentation="", labelnames=info.keys())

def build():
    labels = {"model_name": "m", "tp_rank": 0}
    if priority:
        labels["priority"] = ""

class Config:
    block_size: int = 16
    num_gpu_blocks: int | None = None
    def metrics_info(self):
        return {}
"""


def test_names_and_label_sets_are_evaluated_or_left_as_placeholders() -> None:
    assert metric_definitions(SOURCE) == {
        "e:a": ["model_name", "engine"],
        "e:b": ["model_name", "engine", "reason"],
        "x_c": [Placeholder("labels")],
        "e:d": ["max_lora", Placeholder("labels")],
        "e:e": None,  # not evaluable: reported, never guessed
        "e:info": [Placeholder("info")],
    }


def test_label_dicts_and_dataclass_fields() -> None:
    assert dict_keys_assigned(SOURCE, "labels", "model_name") == (["model_name", "tp_rank"], ["priority"])
    assert class_fields(SOURCE, "Config") == ["block_size", "num_gpu_blocks"]
