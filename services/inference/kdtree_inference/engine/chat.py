"""The reference model's chat template: OpenAI ``messages`` to the prompt text the model sees.

Each message becomes ``<|role|>\\n`` + its content + ``\\n``; with ``add_generation_prompt``
(always, for /v1/chat/completions) ``<|assistant|>\\n`` follows, and the model continues from
there. The markers are plain text to the byte-level tokenizer, which puts ``<bos>`` in front
when the rendered text is encoded, as for any other prompt.

The template is a Jinja string rendered as transformers renders a tokenizer's chat template
(sandboxed, ``trim_blocks``/``lstrip_blocks``), and ``hf_tokenizer/`` ships it in a Hugging Face
tokenizer directory (``/model_info``'s ``tokenizer_path``), so SGLang's tools
(``sglang.bench_serving --apply-chat-template``) build exactly the prompt the engine builds.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
ROLES = ("system", "developer", "user", "assistant", "tool")
HF_TOKENIZER_DIR = Path(__file__).with_name("hf_tokenizer")
"""A Hugging Face tokenizer directory equivalent to :class:`ByteTokenizer`, with this template."""


class ChatError(ValueError):
    """Messages the template cannot render (answered with HTTP 400)."""


@cache
def _template() -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(CHAT_TEMPLATE)


def message_text(content: Any, index: int) -> str:
    """A message's content as text: a string, or OpenAI's list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ChatError(
                    f"messages[{index}]: content part of type {kind!r} is not supported by "
                    "the reference model (text only)"
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ChatError(f"messages[{index}]: content must be a string or a list of text parts")


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """The prompt text for ``messages`` (OpenAI format: ``role`` and ``content``)."""
    if not messages:
        raise ChatError("messages must not be empty")
    plain = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise ChatError(f"messages[{i}]: role must be one of {list(ROLES)}, got {role!r}")
        plain.append({"role": role, "content": message_text(message.get("content"), i)})
    return _template().render(messages=plain, add_generation_prompt=add_generation_prompt)
