import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datalayer.prefix_index import APPROX_BYTES_PER_ENTRY, PrefixIndex, prompt_hashes


def test_chained_hashes_follow_the_documented_formula():
    prompt = "a" * 64 + "b" * 64 + "c" * 10  # two full blocks, tail ignored
    h0 = xxhash.xxh64_intdigest(b"llama")
    h1 = xxhash.xxh64_intdigest(b"a" * 64, h0)
    h2 = xxhash.xxh64_intdigest(b"b" * 64, h1)
    assert prompt_hashes("llama", prompt) == (h1, h2)


def test_hash_names_the_whole_prefix_and_the_model():
    a = prompt_hashes("m", "x" * 64 + "same block" * 7)
    b = prompt_hashes("m", "y" * 64 + "same block" * 7)
    assert a[1] != b[1]  # same second block, different history
    assert prompt_hashes("m1", "z" * 128) != prompt_hashes("m2", "z" * 128)


def test_block_cap_bounds_huge_prompts():
    assert len(prompt_hashes("m", "q" * 200_000)) == 256
    assert len(prompt_hashes("m", "q" * 200_000, block_chars=128, max_blocks=10)) == 10
    with pytest.raises(ValueError):
        prompt_hashes("m", "q", block_chars=0)


def test_hashing_a_200kb_prompt_reads_only_the_capped_head():
    """The work per request is bounded by the block cap, whatever the prompt's size: the
    hashes depend on the first 256 x 64 characters only (speed is measured in bench/)."""
    prompt = "lorem ipsum dolor sit amet " * 8000
    head = prompt[: 256 * 64]
    assert prompt_hashes("m", prompt) == prompt_hashes("m", head + "a different tail" * 999)


def test_match_counts_consecutive_leading_blocks():
    index = PrefixIndex()
    hashes = prompt_hashes("m", "".join(chr(65 + i % 26) * 64 for i in range(10)))
    index.add("a", hashes[:4] + hashes[5:])
    assert index.match(hashes, "a") == 4
    assert index.match(hashes, "unknown") == 0
    assert index.match_counts(hashes, ["a", "b"]) == [4, 0]


def test_lru_is_bounded_and_evicts_tail_blocks_first():
    index = PrefixIndex(capacity_per_pod=10)
    old = prompt_hashes("m", "o" * 64 * 8)
    new = prompt_hashes("m", "n" * 64 * 8)
    index.add("a", old)
    index.add("a", new)
    assert index.memory_entries() == 10
    assert index.match(new, "a") == 8
    assert index.match(old, "a") == 2  # its leading blocks were the most recently used


def test_re_adding_refreshes_entries():
    index = PrefixIndex(capacity_per_pod=4)
    x, y = prompt_hashes("m", "x" * 128), prompt_hashes("m", "y" * 128)
    index.add("a", x)
    index.add("a", y)
    index.add("a", x)  # refresh x, then a new prompt evicts y, not x
    index.add("a", prompt_hashes("m", "z" * 128))
    assert index.match(x, "a") == 2 and index.match(y, "a") == 0


def test_retain_drops_departed_pods_and_memory_is_reported():
    index = PrefixIndex()
    hashes = prompt_hashes("m", "k" * 640)
    for pod in ("a", "b", "c"):
        index.add(pod, hashes)
    index.retain(["a", "c"])
    assert index.match_counts(hashes, ["a", "b", "c"]) == [10, 0, 10]
    assert index.approx_bytes() == 20 * APPROX_BYTES_PER_ENTRY
    index.retain(["c"])
    assert index.memory_entries() == 10


def test_invalid_construction():
    with pytest.raises(ValueError):
        PrefixIndex(capacity_per_pod=0)


def test_adapter_keys_the_hashes_like_vllm_does():
    prompt = "shared system prompt " * 20
    base = prompt_hashes("m", prompt)
    sql, support = prompt_hashes("m", prompt, adapter="sql"), prompt_hashes("m", prompt, adapter="support")
    assert len({base[0], sql[0], support[0]}) == 3  # not a single block in common
    assert set(base).isdisjoint(sql) and set(sql).isdisjoint(support)
    assert sql == PrefixIndex().hashes("m", prompt, adapter="sql")
    h0 = xxhash.xxh64_intdigest(b"sql", xxhash.xxh64_intdigest(b"m"))
    assert sql[0] == xxhash.xxh64_intdigest(prompt[:64].encode(), h0)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 5), st.integers(1, 12), st.booleans()
        ),
        max_size=30,
    ),
    capacity=st.integers(1, 40),
    query=st.tuples(st.integers(0, 5), st.integers(1, 12)),
)
def test_match_counts_equals_walking_each_pods_lru(ops, capacity, query):
    """The reverse map stays in step with the LRUs through adds, evictions and departures,
    and answers exactly what a per-pod walk does; also with gaps (the slow fallback)."""
    index = PrefixIndex(capacity_per_pod=capacity)

    def chain(topic: int, blocks: int) -> tuple[int, ...]:
        # topics share their first 3 blocks: prefixes overlap across prompts and pods
        return prompt_hashes("m", ("s" * 64 * 3 + chr(97 + topic) * 64 * 20)[: 64 * blocks])

    for pod, topic, blocks, gap in ops:
        hashes = chain(topic, blocks)
        if gap and len(hashes) > 2:
            hashes = hashes[:1] + hashes[2:]  # not prefix-closed: must still be answered exactly
        index.add(pod, hashes)
        if topic == 5:
            index.retain(["a", "b", "c"])
    pods = ["a", "b", "c", "d", "gone"]
    hashes = chain(*query)
    assert index.match_counts(hashes, pods) == [index.match(hashes, p) for p in pods]
    held = {h: {p for p, lru in index._pods.items() if h in lru} for lru in index._pods.values() for h in lru}
    assert {h: ({v} if isinstance(v, str) else v) for h, v in index._holders.items()} == held


def test_a_pods_lru_is_bounded_by_its_kv_cache() -> None:
    idx = PrefixIndex(capacity_per_pod=100)
    old, new = list(range(1, 61)), list(range(101, 161))
    idx.add("a", old)
    idx.add("b", old)
    idx.set_capacity("a", 80)  # a's KV holds 80 blocks: the newer prompt pushes out the older's tail
    idx.add("a", new)
    assert idx.capacity("a") == 80 and idx.capacity("b") == 100
    assert idx.match(new, "a") == 60 and idx.match(old, "a") == 20
    assert idx.match_counts(old, ["a", "b"]) == [20, 60]
    idx.set_capacity("a", 10)  # shrinking trims at once, oldest first
    assert idx.match(new, "a") == 10 and idx.match(old, "a") == 0
    idx.set_capacity("a", 10**9)  # never above the index's own bound
    assert idx.capacity("a") == 100
    idx.set_capacity("b", 5)
    idx.retain(["a"])
    assert idx.capacity("b") == 100  # a departed pod's bound is forgotten with it
