"""A worker for the kill test: it checkpoints its progress, makes a read
call per step, and says on stdout where it is (the test kills it with
SIGKILL after the second step). Resumed, it continues from ctx.state."""

import logging
import sys
import threading

from agentbay import Worker

CALLS = []


def lookup(args, fence):
    CALLS.append(args["step"])
    return {"step": args["step"], "fence": fence.fencing_token}


def handler(ctx):
    state = ctx.state or {"done": []}
    print(f"START resumed={ctx.resumed} done={state['done']} token={ctx.fencing_token}", flush=True)
    for step in range(1, 5):
        if step in state["done"]:
            continue
        ctx.call("lookup-ticket", {"customer": ctx.input["customer"], "step": step}, side_effect_class="read", fn=lookup)
        state["done"].append(step)
        ctx.checkpoint(state)
        print(f"STEP {step} token={ctx.fencing_token} attempt={ctx.attempt_id}", flush=True)
        if step == 2 and "--stall" in sys.argv:
            threading.Event().wait()  # killed here
    print(f"CALLS {CALLS}", flush=True)
    return {"severity": "low", "summary": f"steps {state['done']}", "paged": False}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage", heartbeat_seconds=1).run(handler, max_attempts=1)
