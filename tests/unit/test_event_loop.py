"""`--event-loop`: the services run on uvloop when it is installed, asyncio's loop otherwise."""

import asyncio
import sys

import pytest

from gateway.service_cli import add_event_loop_argument, event_loop_factory, run_service, service_parser


def _loop_type(argv: list[str]) -> str:
    parser = service_parser("x", "x", default_port=1, config_required=False)
    add_event_loop_argument(parser)
    seen: list[str] = []

    async def serve(_args: object) -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    run_service(serve, parser.parse_args(argv))
    return seen[0]


def test_uvloop_by_default_and_asyncio_on_request() -> None:
    pytest.importorskip("uvloop")
    assert _loop_type([]).startswith("uvloop")
    assert _loop_type(["--event-loop", "asyncio"]).startswith("asyncio")


def test_without_uvloop_installed_the_default_falls_back_to_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert event_loop_factory("uvloop") is None
    assert _loop_type([]).startswith("asyncio")


def test_a_service_without_the_option_keeps_asyncio() -> None:
    parser = service_parser("x", "x", default_port=1, config_required=False)
    seen: list[str] = []

    async def serve(_args: object) -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    run_service(serve, parser.parse_args([]))
    assert seen[0].startswith("asyncio")
