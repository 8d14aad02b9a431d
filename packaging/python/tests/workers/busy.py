"""A worker whose handler checkpoints its progress every tenth of a second
until SIGTERM stops it (the test sends it)."""

import logging
import sys
import time

from agentbay import Worker


def handler(ctx):
    state = ctx.state or {"ticks": 0}
    print(f"START resumed={ctx.resumed} ticks={state['ticks']}", flush=True)
    while state["ticks"] < 1_000_000:
        state["ticks"] += 1
        ctx.checkpoint(state)
        if state["ticks"] == 3:
            print("TICKING", flush=True)
        if "--finish" in sys.argv:
            break
        time.sleep(0.1)
    return {"severity": "low", "summary": f"{state['ticks']} ticks", "paged": False}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage").run(handler, max_attempts=1 if "--finish" in sys.argv else None)
