"""The reference model's chat template and the Hugging Face tokenizer shipped for SGLang's tools.

The committed ``engine/hf_tokenizer`` must be what ``scripts/engine_hf_tokenizer.py`` writes
today, must tokenize exactly like ``ByteTokenizer`` (so SGLang's benchmark counts the engine's
tokens) and must carry the template the engine renders chats with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_hf_tokenizer import write
from transformers import AutoTokenizer

from kdtree_inference.engine.chat import HF_TOKENIZER_DIR, ChatError, render_chat
from kdtree_inference.engine.tokenizer import ByteTokenizer

TEXTS = ["hello world", "  tabs\tand\nnewlines ", "héllo ✓ 𠮷", "<|user|>\nnot special", "<eos>"]
CHATS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is ✓?"},
        {"role": "assistant", "content": "Here."},
        {"role": "user", "content": "Thanks\n"},
    ],
]


@pytest.fixture(scope="module")
def hf():
    return AutoTokenizer.from_pretrained(HF_TOKENIZER_DIR)


def test_the_committed_tokenizer_is_what_the_script_writes(tmp_path: Path) -> None:
    write(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((tmp_path / name).read_text()) == json.loads(
            (HF_TOKENIZER_DIR / name).read_text()
        ), f"run scripts/engine_hf_tokenizer.py: {name} is stale"


@pytest.mark.parametrize("text", TEXTS)
def test_hf_tokenizer_tokenizes_like_the_engine(hf, text: str) -> None:
    ours = ByteTokenizer()
    assert hf.encode(text) == ours.encode(text)
    assert hf.decode(ours.encode(text), skip_special_tokens=True) == text
    assert hf.num_special_tokens_to_add() == 1  # <bos>, as ByteTokenizer.encode adds


@pytest.mark.parametrize("messages", CHATS)
def test_hf_chat_template_is_the_engines(hf, messages: list[dict]) -> None:
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        render_chat(messages)
    )


def test_render_chat_layout_and_text_parts() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert render_chat(
        [{"role": "system", "content": "S"}, {"role": "user", "content": parts}]
    ) == ("<|system|>\nS\n<|user|>\nab\n<|assistant|>\n")


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "must not be empty"),
        ([{"role": "robot", "content": "x"}], "role must be one of"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "'image_url' is not supported"),
        ([{"role": "user", "content": 5}], "content must be a string"),
    ],
)
def test_render_chat_refuses_what_it_cannot_render(messages: list, fragment: str) -> None:
    with pytest.raises(ChatError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        render_chat(messages)
