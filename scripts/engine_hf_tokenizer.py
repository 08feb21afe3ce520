"""Writes the reference engine's Hugging Face tokenizer directory (``engine/hf_tokenizer``).

The directory is committed; this script is how it was made and how it is remade if the byte
tokenizer or the chat template change (``tests/unit/test_engine_chat.py`` fails until then).
Byte-level BPE without merges over GPT-2's byte alphabet: token id = byte value, then
``<bos>``/``<eos>``/``<pad>`` as 256-258, ``<bos>`` added in front, exactly ``ByteTokenizer``.

    python scripts/engine_hf_tokenizer.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers.convert_slow_tokenizer import bytes_to_unicode

from kdtree_inference.engine.chat import CHAT_TEMPLATE, HF_TOKENIZER_DIR
from kdtree_inference.engine.config import ModelConfig
from kdtree_inference.engine.tokenizer import BOS_ID, ByteTokenizer

SPECIALS = ("<bos>", "<eos>", "<pad>")


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    byte_char = bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={byte_char[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    assert [tok.token_to_id(s) for s in SPECIALS] == [
        ByteTokenizer.bos_token_id,
        ByteTokenizer.eos_token_id,
        ByteTokenizer.pad_token_id,
    ]
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "model_max_length": ModelConfig.max_position,
        "clean_up_tokenization_spaces": False,
        # "<eos>" in a text is five bytes to the engine, not the special token.
        "split_special_tokens": True,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else HF_TOKENIZER_DIR)
