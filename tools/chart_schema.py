"""The Helm chart's schema for its `config` value, generated from the configuration models.

`config` in deploy/helm/inference-gateway/values.yaml is the gateway configuration file, so
Helm checks it (install, upgrade, lint) against the JSON Schema of the very pydantic models the
services parse it with, instead of a second hand-written copy: `python -m tools.chart_schema`
rewrites `properties.config` and `$defs` of the chart's values.schema.json (the rest of that
file is written by hand), and a test fails when the committed file drifts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gateway import plugin_catalogue
from gateway.config import GatewayConfig

SCHEMA_PATH = Path("deploy/helm/inference-gateway/values.schema.json")


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the schema of `config`, its `$defs`); the `$ref`s point at the document's root `$defs`."""
    schema = GatewayConfig.model_json_schema(by_alias=True)
    defs = schema.pop("$defs")
    schema.pop("title", None)
    # A validator, not a type, rejects unknown scorer names: say it in the schema too, so a
    # misspelt weight fails at `helm install`, not at the EPP's reload.
    defs["Profile"]["properties"]["weights"]["propertyNames"] = {
        "enum": sorted(plugin_catalogue.names("scorer"))
    }
    return schema, defs


def with_config_schema(values_schema: dict[str, Any]) -> dict[str, Any]:
    """`values_schema` with its generated parts replaced."""
    config, defs = config_schema()
    out = dict(values_schema)
    out["properties"] = {**values_schema["properties"], "config": config}
    out["$defs"] = defs
    return out


def render(text: str) -> str:
    return json.dumps(with_config_schema(json.loads(text)), indent=2) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.chart_schema", description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", type=Path, default=SCHEMA_PATH, help=f"default {SCHEMA_PATH}")
    target: Path = ap.parse_args(argv).target
    target.write_text(render(target.read_text()))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
