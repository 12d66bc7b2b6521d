"""Continuous batching with chunked prefill, in the style of vLLM v1 / nano-vllm.

Each step, under a token budget of ``max_num_batched_tokens``:

1. every running sequence that finished prefill decodes one token (oldest first; these
   count against the budget first). When one needs a new KV block and none is free, the
   newest running sequence is preempted (recompute: its blocks are freed, it goes back
   to the front of the waiting queue) until the block fits or it was itself the newest;
2. running sequences still prefilling get the next chunk of their prompt;
3. waiting sequences are admitted in FIFO order while the budget, ``max_batch`` and the
   block manager allow; the queue head blocks the rest (no overtaking). Nothing is
   admitted in a step that preempted.

``schedule(now_s)`` decides a step; ``complete_step(plan, now_s)`` applies it once the step
has run: computed tokens advance, finished prefills and decodes each emit one token. The
simulator only counts that token; the PyTorch engine passes the ids it sampled
(``sampled_token_ids``, recorded in each sequence) and the sequences its stop checks ended
(``finish_reasons``: EOS, a stop token or a stop string). A stop the engine reports wins
over ``"length"``: the text did end there. The simulated ``stop_after_tokens`` does not
(length wins ties, as in vLLM).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from backends.engine_core.block_manager import BlockManager
from backends.engine_core.sequence import Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    seq_id: str
    num_tokens: int
    num_context_tokens: int  # KV the chunk attends to: everything computed up to its end


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one engine step runs.

    Example::

        plan = scheduler.schedule(now_s=0.0)
        plan.prefills          # (PrefillChunk("req-1", 2048, 2048),)
        plan.decode_ids        # ("req-0",)
        plan.num_prefill_tokens, plan.num_decode_seqs, plan.num_kv_tokens_attended
    """

    prefills: tuple[PrefillChunk, ...]
    decode_ids: tuple[str, ...]
    preempted_ids: tuple[str, ...]
    num_prefill_tokens: int
    num_decode_seqs: int
    num_kv_tokens_attended: int

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decode_ids


@dataclass(frozen=True, slots=True)
class EmittedToken:
    seq_id: str
    num_output_tokens: int  # including this token
    is_first: bool
    finish_reason: str | None  # "length" / "stop" when this token ends the sequence
    token_id: int | None = None  # the sampled id, when the engine passed one


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """Tokens a completed step produced, at most one per sequence.

    Example::

        outcome = scheduler.complete_step(plan, now_s=0.131)
        outcome.first_token_ids   # ("req-1",)
        outcome.finished          # (EmittedToken("req-0", 16, False, "length"),)
    """

    tokens: tuple[EmittedToken, ...]

    @property
    def first_token_ids(self) -> tuple[str, ...]:
        return tuple(token.seq_id for token in self.tokens if token.is_first)

    @property
    def finished(self) -> tuple[EmittedToken, ...]:
        return tuple(token for token in self.tokens if token.finish_reason is not None)


class Scheduler:
    """Waiting queue and running batch of one worker; see the module docstring.

    Example::

        scheduler = Scheduler(BlockManager(64, 16), max_batch=8,
                              max_num_batched_tokens=256, max_context_tokens=1024)
        scheduler.add(seq)
        plan = scheduler.schedule(now_s=0.0)
        outcome = scheduler.complete_step(plan, now_s=0.02)
    """

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_batch: int,
        max_num_batched_tokens: int,
        max_context_tokens: int,
    ) -> None:
        if min(max_batch, max_num_batched_tokens, max_context_tokens) < 1:
            raise ValueError("max_batch, max_num_batched_tokens, max_context_tokens must be >= 1")
        self.block_manager = block_manager
        self.max_batch = max_batch
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_context_tokens = max_context_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the newest
        self._seqs: dict[str, Sequence] = {}
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_queued_prefill_tokens(self) -> int:
        return sum(seq.num_queued_prefill_tokens for seq in (*self.waiting, *self.running))

    def get(self, seq_id: str) -> Sequence | None:
        return self._seqs.get(seq_id)

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; a ValueError says why one can never be served here."""
        if seq.seq_id in self._seqs:
            raise ValueError(f"sequence id {seq.seq_id!r} is already queued or running")
        self.check_servable(seq)
        seq.status = SequenceStatus.WAITING
        self._seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    def check_servable(self, seq: Sequence) -> None:
        """Raise ValueError if ``seq`` can never be served here, whatever the load. Reads only
        settings, so another thread may call it while a step runs."""
        manager = self.block_manager
        if seq.block_size != manager.block_size:
            raise ValueError(f"sequence {seq.seq_id!r} was hashed with block_size "
                             f"{seq.block_size}, this worker uses {manager.block_size}")
        if seq.num_max_tokens > self.max_context_tokens:
            raise ValueError(
                f"prompt ({seq.num_prompt_tokens} tokens) + max_tokens ({seq.max_tokens}) = "
                f"{seq.num_max_tokens} exceeds this worker's max_context_tokens "
                f"({self.max_context_tokens}); shorten the prompt or lower max_tokens")
        # It must fit whole: otherwise, running alone, it would preempt itself forever.
        num_usable_blocks = manager.num_blocks - manager.watermark_blocks
        if manager.num_blocks_for(seq.num_max_tokens) > num_usable_blocks:
            raise ValueError(
                f"prompt + max_tokens = {seq.num_max_tokens} tokens needs "
                f"{manager.num_blocks_for(seq.num_max_tokens)} KV blocks; this worker's cache "
                f"has {num_usable_blocks} usable blocks ({num_usable_blocks * manager.block_size}"
                f" tokens); shorten the prompt or lower max_tokens")

    def abort(self, seq_id: str) -> bool:
        """Drop a sequence wherever it is and free its blocks; False if it is unknown."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return False
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        if seq.block_table:
            self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "abort"
        return True

    def schedule(self, now_s: float) -> StepPlan:
        manager = self.block_manager
        budget_tokens = self.max_num_batched_tokens
        decode_ids: list[str] = []
        prefills: list[PrefillChunk] = []
        preempted_ids: list[str] = []
        num_kv_tokens = 0

        for seq in list(self.running):
            if budget_tokens == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or not seq.is_decoding:
                continue
            while not manager.can_append(seq):
                victim = self.running[-1]
                self._preempt(victim)
                preempted_ids.append(victim.seq_id)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            manager.append_slot(seq)
            decode_ids.append(seq.seq_id)
            budget_tokens -= 1
            num_kv_tokens += seq.num_tokens

        for seq in self.running:
            if budget_tokens == 0:
                break
            if not seq.is_decoding:
                chunk = self._chunk(seq, budget_tokens)
                prefills.append(chunk)
                budget_tokens -= chunk.num_tokens
                num_kv_tokens += chunk.num_context_tokens

        while (not preempted_ids and self.waiting and budget_tokens > 0
               and len(self.running) < self.max_batch and manager.can_allocate(self.waiting[0])):
            seq = self.waiting.popleft()
            manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time_s is None:
                seq.first_scheduled_time_s = now_s
            self.running.append(seq)
            chunk = self._chunk(seq, budget_tokens)
            prefills.append(chunk)
            budget_tokens -= chunk.num_tokens
            num_kv_tokens += chunk.num_context_tokens

        return StepPlan(
            prefills=tuple(prefills),
            decode_ids=tuple(decode_ids),
            preempted_ids=tuple(preempted_ids),
            num_prefill_tokens=sum(chunk.num_tokens for chunk in prefills),
            num_decode_seqs=len(decode_ids),
            num_kv_tokens_attended=num_kv_tokens,
        )

    def emitting_ids(self, plan: StepPlan) -> list[str]:
        """The sequences that emit a token when ``plan`` completes, in `complete_step` order:
        every decode, and each prefill chunk that reaches the end of its sequence."""
        ids = list(plan.decode_ids)
        for chunk in plan.prefills:
            seq = self._seqs.get(chunk.seq_id)
            if seq is not None and chunk.num_context_tokens == seq.num_tokens:
                ids.append(chunk.seq_id)
        return ids

    def complete_step(
        self,
        plan: StepPlan,
        now_s: float,
        sampled_token_ids: Mapping[str, int] | None = None,
        finish_reasons: Mapping[str, str] | None = None,
    ) -> StepOutcome:
        """Apply a finished step. Sequences aborted while it ran are skipped.

        With ``sampled_token_ids`` every emitting sequence (`emitting_ids`) records its id;
        ``finish_reasons`` ends the sequences the engine's stop checks ended.
        """
        advances = [(seq_id, 1) for seq_id in plan.decode_ids]
        advances += [(chunk.seq_id, chunk.num_tokens) for chunk in plan.prefills]
        tokens: list[EmittedToken] = []
        for seq_id, num_tokens in advances:
            seq = self._seqs.get(seq_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens += num_tokens
            self.block_manager.cache_computed_blocks(seq)
            if seq.num_uncomputed_tokens == 0:
                token_id = None
                if sampled_token_ids is not None:
                    if seq_id not in sampled_token_ids:
                        raise ValueError(f"sequence {seq_id!r} emits a token this step but "
                                         "sampled_token_ids has none for it")
                    token_id = sampled_token_ids[seq_id]
                reason = finish_reasons.get(seq_id) if finish_reasons is not None else None
                tokens.append(self._emit(seq, now_s, token_id, reason))
        return StepOutcome(tuple(tokens))

    def _chunk(self, seq: Sequence, budget_tokens: int) -> PrefillChunk:
        num_tokens = min(seq.num_uncomputed_tokens, budget_tokens)
        return PrefillChunk(seq.seq_id, num_tokens, seq.num_computed_tokens + num_tokens)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _emit(self, seq: Sequence, now_s: float, token_id: int | None,
              engine_finish_reason: str | None) -> EmittedToken:
        if token_id is None:
            seq.num_output_tokens += 1
        else:
            seq.append_token(token_id)
        is_first = seq.first_token_time_s is None
        if is_first:
            seq.first_token_time_s = now_s
        finish_reason = engine_finish_reason or seq.finish_reason_now()
        if finish_reason is not None:
            seq.status = SequenceStatus.FINISHED
            seq.finish_time_s = now_s
            seq.finish_reason = finish_reason
            self.running.remove(seq)
            self.block_manager.deallocate(seq)
            del self._seqs[seq.seq_id]
        return EmittedToken(seq.seq_id, seq.num_output_tokens, is_first, finish_reason,
                            token_id)
