"""The fixed inputs of the quality benchmark: 20 chat prompts and the perplexity text."""

from __future__ import annotations

from pathlib import Path

from backends.tokenizer import Tokenizer
from bench.common.paths import DATA_DIR

TEXT_PATH = DATA_DIR / "alice-ch1-2.txt"

QUESTIONS = (
    "What is the capital of France, and what is it famous for?",
    "Explain photosynthesis to a ten-year-old.",
    "Write a short poem about the sea.",
    "How do I reverse a list in Python?",
    "Give me three tips for sleeping better.",
    "What causes the seasons on Earth?",
    "Summarise the story of Romeo and Juliet in a few sentences.",
    "What is the difference between a virus and a bacterium?",
    "Suggest a name for a friendly robot and say why.",
    "How does a refrigerator keep food cold?",
    "Write a haiku about autumn leaves.",
    "What are prime numbers? Give some examples.",
    "Describe a healthy breakfast.",
    "Why is the sky blue?",
    "Translate 'good morning, how are you?' into Spanish and French.",
    "What is an API, in simple words?",
    "List the planets of the solar system in order.",
    "Give a recipe for a simple tomato soup.",
    "What should I pack for a weekend hiking trip?",
    "Tell me a short story about a lost cat that finds its way home.",
)


def chat_prompts(tokenizer: Tokenizer, count: int = len(QUESTIONS)) -> list[list[int]]:
    """The first ``count`` questions as ChatML prompts (the model's default system prompt)."""
    return [tokenizer.encode_chat([{"role": "user", "content": question}])
            for question in QUESTIONS[:count]]


def text_segments(tokenizer: Tokenizer, *, segment_tokens: int, max_segments: int,
                  path: Path = TEXT_PATH) -> list[list[int]]:
    """Consecutive, non-overlapping ``segment_tokens``-token windows of the fixed text."""
    ids = tokenizer.encode(path.read_text())
    count = min(max_segments, len(ids) // segment_tokens)
    if count < 1:
        raise ValueError(f"{path} has {len(ids)} tokens, fewer than one {segment_tokens}-token "
                         "segment")
    return [ids[i * segment_tokens:(i + 1) * segment_tokens] for i in range(count)]
