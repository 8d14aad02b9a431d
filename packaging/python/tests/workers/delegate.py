"""A worker whose handler delegates the ticket to the builtin triage
release as a sub-agent and reports the child's output."""

import logging
import sys

from agentbay import Worker


def handler(ctx):
    child = ctx.delegate("triage-1.0.0", ctx.input, wait_seconds=5)
    print(f"CHILD {child}", flush=True)
    return {"severity": child["severity"], "summary": f"delegated: {child['summary']}"[:500], "paged": child["paged"]}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage").run(handler, max_attempts=1)
