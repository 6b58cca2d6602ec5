"""A tiny llama-architecture GGUF for llama-server, written here: random weights, our tokenizer.

The weights are seeded random numbers (the output is gibberish; what matters for routing is
the engine's real tokenization, KV cache, prompt cache and batching). The vocabulary is the
repository's own byte-level BPE (modelsim/tokenizer_files/sim-llama3-12k, Llama-3 style
pre-tokenizer, `python -m modelsim.build_tokenizer`), written into the GGUF as a `gpt2`-model
tokenizer with the `llama-bpe` pre-tokenizer, so llama-server computes the same token ids as
the EPP and the simulator do from that tokenizer.json, and the chat template is the same.

Size: 4 layers of width 256 (4 query heads, 2 KV heads of 64, FFN 768; ~10 M parameters, ~20 MB
in F16). On one core of this class of machine a prompt token costs ~0.2 ms to prefill and an
output token a few ms, so a short request answers in milliseconds while a 2,000-token prompt
costs visibly more when its prefix is not cached (docs/llamacpp.md has the measured figures).

`python -m devstack.llamacpp.model --out PATH` writes it; the same arguments give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devstack.llamacpp.build import DEFAULT_CACHE

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "modelsim" / "tokenizer_files" / "sim-llama3-12k"
DEFAULT_MODEL = DEFAULT_CACHE / "models" / "tiny-llama.gguf"
MODEL_NAME = "tiny-llama"


@dataclass(frozen=True)
class Shape:
    """The transformer's dimensions (llama: RMSNorm, RoPE, SwiGLU FFN, grouped-query attention)."""

    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 768
    n_ctx_train: int = 16384


@dataclass(frozen=True)
class Vocab:
    """A Hugging Face byte-level BPE tokenizer as the GGUF tokenizer keys want it."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int
    chat_template: str


def load_vocab(tokenizer_dir: Path = TOKENIZER_DIR) -> Vocab:
    """Tokens by id, CONTROL for the special (added) tokens, merges as "a b" strings."""
    import gguf

    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    model = spec["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{tokenizer_dir}: a BPE tokenizer is needed, found {model.get('type')}")
    by_id = {i: tok for tok, i in model["vocab"].items()}
    special = {t["id"]: t["content"] for t in spec.get("added_tokens", []) if t.get("special")}
    by_id.update(special)
    size = max(by_id) + 1
    if len(by_id) != size:
        raise ValueError(f"{tokenizer_dir}: token ids are not contiguous 0..{size - 1}")
    tokens = [by_id[i] for i in range(size)]
    types = [int(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL) for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    ids = {tok: i for i, tok in enumerate(tokens)}
    return Vocab(
        tokens=tokens,
        types=types,
        merges=merges,
        bos_id=ids[config["bos_token"]],
        eos_id=ids[config["eos_token"]],
        chat_template=config["chat_template"],
    )


def write_model(
    out: Path, shape: Shape = Shape(), seed: int = 0, tokenizer_dir: Path = TOKENIZER_DIR
) -> None:
    """Write the GGUF to `out` (via a temporary file, so a half-written model is never loaded)."""
    import gguf

    vocab = load_vocab(tokenizer_dir)
    rng = np.random.default_rng(seed)
    head_dim = shape.n_embd // shape.n_head
    kv_width = head_dim * shape.n_head_kv

    def matrix(rows: int, cols: int) -> np.ndarray:
        # numpy's (rows, cols) is ggml's ne = [cols, rows]: `cols` is the input width.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(out.suffix + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name(MODEL_NAME)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(len(vocab.tokens))
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(True)
    writer.add_chat_template(vocab.chat_template)

    n_vocab = len(vocab.tokens)
    writer.add_tensor("token_embd.weight", matrix(n_vocab, shape.n_embd))
    for b in range(shape.n_layer):
        writer.add_tensor(f"blk.{b}.attn_norm.weight", ones(shape.n_embd))
        writer.add_tensor(f"blk.{b}.attn_q.weight", matrix(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"blk.{b}.attn_k.weight", matrix(kv_width, shape.n_embd))
        writer.add_tensor(f"blk.{b}.attn_v.weight", matrix(kv_width, shape.n_embd))
        writer.add_tensor(f"blk.{b}.attn_output.weight", matrix(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"blk.{b}.ffn_norm.weight", ones(shape.n_embd))
        writer.add_tensor(f"blk.{b}.ffn_gate.weight", matrix(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"blk.{b}.ffn_up.weight", matrix(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"blk.{b}.ffn_down.weight", matrix(shape.n_embd, shape.n_ff))
    writer.add_tensor("output_norm.weight", ones(shape.n_embd))
    writer.add_tensor("output.weight", matrix(n_vocab, shape.n_embd))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="devstack.llamacpp.model", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL, help="the GGUF file to write")
    parser.add_argument("--seed", type=int, default=0, help="the weights' random seed")
    parser.add_argument("--layers", type=int, default=Shape.n_layer)
    parser.add_argument("--width", type=int, default=Shape.n_embd)
    parser.add_argument("--force", action="store_true", help="write even when the file exists")
    args = parser.parse_args(argv)
    if args.out.is_file() and not args.force:
        print(f"{args.out} already present")
        return
    started = time.monotonic()
    shape = Shape(n_embd=args.width, n_layer=args.layers, n_ff=3 * args.width)
    write_model(args.out, shape, args.seed)
    size_mb = args.out.stat().st_size / 1e6
    print(f"{args.out}: {size_mb:.1f} MB in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
