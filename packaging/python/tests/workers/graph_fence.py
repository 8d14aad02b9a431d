"""The example graph with a lookup-ticket tool that reaches a site service
(the test's HTTP server at FENCE_URL): it declares the fence as an
injected argument and sends its headers; a second request carries the
fence read from current_fence()."""

import importlib.util
import json
import logging
import os
import sys
import urllib.request
from pathlib import Path
from typing import Annotated

from langchain_core.tools import InjectedToolArg, tool

spec = importlib.util.spec_from_file_location(
    "triage_graph", Path(__file__).resolve().parents[4] / "packaging/examples/langgraph/triage_graph.py"
)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

from agentbay import Fence  # noqa: E402
from agentbay.langgraph import agentbay_tools, current_fence, run_graph  # noqa: E402


def post(path: str, headers: dict, body: dict) -> dict:
    request = urllib.request.Request(
        os.environ["FENCE_URL"] + path, data=json.dumps(body).encode(),
        headers={**headers, "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.load(r)


@tool("lookup-ticket")
def lookup_ticket(customer: str, fence: Annotated[Fence, InjectedToolArg]) -> dict:
    """Recent tickets of a customer."""
    post("/context", current_fence().headers(), {"customer": customer})
    return post("/tickets", fence.headers(), {"customer": customer})


example.TOOLS = agentbay_tools([lookup_ticket], {"lookup-ticket": "read"})

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    run_graph(example.build(), agent="triage", input=example.to_messages,
              output=lambda values: values["verdict"], max_attempts=1)
