#!/usr/bin/env python3
"""The triage agent written with the OpenAI Agents SDK, run durably on
agentbay.

It runs the triage-external example release (agent `triage`): its model
turns go through the site's routing (the release's scripted model in the
demo), its tool through the appliance's gate as the release's
`lookup-ticket` (a read the agent marks `needs_approval`: a reviewer
approves the call, with its arguments, in the console's inbox). Kill the
worker after the tool call and another one finishes the run without
calling the model or the tool again.

    pip install --no-index --find-links /usr/share/agentbay/python 'agentbay[openai-agents]'
    AGENTBAY_URL=https://127.0.0.1:8443 AGENTBAY_CA=agentbay-data/tls/ca.pem \
    AGENTBAY_CLIENT_ID=demo.... AGENTBAY_CLIENT_SECRET=... \
    python3 triage_agent.py [--once]
"""

import json
import logging
import sys

from agents import Agent, function_tool

from agentbay import Worker, current_fence
from agentbay.openai_agents import handler


@function_tool(name_override="lookup-ticket", needs_approval=True)
def lookup_ticket(customer: str) -> str:
    """Recent tickets of a customer."""
    # A real tool sends the call's fence to the ticket service, which
    # refuses a fencing token lower than one it has seen for the attempt.
    assert current_fence().headers()["Agentbay-Call-Id"]
    return json.dumps({"customer": customer, "open": 2, "latest": "checkout slow since 09:10"})


triage = Agent(
    name="triage",
    instructions="Look up the customer's recent tickets, then answer with the verdict as JSON: "
                 "severity (low, medium or high), summary, paged.",
    tools=[lookup_ticket],
)


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    Worker(agent="triage").run(
        handler(triage, side_effect_classes={"lookup-ticket": "read"}),
        max_attempts=1 if "--once" in sys.argv else None,
    )


if __name__ == "__main__":
    main()
