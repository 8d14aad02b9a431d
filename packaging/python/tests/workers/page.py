"""A handler that pages on-call through a gated tool; the reviewer may
change the message before approving. It prints what the tool was called
with."""

import logging
import sys

from agentbay import Worker


def page(args, fence):
    print(f"PAGED {args['message']}", flush=True)
    return {"delivered": True}


def handler(ctx):
    ctx.call("page-oncall", {"message": f"outage at {ctx.input['customer']}"}, side_effect_class="shared-write", fn=page)
    return {"severity": "high", "summary": "paged", "paged": True}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage", heartbeat_seconds=1).run(handler, max_attempts=1)
