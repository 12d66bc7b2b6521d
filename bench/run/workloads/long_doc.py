"""Long-document QA: a few long documents, many short questions about each.

Each request sends one whole document (``doc_tokens`` long) followed by a unique question
(``question_tokens``); documents are chosen with Zipf popularity, and any tenant may ask about
any document (a shared corpus), so the long prefix is shared across tenants. Example::

    specs = generate(WorkloadOptions(num_docs=2), tenants, seed=1)
    next(specs).group   # the document asked about: 0 or 1
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from bench.run.spec import RequestSpec, TenantSpec
from bench.run.text import sub_rng, text
from bench.run.workloads.base import WorkloadOptions, zipf_weights

INSTRUCTION = "Answer the question using only the document below."


def generate(options: WorkloadOptions, tenants: Sequence[TenantSpec],
             seed: int) -> Iterator[RequestSpec]:
    """Request specs of this workload, without end (see the module docstring)."""
    if not tenants:
        raise ValueError("a workload needs at least one tenant")
    docs = [text(options.doc_tokens.draw(sub_rng(seed, "doc", d)), sub_rng(seed, "doc-text", d))
            for d in range(options.num_docs)]
    weights = zipf_weights(options.num_docs, options.zipf_s)
    numbers = range(options.num_docs)
    rng = random.Random(f"{seed}:long-doc")
    index = 0
    while True:
        doc = rng.choices(numbers, weights)[0]
        question = text(options.question_tokens.draw(rng), rng)
        yield RequestSpec(
            index=index, tenant=rng.choice(tenants), max_tokens=options.max_tokens.draw(rng),
            messages=({"role": "system", "content": INSTRUCTION},
                      {"role": "user", "content": f"{docs[doc]}\n\nQuestion: {question}"}),
            is_stream=options.is_stream, group=doc,
        )
        index += 1
