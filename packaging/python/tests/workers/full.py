"""A worker whose handler makes every move: a checkpoint, a read call, a
question for input, a write call that needs an approval, the outcome."""

import logging
import sys

from agentbay import Worker


def lookup(args, fence):
    assert fence.headers()["Agentbay-Fencing-Token"].isdigit()
    return {"open": 2, "customer": args["customer"]}


def page(args, fence):
    return {"paged": True}


def handler(ctx):
    state = ctx.state or {"steps": []}
    if "planned" not in state["steps"]:
        state["steps"].append("planned")
        ctx.checkpoint(state, phase="Planning")
    tickets = ctx.call("lookup-ticket", {"customer": ctx.input["customer"]}, side_effect_class="read", fn=lookup)
    customer = ctx.ask_input(
        {"type": "object", "required": ["tier"], "properties": {"tier": {"type": "string"}}},
        "Which support tier is the customer on?",
    )
    ctx.call("page-oncall", {"message": f"outage at {ctx.input['customer']} ({customer['tier']})"},
             side_effect_class="shared-write", fn=page)
    return {"severity": "high", "summary": f"{tickets['open']} open tickets, tier {customer['tier']}", "paged": True}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage").run(handler, max_attempts=1)
