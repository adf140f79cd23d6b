"""Writes a small random Llama that vLLM loads from a directory, with no model hub.

Run it with the vLLM environment's python (torch, transformers and tokenizers
come from there), not hixl's::

    python tiny_model.py OUTDIR [--layers N --hidden H --heads A --kv-heads K
                                 --head-dim D --intermediate I --vocab V --seed S]

The defaults make the tiny shape the P/D checks use: 2 layers, hidden 128,
4 heads (head dim 32), 2 KV heads, intermediate 256, vocabulary 1024: 512
bytes of bf16 KV per token, 200 KiB for a 400-token prompt. The weights come
from a seeded generator, parameter by parameter in name order, so two runs
with the same arguments write identical files.

A shape whose KV is at least 16 MiB for a 400-token prompt, for benchmarks:
48 KiB of KV per token (18.75 MiB at 400 tokens), yet only 18 M parameters,
because the attention is wider than the hidden size (head dim 128); a
400-token prefill takes about 4 s on one AVX2 core (bf16 is emulated there)::

    python tiny_model.py OUTDIR --layers 12 --hidden 256 --heads 8 \\
        --kv-heads 8 --head-dim 128 --intermediate 512

(``--hidden 1024 --intermediate 1024`` gives the same KV with 130 M
parameters, and a prefill four times slower.)

KV bytes per token are ``2 * layers * kv_heads * head_dim * 2``. vLLM's CPU
attention has kernels for head dims 32, 64, 80, 96, 112, 128, 160, 192,
224, 256 and 512, and wants block sizes that are multiples of 32.

This module is a script on its own: it imports nothing of hixl.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

# Typed "ignore" because hixl's environment, where mypy runs, has none of these.
import torch
from tokenizers import (  # type: ignore[import-not-found, unused-ignore]
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    trainers,
)
from transformers import (  # type: ignore[import-not-found, unused-ignore]
    LlamaConfig,
    LlamaForCausalLM,
)

BOS = "<s>"
EOS = "</s>"
# A normal init this wide keeps the logits of a random model far enough
# apart that greedy decoding does not hinge on bf16 rounding ties.
_INIT_STD = 0.05
_CORPUS_LINES = 4000


def _corpus(seed: int) -> list[str]:
    """Deterministic pseudo-text: enough distinct byte pairs for ~1000 merges."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "z", "st", "tr", "pl", "ch", "sh", "th"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ee", "y"]
    codas = ["", "", "n", "s", "t", "r", "l", "x", "nd", "ck"]
    words = ["".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                     for _ in range(rng.randint(1, 3)))
             for _ in range(3000)]
    marks = [" ", " ", " ", " ", ", ", ". ", "; ", "\n", " 0", " 42 "]
    return ["".join(rng.choice(words) + rng.choice(marks) for _ in range(rng.randint(5, 30)))
            for _ in range(_CORPUS_LINES)]


def write_tokenizer(out: Path, vocab: int, seed: int, max_len: int) -> tuple[int, int]:
    """A byte-level BPE with exactly ``vocab`` entries; returns the BOS and EOS ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[BOS, EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(seed), trainer)
    # The model's embedding has `vocab` rows: a tokenizer short of that would
    # let a generated id fall outside it and fail detokenization.
    missing = vocab - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([f"<extra_{i}>" for i in range(missing)])
    if tok.get_vocab_size() != vocab:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} entries, wanted {vocab}")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
    }, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}, indent=2) + "\n")
    return int(tok.token_to_id(BOS)), int(tok.token_to_id(EOS))


def write_model(out: Path, args: argparse.Namespace, bos: int, eos: int) -> None:
    if args.heads % args.kv_heads:
        raise SystemExit("--heads must divide by --kv-heads")
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=head_dim(args),
        max_position_embeddings=args.max_len, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=bos, eos_token_id=eos,
        torch_dtype="bfloat16",
    )
    model: Any = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        # Filled here, by name, so the bytes depend on the seed only and not on
        # the initialisation order of a transformers release.
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * _INIT_STD)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}, indent=2) + "\n")


def head_dim(args: argparse.Namespace) -> int:
    if args.head_dim:
        return int(args.head_dim)
    if args.hidden % args.heads:
        raise SystemExit("--hidden must divide by --heads, or give --head-dim")
    return int(args.hidden // args.heads)


def kv_bytes_per_token(args: argparse.Namespace) -> int:
    """K and V, every layer, every KV head, bf16."""
    return 2 * int(args.layers) * int(args.kv_heads) * head_dim(args) * 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=0, help="default: hidden / heads")
    parser.add_argument("--intermediate", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out: Path = args.outdir
    out.mkdir(parents=True, exist_ok=True)
    bos, eos = write_tokenizer(out, args.vocab, args.seed, args.max_len)
    write_model(out, args, bos=bos, eos=eos)
    print(json.dumps({"model_dir": str(out), "kv_bytes_per_token": kv_bytes_per_token(args)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
