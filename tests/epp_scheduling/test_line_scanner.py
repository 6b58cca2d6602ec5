"""Edges of the wanted-line scanner in epp/datalayer/metric_dialects.py (trie pattern, fast value path, cached
info labels), checked against a plain line-by-line reading of the same page."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.micro.metric_pages import PageSpec, vllm_page
from epp.datalayer.metric_dialects import Rejection, parse_metrics
from epp.datalayer.metric_lines import MetricsParseError, Sample, collect_samples


def line_by_line(page: str, names: tuple[str, ...]) -> dict[str, list[Sample]]:
    """The documented semantics, the slow way: every line that starts with a wanted name
    followed by `{`, a space or a tab; labels up to the last `}`; the value is the first
    field after them."""
    out: dict[str, list[Sample]] = {}
    for line in page.split("\n"):
        for name in names:
            rest = line[len(name) :]
            if line.startswith(name) and rest[:1] in ("{", " ", "\t"):
                labels = ""
                if rest.startswith("{"):
                    close = rest.rfind("}")
                    labels, rest = rest[1:close], rest[close + 1 :]
                out.setdefault(name, []).append(Sample(labels, float(rest.split()[0])))
    return out


def test_a_wanted_name_that_is_a_prefix_of_another_wanted_name() -> None:
    names = ("m", "m_sum", "m_su", "mx")
    page = 'm_sum 1\nm 2\nm_su{a="b"} 3\nm_summary 4\nmx 5\nm_s 6\nmx_total 7\n'
    assert collect_samples(page, names) == line_by_line(page, names)
    assert collect_samples(page, names) == {
        "m_sum": [Sample("", 1.0)],
        "m": [Sample("", 2.0)],
        "m_su": [Sample('a="b"', 3.0)],
        "mx": [Sample("", 5.0)],
    }


def test_a_wanted_line_at_the_very_start_of_the_page_counts_once() -> None:
    for page in ("vllm:num_requests_waiting 4\nvllm:num_requests_waiting 1\n", "vllm:num_requests_waiting 5"):
        found = collect_samples(page, ("vllm:num_requests_waiting",))["vllm:num_requests_waiting"]
        assert found is not None and sum(s.value for s in found) == 5
    assert collect_samples("\nvllm:num_requests_waiting 5\n", ("vllm:num_requests_waiting",)) == {
        "vllm:num_requests_waiting": [Sample("", 5.0)]
    }
    assert collect_samples("# HELP vllm:num_requests_waiting x\n", ("vllm:num_requests_waiting",)) == {}


def test_crlf_lines_tabs_timestamps_and_braces_inside_label_values() -> None:
    names = ("vllm:num_requests_waiting", "vllm:num_requests_running")
    page = (
        'vllm:num_requests_waiting{model_name="a} b"} 2\r\n'  # "} " inside a value
        'vllm:num_requests_waiting{model_name="c"}\t3\r\n'
        'vllm:num_requests_running{m="}"} 4 1700000000000\r\n'
        "vllm:num_requests_running 5\r\n"
    )
    got = collect_samples(page, names)
    assert got == line_by_line(page, names)
    assert got["vllm:num_requests_waiting"] == [
        Sample('model_name="a} b"', 2.0),
        Sample('model_name="c"', 3.0),
    ]
    assert parse_metrics(page.encode(), "vllm", 0.0).running == 9.0


def test_a_malformed_wanted_line_is_an_error_and_a_lenient_one_only_drops_its_metric() -> None:
    with pytest.raises(MetricsParseError, match="bad sample value"):
        collect_samples('a 1\na{x="y"} nope\n', ("a",))
    got = collect_samples('a 1\nb 2\nb{x="y"} 1 2 3\nb 4\n', ("a", "b"), lenient=("b",))
    assert got == {"a": [Sample("", 1.0)], "b": None}


@pytest.mark.parametrize("spec", [PageSpec(), PageSpec(histogram_models=3, legacy_kv_name=True)])
def test_generated_vllm_pages_agree_with_the_line_by_line_reading(spec: PageSpec) -> None:
    names = (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_to_first_token_seconds_bucket",
    )
    page = vllm_page(spec)
    assert collect_samples(page, names) == line_by_line(page.decode(), names)


_NAME = st.sampled_from(["a", "a_b", "ab", "a_bc", "b"])


@given(
    st.lists(
        st.tuples(
            _NAME,
            st.sampled_from(["", '{x="1"}', '{x="} "}']),
            st.sampled_from([" ", "\t"]),
            st.integers(0, 99),
        ),
        max_size=12,
    ),
    st.sampled_from(["\n", "\r\n"]),
)
def test_any_page_of_well_formed_lines_agrees_with_the_line_by_line_reading(
    lines: list[tuple[str, str, str, int]], newline: str
) -> None:
    page = newline.join(f"{n}{labels}{sep}{v}" for n, labels, sep, v in lines)
    names = ("a", "a_b", "ab")
    assert collect_samples(page, names) == line_by_line(page, names)


def test_remembered_info_labels_still_report_their_rejections_every_scrape() -> None:
    page = (
        'vllm:num_requests_waiting 1\nvllm:lora_requests_info{max_lora="inf",running_lora_adapters="a"} 1\n'
    )
    for _ in range(3):
        rejected: list[Rejection] = []
        m = parse_metrics(page, "vllm", 0.0, rejected=rejected)
        assert (m.max_lora, m.running_adapters) == (0, frozenset({"a"}))
        assert [(r.field, r.reason) for r in rejected] == [("max_lora", "non_finite")]
