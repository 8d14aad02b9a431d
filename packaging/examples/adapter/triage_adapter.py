#!/usr/bin/env python3
"""A complete external execution adapter for the triage-external example
release, on the agentbay Python SDK (packaging/python).

It claims attempts of agent `triage`, runs its own small loop (ask the
model for a severity, look up the customer's tickets, page on-call for an
outage once a reviewer approves, report the outcome) and lets the appliance
enforce the rest: fencing tokens, the tool closure, approvals, checkpoints,
limits and exactly one outcome. The handler is written to resume: killed at
any point, its attempt continues on another worker from the last
checkpoint, and no completed call is made again.

    pip install /usr/share/agentbay/python/agentbay-*.whl   # offline
    AGENTBAY_URL=https://127.0.0.1:8443 AGENTBAY_CA=agentbay-data/tls/ca.pem \
    AGENTBAY_CLIENT_ID=demo.... AGENTBAY_CLIENT_SECRET=... \
    python3 triage_adapter.py [--once]
"""

import logging
import sys

from agentbay import Context, Worker


def lookup_tickets(args, fence):
    """A stand-in for the site's ticket service: a real tool sends
    fence.headers() with its request, so a server that has seen a newer
    fencing token for the attempt refuses a stale one."""
    assert fence.headers()["Agentbay-Call-Id"], "every outbound call carries its fence"
    return {"open": 2, "customer": args["customer"]}


def page_oncall(args, fence):
    """A stand-in for the pager (shared-write: a reviewer approves first)."""
    return {"paged": True, "message": args["message"]}


def triage(ctx: Context):
    ticket = ctx.input or {}
    customer = ticket.get("customer", "unknown")
    state = ctx.state or {}

    # Plan: the model, through the site's routing (the release's profile).
    if "severity" not in state:
        reply = ctx.model([
            {"role": "system", "content": "Classify the ticket's severity: low, medium or high."},
            {"role": "user", "content": f"{ticket}"},
        ])
        text = f"{reply.content or ''} {ticket}".lower()
        state["severity"] = "high" if ("high" in text or "down" in text or "outage" in text) else "low"
        ctx.checkpoint(state, phase="Planning")

    # Look up the customer's tickets (a read tool: allowed without asking).
    state["tickets"] = ctx.call("lookup-ticket", {"customer": customer},
                                side_effect_class="read", fn=lookup_tickets)

    # Page on-call for an outage: the policy asks a reviewer first; the
    # worker is free while the approval waits, and the answer resumes here.
    paged = False
    if state["severity"] == "high":
        ctx.call("page-oncall", {"message": f"outage reported by {customer}"},
                 side_effect_class="shared-write", fn=page_oncall)
        paged = True

    # The one outcome; the appliance verifies it against the output contract.
    return {"severity": state["severity"],
            "summary": f"{state['severity']} severity ticket from {customer}",
            "paged": paged}


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    Worker(agent="triage").run(triage, max_attempts=1 if "--once" in sys.argv else None)


if __name__ == "__main__":
    main()
