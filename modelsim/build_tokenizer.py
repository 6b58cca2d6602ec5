"""Build the small real tokenizer shipped in modelsim/tokenizer_files/ (HF layout).

``python -m modelsim.build_tokenizer [--out DIR]`` trains a byte-level BPE (Llama-3 style:
the same pre-tokenizer regex, byte fallback through the byte-level alphabet, so any Unicode
text encodes without an unknown token) on this repository's documentation as it was at a
pinned commit (read with ``git show``, so the corpus never drifts) and on the benchmarks'
pseudo-English (modelsim/pseudo_text.py, vocabularies of seeds no benchmark uses), and writes
``tokenizer.json`` and ``tokenizer_config.json`` with a Llama-3 style ``chat_template`` and
special tokens. Training runs on one thread with sorted input, so the output is the same
bytes on every run; ``--check`` verifies the shipped files against a fresh build.

Why the pseudo-English: trained on the documentation alone (4,096 tokens) the BPE cut the
bench's syllable words into ~2.4x the prompt tokens the workloads target (chars / 4), so a
tokenizing fleet carried ~2.4x the scenarios' designed load. With 12,288 tokens and that text
in the corpus it gives 0.98-1.03x (``python -m bench.probes.token_parity`` checks it on the
scenarios) and 3.1 characters per token on the documentation (3.3 before).

The simulator (``--tokenizer``, fleet ``tokenizer:``) and the EPP (``models[].tokenizer``)
load these files the way they load a real model's, so the token ids, and the KV block
hashes of the simulator's events, come from a real tokenizer in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from modelsim.pseudo_text import TextSource

NAME = "sim-llama3-12k"
OUT = Path(__file__).resolve().parent / "tokenizer_files" / NAME
VOCAB_SIZE = 12288
# The pseudo-English part: this many seeded vocabularies (seeds from PSEUDO_SEED_BASE up, far
# from the bench's trace seeds, so no benchmark's own words are in the corpus), each giving
# PSEUDO_LINES lines of ~PSEUDO_LINE_TOKENS tokens (~640 KB in all, ~3x the documentation).
PSEUDO_VOCABULARIES = 80
PSEUDO_SEED_BASE = 1_000_000
PSEUDO_LINES = 20
PSEUDO_LINE_TOKENS = 100
# The documentation at this commit is the training text (git show keeps it fixed).
CORPUS_COMMIT = "aef3467b96642e824e50122688a6b5e0479e7d5b"
CORPUS_FILES = (
    "README.md",
    "docs/architecture.md",
    "docs/benchmarks.md",
    "docs/modelsim.md",
    "docs/observability.md",
    "docs/reliability.md",
    "docs/scheduling.md",
    "docs/security.md",
)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
SPECIAL_TOKENS = (BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# Llama 3's pre-tokenizer split (contractions, letter runs, 1-3 digit groups, punctuation, spaces).
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Llama 3's chat template: BOS, then per message a header, the trimmed content and <|eot_id|>.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def corpus(root: Path, commit: str = CORPUS_COMMIT) -> list[str]:
    texts = []
    for name in CORPUS_FILES:
        out = subprocess.run(
            ["git", "-C", str(root), "show", f"{commit}:{name}"], capture_output=True, check=True
        )
        texts.append(out.stdout.decode())
    return texts


def pseudo_corpus() -> list[str]:
    """The benchmarks' kind of text (bench/harness/workloads.py writes its prompts with TextSource)."""
    texts = []
    for k in range(PSEUDO_VOCABULARIES):
        source, rng = TextSource(PSEUDO_SEED_BASE + k), random.Random(f"tokenizer-corpus-{k}")
        texts.append("".join(source.text(PSEUDO_LINE_TOKENS, rng) + "\n" for _ in range(PSEUDO_LINES)))
    return texts


def build(texts: list[str]) -> tuple[str, str]:
    """(tokenizer.json, tokenizer_config.json) as text."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before the first parallel call
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = sorted({line for text in texts for line in text.splitlines(keepends=True) if line.strip()})
    tok.train_from_iterator(lines, trainer=trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": True,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "chat_template": CHAT_TEMPLATE,
    }
    # Compact JSON (~310 KB; indented it would be twice that).
    tokenizer_json = json.dumps(json.loads(tok.to_str()), separators=(",", ":"), ensure_ascii=False) + "\n"
    return tokenizer_json, json.dumps(config, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m modelsim.build_tokenizer", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--check", action="store_true", help="fail if the files in --out differ from a fresh build"
    )
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    tokenizer_json, config_json = build(corpus(root) + pseudo_corpus())
    files = {"tokenizer.json": tokenizer_json, "tokenizer_config.json": config_json}
    if args.check:
        stale = [
            n
            for n, text in files.items()
            if not (args.out / n).is_file() or (args.out / n).read_text() != text
        ]
        if stale:
            print(f"{args.out}: {', '.join(stale)} differ from a fresh build", file=sys.stderr)
            return 1
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text)
    print(f"wrote {args.out} ({VOCAB_SIZE} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
