"""A handler that asks the model for a story with ``stream=True`` and
prints what it read: the text as the stream gave it (a restart drops what
came before it) and the reply the turn came to."""

import json
import logging
import sys

from agentbay import RESTART, Worker


def tell(ctx):
    stream = ctx.model([{"role": "user", "content": f"Write a story about {ctx.input['customer']}."}], stream=True)
    read, restarts = "", 0
    for piece in stream:
        if piece is RESTART:
            read, restarts = "", restarts + 1
        else:
            read += piece
    print("STREAMED " + json.dumps({"read": read, "reply": stream.reply.content, "restarts": restarts}), flush=True)
    return {"severity": "low", "summary": "a story was told", "paged": False}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage").run(tell, max_attempts=1)
    print("WORKER DONE", flush=True)
