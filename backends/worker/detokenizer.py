"""Incremental detokenization with stop strings, one `IncrementalDetokenizer` per request.

Each new token is decoded in a short window of recent tokens (not the whole output again), and
text is released only once it is whole: a token that ends inside a multi-byte character waits
for the next. Stop strings are searched in the text as it grows; the output ends just before
the first one (OpenAI's behaviour). While streaming, the last ``len(longest stop) - 1``
characters are held back, so a client never sees the start of a stop string that then
completes; they are released when the request finishes another way.

Example::

    detok = IncrementalDetokenizer(tokenizer, stop=("\\n\\n",))
    for token_id in output_ids:
        if detok.add_token(token_id):      # True: a stop string ended the text
            break
    detok.take_delta(is_finished=True)    # the text not yet taken, stop string excluded
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Output text of one request, token by token; see the module docstring."""

    def __init__(self, tokenizer: Tokenizer, *, stop: Sequence[str] = (),
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stop = tuple(stop)
        self._num_held_chars = max((len(s) for s in self._stop), default=1) - 1
        self._token_ids: list[int] = []
        self._prefix_offset = 0  # window start: decoded for context, already in the text
        self._read_offset = 0  # tokens before this are in the text
        self._num_taken_chars = 0
        self.text = ""
        self.stop_reason: str | None = None

    def add_token(self, token_id: int) -> bool:
        """Append one token's text; True when that completes a stop string (the text is then
        cut before it, and further tokens are refused)."""
        if self.stop_reason is not None:
            raise RuntimeError("the text already ended at a stop string")
        self._token_ids.append(token_id)
        prefix_text = self._decode(self._token_ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._token_ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return False  # nothing whole yet (a partial character, or a skipped token)
        num_searched = len(self.text)
        self.text += new_text[len(prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._token_ids)
        return self._find_stop(num_searched)

    def take_delta(self, is_finished: bool) -> str:
        """Text not taken before: all of it once finished, else all but the held-back tail."""
        end = len(self.text) if is_finished else len(self.text) - self._num_held_chars
        if end <= self._num_taken_chars:
            return ""
        delta = self.text[self._num_taken_chars:end]
        self._num_taken_chars = end
        return delta

    def _find_stop(self, num_searched: int) -> bool:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            index = self.text.find(stop, max(0, num_searched - len(stop) + 1))
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return False
        self.text = self.text[:best[0]]
        self.stop_reason = best[1]
        return True

    def _decode(self, token_ids: Sequence[int]) -> str:
        if not token_ids:
            return ""
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)
