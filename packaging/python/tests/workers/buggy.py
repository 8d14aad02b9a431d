"""A handler with a bug: it reads a field the input does not have. The
worker reports the KeyError as a failure of the agent's code, with its
traceback."""

import logging
import sys

from agentbay import Worker


def summarise(ticket):
    return ticket["customer_name"]  # the input calls it "customer"


def handler(ctx):
    return {"severity": "low", "summary": summarise(ctx.input), "paged": False}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage", heartbeat_seconds=1).run(handler, max_attempts=1)
