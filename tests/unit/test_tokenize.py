"""epp/datalayer/tokenizer.py: chat templates rendered as vLLM renders them, the piece cache equal to a
full tokenization, bad tokenizer folders, and modelsim tokenizing with the same files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import epp.datalayer.tokenizer
from epp.datalayer.tokenizer import (
    OFFLOAD_CHARS,
    PoolTokenizers,
    TokenizeError,
    TokenizerLoadError,
    load_tokenizer,
)
from modelsim.build_tokenizer import CHAT_TEMPLATE, OUT
from modelsim.tokenizer import HFTokenizer

SHIPPED = OUT  # modelsim/tokenizer_files/sim-llama3-12k
TEXT = (Path(__file__).resolve().parents[2] / "docs" / "scheduling.md").read_text()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(SHIPPED)


def _conversation(turns: int, chars: int = 600) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a terse assistant.  "}]
    for i in range(turns):
        start = (i * chars) % (len(TEXT) - chars)
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": TEXT[start : start + chars]})
    return msgs


def test_template_renders_llama3_style_with_generation_prompt(tok) -> None:
    text = tok.render_chat([{"role": "user", "content": "  Hi  "}])
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tok.encode_chat([{"role": "user", "content": "  Hi  "}])
    assert ids[0] == tok.tokenizer.token_to_id("<|begin_of_text|>")  # written by the template once
    assert ids.count(ids[0]) == 1
    # text parts are joined with newlines, as vLLM's string content format does
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "b"},
    ]
    assert tok.render_chat([{"role": "user", "content": parts}]) == tok.render_chat(
        [{"role": "user", "content": "a\nb"}]
    )


def test_cached_pieces_equal_full_tokenization_as_a_conversation_grows(tok) -> None:
    assert tok.segmented
    msgs = _conversation(1)
    for turns in range(1, 12):
        msgs = _conversation(turns)
        misses = tok.misses
        ids = tok.encode_chat(msgs)
        assert ids == tok.encode_full(tok.render_chat(msgs))
        if turns > 2:  # only the new message (and nothing already seen) is tokenized
            assert tok.misses - misses == 1
    hits = tok.hits
    assert tok.encode_chat(msgs) == tok.encode_full(tok.render_chat(msgs))
    assert tok.hits > hits and tok.stats()["cache_tokens"] > 0


def test_whitespace_and_unicode_edges_equal_full_tokenization(tok) -> None:
    for content in ["", " ", "\n\n", "ünï 😀 code", "a<|eot_id|>b", "<|eot_id|>", "x" * 5000, "1234567"]:
        msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": content + " ok"}]
        assert tok.encode_chat(msgs) == tok.encode_full(tok.render_chat(msgs)), repr(content)


def test_huge_prompts_are_cut_to_an_exact_leading_part(tok, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(epp.datalayer.tokenizer, "MAX_CHARS", 3000)
    msgs = [{"role": "user", "content": TEXT[:2000]}, {"role": "assistant", "content": TEXT[2000:6000]}]
    full = tok.encode_full(tok.render_chat(msgs))
    ids = tok.encode_chat(msgs)
    assert 500 < len(ids) < len(full) and ids == full[: len(ids)]
    prompt = TEXT[:9000]
    cut = tok.encode_prompt(prompt)
    reference = tok.encode_full(prompt, add_special_tokens=True)
    assert 500 < len(cut) < len(reference) and cut == reference[: len(cut)]


def test_cache_is_bounded_and_stays_correct_when_evicting() -> None:
    small = load_tokenizer(SHIPPED, cache_tokens=300)
    for turns in range(1, 8):
        msgs = _conversation(turns, chars=400)
        assert small.encode_chat(msgs) == small.encode_full(small.render_chat(msgs))
        assert small.stats()["cache_tokens"] <= 300


async def test_long_new_text_is_tokenized_off_the_loop_and_equal(tok) -> None:
    msgs = [{"role": "user", "content": TEXT[: OFFLOAD_CHARS * 3]}]
    pool = PoolTokenizers()
    pool.configure([("m", str(SHIPPED))])
    ids = await pool.token_ids("m", {"messages": msgs})
    assert ids is not None and list(ids) == tok.encode_full(tok.render_chat(msgs))
    prompt = TEXT[: OFFLOAD_CHARS * 2]
    assert await pool.token_ids("m", {"prompt": prompt}) == tuple(tok.encode_prompt(prompt))
    assert await pool.token_ids("m", {"prompt": [prompt]}) == tuple(tok.encode_prompt(prompt))
    assert await pool.token_ids("m", {"prompt": [5, 6, 7]}) == (5, 6, 7)
    assert tok.encode_prompt("hi")[0] == tok.tokenizer.token_to_id("<|begin_of_text|>")  # BOS added


async def test_requests_the_tokenizer_cannot_take_give_no_ids(tok) -> None:
    pool = PoolTokenizers()
    pool.configure([("m", str(SHIPPED)), ("plain", None)])
    assert await pool.token_ids("plain", {"prompt": "x"}) is None  # no tokenizer configured
    assert await pool.token_ids("other", {"prompt": "x"}) is None
    for body in (
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": "\ud800"}]},
        {"prompt": ["a", "b"]},  # a batch: no single prompt
        {"prompt": [1, True]},
        {"input": "embeddings"},
    ):
        assert await pool.token_ids("m", body) is None, body
    assert pool.failures >= 5
    with pytest.raises(TokenizeError):
        tok.encode_chat([{"role": "user", "content": {"x": 1}}])


def _copy(tmp_path: Path, **config_changes: object) -> Path:
    folder = tmp_path / "tok"
    shutil.copytree(SHIPPED, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def test_bad_tokenizer_folders_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path / "missing")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="not a tokenizer"):
        load_tokenizer(broken)
    bad_config = _copy(tmp_path)
    (bad_config / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(TokenizerLoadError, match="JSON object"):
        load_tokenizer(bad_config)
    shutil.rmtree(bad_config)
    with pytest.raises(TokenizerLoadError, match="does not compile"):
        load_tokenizer(_copy(tmp_path, chat_template="{% for %}"))


def test_template_variants(tmp_path: Path) -> None:
    # no chat template: completions still tokenize, chat requests get no ids
    plain = load_tokenizer(_copy(tmp_path, chat_template=None))
    assert plain.encode_prompt("hello") and plain.template is None
    with pytest.raises(TokenizeError, match="no chat template"):
        plain.encode_chat([{"role": "user", "content": "x"}])
    shutil.rmtree(tmp_path / "tok")
    # named templates (a list), the default one used; raise_exception is a clean error
    named = [
        {"name": "tool_use", "template": "x"},
        {"name": "default", "template": "{{ raise_exception('only user turns') }}"},
    ]
    strict = load_tokenizer(_copy(tmp_path, chat_template=named))
    with pytest.raises(TokenizeError, match="only user turns"):
        strict.encode_chat([{"role": "user", "content": "x"}])
    shutil.rmtree(tmp_path / "tok")
    # transformers' tojson: no HTML escaping, non-ASCII kept
    as_json = load_tokenizer(_copy(tmp_path, chat_template="{{ messages | tojson }}"))
    assert as_json.render_chat([{"role": "user", "content": "<a & 'b' ü>"}]) == (
        '[{"role": "user", "content": "<a & \'b\' ü>"}]'
    )
    shutil.rmtree(tmp_path / "tok")
    # the sandbox refuses attribute tricks instead of running them
    evil = load_tokenizer(_copy(tmp_path, chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}"))
    with pytest.raises(TokenizeError):
        evil.encode_chat([{"role": "user", "content": "x"}])


def test_pool_tokenizers_fall_back_per_model_and_keep_loaded_ones(tmp_path: Path) -> None:
    pool = PoolTokenizers()
    pool.configure([("good", str(SHIPPED)), ("bad", str(tmp_path / "nowhere")), ("none", None)])
    good = pool.get("good")
    assert good is not None and pool.get("bad") is None and pool.get("none") is None
    debug = pool.debug()["models"]
    assert debug["good"]["loaded"] and debug["good"]["segmented_cache"]
    assert not debug["bad"]["loaded"] and "no tokenizer.json" in debug["bad"]["error"]
    assert "none" not in debug
    pool.configure([("good", str(SHIPPED))])
    assert pool.get("good") is good  # same path: the loaded tokenizer and its cache stay
    assert pool.get("bad") is None and "bad" not in pool.debug()["models"]


def test_modelsim_tokenizes_with_the_same_files_identically(tok) -> None:
    sim = HFTokenizer("sim-llama3-12k")  # a shipped name
    assert sim.template.environment.trim_blocks
    for turns in (1, 4, 9):
        msgs = _conversation(turns)
        assert sim.encode_chat(msgs) == tok.encode_chat(msgs)
    assert sim.encode_text("plain prompt") == tok.encode_prompt("plain prompt")
    assert json.loads((SHIPPED / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
