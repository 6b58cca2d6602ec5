"""The EPP's name for the shared configuration schema.

The scheduling section (`profiles`, `thresholds`, `defaultProfile`) used to be typed here, in
a subclass BBR did not load, so BBR applied files the EPPs rejected. It is now part of
`gateway.config.GatewayConfig` (typed by gateway/profiles.py), which every service validates
with; `EppConfig` stays as the EPP's spelling of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig, load_config, parse_config

EppConfig = GatewayConfig


def parse_epp_config(data: Any) -> EppConfig:
    return parse_config(data, EppConfig)


def load_epp_config(path: str | Path) -> EppConfig:
    return load_config(path, EppConfig)
