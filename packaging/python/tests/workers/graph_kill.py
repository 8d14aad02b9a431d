"""The example graph, but the worker stops dead when the second model turn
is about to start, after the tool node's checkpoint (the test kills it
there with SIGKILL): between two nodes."""

import importlib.util
import logging
import sys
import threading
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "triage_graph", Path(__file__).resolve().parents[4] / "packaging/examples/langgraph/triage_graph.py"
)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

from agentbay.langgraph import run_graph  # noqa: E402

plan = example.plan


def plan_or_stall(state):
    if any(m.type == "tool" for m in state["messages"]):
        print("KILL-POINT", flush=True)
        threading.Event().wait()
    return plan(state)


example.plan = plan_or_stall

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    run_graph(example.build(), agent="triage", input=example.to_messages,
              output=lambda values: values["verdict"], max_attempts=1)
