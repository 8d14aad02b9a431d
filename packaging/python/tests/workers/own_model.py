"""A worker that calls its own model server (here a stand-in that answers
like a streamed OpenAI completion: chunks, the last one carrying the
usage) through ctx.model_call, so the appliance charges what it reports."""

import logging
import sys

from agentbay import Worker


def streamed(fence):
    # What `client.chat.completions.create(stream=True, stream_options=
    # {"include_usage": True})` yields, as plain chunks.
    assert fence.call_id
    return [
        {"choices": [{"delta": {"content": "checkout "}}], "usage": None},
        {"choices": [{"delta": {"content": "is slow"}}], "usage": None},
        {"choices": [], "usage": {"prompt_tokens": 812, "completion_tokens": 64,
                                  "prompt_tokens_details": {"cached_tokens": 512}}},
    ]


def handler(ctx):
    chunks = ctx.model_call([{"role": "user", "content": ctx.input["text"]}], streamed, context_tokens=900)
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    return {"severity": "low", "summary": text, "paged": False}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage").run(handler, max_attempts=1)
