"""One request as the simulated engine sees it: prompt, progress, KV blocks, timings.

Progress follows vLLM's unified model: a sequence has ``num_tokens`` tokens (prompt plus
outputs so far) of which ``num_computed_tokens`` have KV in the cache. A step computes some
of the rest; once all are computed the step also samples one new output token. A decode is
the case where exactly one token (the last output) is left to compute.

The simulator only counts output tokens. The PyTorch engine also records their ids
(`append_token`): then ``token_ids`` is the whole sequence, a preempted sequence can be
recomputed, and every full block, output blocks included, gets its chained hash, so a later
turn of a conversation (prompt = this prompt + this answer + more) reuses the answer's KV.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from routing.prefix import token_block_hashes


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue; its KV was dropped, to be recomputed
    FINISHED = "finished"


class Sequence:
    """A request inside one worker; the scheduler and block manager mutate it.

    ``stop_after_tokens`` makes the simulated model emit end-of-sequence after that many
    output tokens (finish reason ``"stop"``); otherwise it runs to ``max_tokens``
    (``"length"``). Prompt block hashes come from ``routing.prefix``, computed once; output
    blocks are hashed as `append_token` fills them.

    Example::

        seq = Sequence("req-1", [1, 2, 3, 4, 5], max_tokens=8, arrival_time_s=0.0,
                       model="llama-3-8b", block_size=2)
        len(seq.block_hashes)   # 2 full blocks
        seq.num_uncomputed_tokens  # 5
        seq.append_token(42)       # a real engine records the sampled id: 6 tokens, 3 blocks
        seq.token_ids              # [1, 2, 3, 4, 5, 42]
    """

    def __init__(
        self,
        seq_id: str,
        prompt_token_ids: Iterable[int],
        max_tokens: int,
        arrival_time_s: float,
        *,
        model: str,
        block_size: int,
        cache_salt: str | None = None,
        stop_after_tokens: int | None = None,
    ) -> None:
        self.seq_id = seq_id
        self.prompt_token_ids: tuple[int, ...] = tuple(prompt_token_ids)
        if not self.prompt_token_ids:
            raise ValueError(f"sequence {seq_id!r}: the prompt must have at least one token")
        if max_tokens < 1:
            raise ValueError(f"sequence {seq_id!r}: max_tokens must be >= 1, got {max_tokens}")
        if stop_after_tokens is not None and stop_after_tokens < 1:
            raise ValueError(f"sequence {seq_id!r}: stop_after_tokens must be >= 1")
        self.max_tokens = max_tokens
        self.stop_after_tokens = stop_after_tokens
        self.arrival_time_s = arrival_time_s
        self.block_size = block_size
        self.model = model
        self.cache_salt = cache_salt
        self.block_hashes: tuple[int, ...] = tuple(
            token_block_hashes(self.prompt_token_ids, block_size, model, cache_salt))
        self.output_token_ids: list[int] = []  # empty in the simulator, which counts only

        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit at the latest admission
        self.num_hashed_blocks = 0  # leading blocks of block_table whose hash is registered
        self.num_preemptions = 0
        self.block_table: list[int] = []
        self.first_scheduled_time_s: float | None = None
        self.first_token_time_s: float | None = None
        self.finish_time_s: float | None = None
        self.finish_reason: str | None = None

    def __repr__(self) -> str:
        return (f"Sequence({self.seq_id!r}, {self.status.value}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens}, "
                f"out={self.num_output_tokens}/{self.max_tokens})")

    def append_token(self, token_id: int) -> None:
        """Record a sampled output token; hash the block it fills, if it fills one."""
        if len(self.output_token_ids) != self.num_output_tokens:
            raise RuntimeError(f"sequence {self.seq_id!r} counted output tokens without their "
                               "ids; append_token must record every output token")
        self.output_token_ids.append(token_id)
        self.num_output_tokens += 1
        num_full_blocks = self.num_tokens // self.block_size
        if num_full_blocks == len(self.block_hashes) + 1:
            parent = self.block_hashes[-1] if self.block_hashes else None
            (block_hash,) = token_block_hashes(
                self.block_token_ids(num_full_blocks - 1), self.block_size, self.model,
                self.cache_salt, parent=parent)
            self.block_hashes += (block_hash,)

    @property
    def token_ids(self) -> list[int]:
        """Prompt and output token ids (the outputs only when `append_token` recorded them)."""
        return [*self.prompt_token_ids, *self.output_token_ids]

    def block_token_ids(self, block_index: int) -> tuple[int, ...]:
        """The token ids of block ``block_index`` (a trailing partial block is shorter)."""
        start = block_index * self.block_size
        stop = start + self.block_size
        prompt = self.prompt_token_ids
        if stop <= len(prompt):
            return prompt[start:stop]
        outputs = self.output_token_ids[max(0, start - len(prompt)):stop - len(prompt)]
        return (*prompt[start:stop], *outputs)

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_max_tokens(self) -> int:
        """Prompt plus every output token it may produce: its KV footprint at the end."""
        return self.num_prompt_tokens + self.max_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1

    @property
    def num_queued_prefill_tokens(self) -> int:
        """Tokens still to prefill (0 while decoding); a preempted sequence recomputes all."""
        return 0 if self.is_decoding else self.num_uncomputed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def finish_reason_now(self) -> str | None:
        """Why it stops after its latest token, or None. Length wins over stop, as in vLLM."""
        if self.num_output_tokens >= self.max_tokens:
            return "length"
        if self.stop_after_tokens is not None and self.num_output_tokens >= self.stop_after_tokens:
            return "stop"
        return None
