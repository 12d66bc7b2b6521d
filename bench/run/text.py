"""Synthetic English text of a chosen token length.

Every word in `WORDS` is one token (with its leading space) under SmolLM2's tokenizer, and one
under the approximate tokenizer, so ``len(text(n, rng).split()) == n`` tokens: the prompt sizes
a workload asks for are the sizes the engine sees (plus the chat template's few tokens).
Checked in tests/bench/test_bench_run.py. Example::

    rng = random.Random(7)
    text(5, rng)   # 'years people she would old'
"""

from __future__ import annotations

import random

# 142 common English words, each a single token for both tokenizers (checked by the tests).
_WORD_LIST = """
the of and to in is that it for as with was on be by this are from at or have an they which
one you were her all she there would their we him been has when who will more no if out so
said what up its about into than them can only other new some could time these two may then
do first any my now such like our over man me even most made after also did many before must
through back years where much your way well down should because each just those people how
too little state good very make world still own see men work long get here between both life
being under never day same another know while last might us great old year off come since
against go came right used take three
"""
WORDS = tuple(_WORD_LIST.split())


def text(num_tokens: int, rng: random.Random) -> str:
    """``num_tokens`` random words from `WORDS`, space-separated."""
    return " ".join(rng.choices(WORDS, k=max(0, num_tokens)))


def sub_rng(seed: int, *labels: object) -> random.Random:
    """A generator for one labelled part of a workload (a group's system prompt, a document),
    the same whatever order the parts are drawn in."""
    return random.Random(f"{seed}:" + ":".join(str(label) for label in labels))
