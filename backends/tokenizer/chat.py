"""ChatML rendering, the chat format of SmolLM2, without a template engine.

SmolLM2-135M-Instruct's template (``tokenizer.chat_template`` in its GGUF, kept verbatim in
`SMOLLM2_CHAT_TEMPLATE`) puts a default system prompt in front of the first message unless that
message is a system message, and inserts nothing for an empty list; `ChatMLFormat` renders exactly
that. The default system prompt is read from the template, so a ChatML template without one
renders plain ChatML.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from backends.tokenizer.base import ChatMessage, ChatTemplateError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The literal system turn a ChatML template writes itself (no quotes or Jinja inside it).
_DEFAULT_SYSTEM_TURN = re.compile(r"<\|im_start\|>system\n([^'\"{}]*)<\|im_end\|>")


@dataclass(frozen=True, slots=True)
class ChatMLFormat:
    """Renders OpenAI chat messages as ChatML.

    Example::

        ChatMLFormat().render([{"role": "user", "content": "Hi"}])
        # '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
    """

    default_system_prompt: str | None = None

    @classmethod
    def from_template(cls, template: str | None) -> ChatMLFormat | None:
        """The format a Jinja chat template describes; None when it is not ChatML.

        A missing template means plain ChatML, as Hugging Face's old default template did.
        """
        if template is None:
            return cls()
        if IM_START not in template:
            return None
        match = _DEFAULT_SYSTEM_TURN.search(template)
        return cls(default_system_prompt=match.group(1) if match else None)

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        turns: list[str] = []
        for index, message in enumerate(messages):
            role = message.get("role")
            if not isinstance(role, str) or not role:
                raise ChatTemplateError(f"messages[{index}] needs a 'role' string, got {role!r}")
            if index == 0 and role != "system" and self.default_system_prompt is not None:
                turns.append(f"{IM_START}system\n{self.default_system_prompt}{IM_END}\n")
            content = message_text(message.get("content"), index)
            turns.append(f"{IM_START}{role}\n{content}{IM_END}\n")
        if add_generation_prompt:
            turns.append(f"{IM_START}assistant\n")
        return "".join(turns)


def message_text(content: object, index: int = 0) -> str:
    """A message's content as text: a string, None (an assistant turn with only tool calls),
    or a list of ``{"type": "text", "text": ...}`` parts joined with newlines, as vLLM does."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(
            f"messages[{index}].content must be a string or a list of parts, "
            f"got {type(content).__name__}"
        )
    texts: list[str] = []
    for part in content:
        part_type = part.get("type") if isinstance(part, dict) else None
        text = part.get("text") if isinstance(part, dict) else None
        if part_type != "text" or not isinstance(text, str):
            raise ChatTemplateError(
                f"messages[{index}].content has a {part_type!r} part; this text-only model "
                "takes only {'type': 'text', 'text': ...} parts"
            )
        texts.append(text)
    return "\n".join(texts)
