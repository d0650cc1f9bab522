"""A tiny random BERT saved as a Hugging Face folder: a fast, offline stand-in text encoder."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ["item", "number", "the", "a", "of", "and", "red", "blue", "green", "small", "large", "tool", "glue",
         "tape", "saw", "drill", *[str(i) for i in range(100)]]
TEXT_DIM = 16


def make_tiny_encoder(folder: Path) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    BertTokenizer(vocab=vocab, do_lower_case=True).save_pretrained(str(folder))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=5 + len(WORDS), hidden_size=TEXT_DIM, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    BertModel(config).save_pretrained(str(folder))
    return folder
