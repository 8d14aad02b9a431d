"""LangGraph on agentbay: the example graph against the demo's scripted
model, through an approval given over the API, a worker killed between two
nodes, its checkpoints on the console's page, a re-run from one of them."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import urllib.parse
import urllib.request
import ssl

import pytest
from conftest import EXAMPLES, TESTS, attempts, kill_at, run_of, sign_in, spawn, submit, wait_for

from agentbay.runs.v1 import runs_pb2
from agentbay.runtime.v1 import runtime_pb2

pytest.importorskip("langgraph")

GRAPH = EXAMPLES / "langgraph" / "triage_graph.py"


def the_attempt(operator, run_id):
    (a,) = attempts(operator, run_id)
    return a


def confirm(operator, run_id) -> None:
    def pending():
        a = the_attempt(operator, run_id)
        return a if a.state == "WaitingForDecision" else None

    a = wait_for("the reviewer's question", pending)
    assert a.pending_decision.kind == "escalation"
    assert a.pending_decision.options == ["confirm", "escalate"]
    assert a.pending_decision.summary.startswith("Confirm severity medium")
    operator.runtime.answer_decision(
        runtime_pb2.AnswerDecisionRequest(attempt_id=a.attempt_id, decision_id=a.pending_decision_id, choice="confirm")
    )


def test_the_example_graph_runs_to_succeeded_through_an_approval(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="checkout is slow")
    worker = spawn(GRAPH, appliance.env(adapter_cred), "--once")
    try:
        confirm(operator, run_id)
        out, _ = worker.communicate(timeout=120)
    finally:
        worker.kill()
    assert "VERIFIED -> Succeeded" in out, out
    run = run_of(operator, run_id)
    assert run.state == "Succeeded"
    assert json.loads(run.output_json) == {
        "severity": "medium", "summary": "Checkout latency for one customer; no outage.", "paged": False,
    }
    a = the_attempt(operator, run_id)
    assert (a.model_calls, a.tool_calls) == (2, 1)

    # The attempt's page draws the graph from the compiled one: its nodes,
    # where each goes (conditional edges marked), and what ran last.
    opener, cookie = sign_in(appliance)
    page = opener.open(urllib.request.Request(f"{appliance.url}/attempts/{a.attempt_id}",
                                              headers={"Cookie": cookie})).read().decode()
    graph = page.split('id="graph"', 1)[1].split("</section>", 1)[0]
    for node in ("__start__", "plan", "tools", "review", "__end__"):
        assert f"<code>{node}</code>" in graph, graph
    rows = {
        row.split("<td><code>", 1)[1].split("</code>", 1)[0]: row
        for row in graph.split("<tr")[1:] if "<td><code>" in row
    }
    assert "<code>tools</code> <span class=\"muted\">(if)</span>" in rows["plan"], rows["plan"]
    assert "<code>review</code>" in rows["plan"], rows["plan"]
    assert "<code>plan</code>" in rows["tools"], rows["tools"]
    # The graph ended with the reviewer's node.
    assert rows["review"].startswith(' class="lit"'), rows
    assert not rows["plan"].startswith(' class="lit"'), rows


def test_a_graph_killed_between_two_nodes_resumes_on_another_worker(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="checkout is slow")
    env = appliance.env(adapter_cred)
    # The first worker is killed with SIGKILL right after the tool node's
    # checkpoint: between the tool call and the second model turn.
    kill_at(spawn(TESTS / "workers" / "graph_kill.py", env))
    a = the_attempt(operator, run_id)
    assert (a.model_calls, a.tool_calls) == (1, 1), a
    checkpoints_before = a.checkpoints

    second = spawn(GRAPH, env, "--once")
    try:
        appliance.advance(61)  # the killed worker's attempt lease lapses
        confirm(operator, run_id)
        out, _ = second.communicate(timeout=120)
    finally:
        second.kill()
    assert "VERIFIED -> Succeeded" in out, out
    a = the_attempt(operator, run_id)
    assert a.state == "Succeeded"
    # The completed model turn and tool call were not made again.
    assert (a.model_calls, a.tool_calls) == (2, 1), a
    assert a.fencing_token == 2

    # Its checkpoints, the graph's state among them, on the console's page.
    opener, cookie = sign_in(appliance)
    page = opener.open(urllib.request.Request(f"{appliance.url}/attempts/{a.attempt_id}/checkpoints",
                                              headers={"Cookie": cookie})).read().decode()
    table = page.split('id="checkpoints"', 1)[1].split("</table>", 1)[0]
    sequences = [int(n) for n in re.findall(r'<td class="num">(\d+)</td>', table)]
    assert sequences == list(range(1, a.checkpoints + 1)), (sequences, a.checkpoints)
    # The saver's checkpoints are the graph's super-steps: phase Checkpointing.
    assert table.count("<td>Checkpointing</td>") >= 6, table[:3000]
    # Two checkpoints compared read as the graph: the nodes that ran and the
    # values, the serialized checkpoint named, never printed as base64.
    compared = opener.open(urllib.request.Request(
        f"{appliance.url}/attempts/{a.attempt_id}/checkpoints?from=2&to={a.checkpoints}",
        headers={"Cookie": cookie})).read().decode()
    assert "/latest/nodes" in compared and "/latest/values/" in compared, compared[-4000:]
    assert "(serialized data: " in compared, compared[-4000:]
    assert re.search(r"[A-Za-z0-9+/=]{200,}", compared) is None, "base64 on the page"

    # Re-run from a checkpoint taken before the reviewer's question: the
    # graph resumes from there (the model answers the last turn again,
    # the reviewer is asked again).
    rerun = operator.runs.rerun_from_checkpoint(
        runs_pb2.RerunFromCheckpointRequest(attempt_id=a.attempt_id, checkpoint_sequence=checkpoints_before)
    )
    new_run = rerun.run.run_id
    third = spawn(GRAPH, env, "--once")
    try:
        confirm(operator, new_run)
        out, _ = third.communicate(timeout=120)
    finally:
        third.kill()
    assert "VERIFIED -> Succeeded" in out, out
    b = the_attempt(operator, new_run)
    assert b.state == "Succeeded"
    # Only what came after the checkpoint ran again: one model turn.
    assert (b.model_calls, b.tool_calls) == (1, 0), b


def test_two_interrupts_in_one_node_are_two_questions(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="two questions")
    worker = spawn(TESTS / "workers" / "two_questions.py", appliance.env(adapter_cred))
    try:
        for summary, answer in (("First question?", "one"), ("Second question?", "two")):
            def asked(summary=summary):
                a = the_attempt(operator, run_id)
                return a if a.state == "WaitingForDecision" and a.pending_decision.summary == summary else None

            a = wait_for(summary, asked)
            operator.runtime.answer_decision(runtime_pb2.AnswerDecisionRequest(
                attempt_id=a.attempt_id, decision_id=a.pending_decision_id, answer_json=json.dumps(answer)))
        out, _ = worker.communicate(timeout=60)
    finally:
        worker.kill()
    run = run_of(operator, run_id)
    assert run.state == "Succeeded", out
    assert json.loads(run.output_json)["summary"] == "one/two"


def test_the_saver_s_async_forms_keep_and_read_the_graph(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="async")
    worker = spawn(TESTS / "workers" / "async_graph.py", appliance.env(adapter_cred))
    try:
        out, _ = worker.communicate(timeout=60)
    finally:
        worker.kill()
    run = run_of(operator, run_id)
    assert run.state == "Succeeded", out
    summary = json.loads(run.output_json)["summary"]
    # 5 steps: the input's checkpoint and one per step, newest first; each
    # checkpoint names its step, the node(s) that ran in it and the values
    # (readable JSON, beside the serialized checkpoint).
    assert summary == (
        "n=5 listed=7 newest_first=True "
        "story=-1:-:- 0:__start__:0 1:step:1 2:step:2 3:step:3 4:step:4 5:step:5"
    ), summary
    # Each put and each task's writes was a checkpoint of the attempt.
    assert the_attempt(operator, run_id).checkpoints >= 12


def test_a_langgraph_tool_sends_the_attempt_s_fence_to_a_site_service(appliance, adapter_cred, operator):
    seen: list[tuple[str, dict[str, str]]] = []

    class Service(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            body = json.dumps({"customer": "acme", "open": 2, "latest": "checkout slow since 09:10"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run_id = submit(operator, customer="acme", text="checkout is slow")
        env = {**appliance.env(adapter_cred), "FENCE_URL": f"http://127.0.0.1:{server.server_port}"}
        worker = spawn(TESTS / "workers" / "graph_fence.py", env)
        try:
            confirm(operator, run_id)
            out, _ = worker.communicate(timeout=120)
        finally:
            worker.kill()
    finally:
        server.shutdown()
    assert "VERIFIED -> Succeeded" in out, out
    a = the_attempt(operator, run_id)
    # The injected argument and current_fence() carry the same fence: the
    # attempt's, its current token, the call's id.
    assert [path for path, _ in seen] == ["/context", "/tickets"], seen
    for _, headers in seen:
        assert headers["agentbay-attempt-id"] == a.attempt_id, headers
        assert headers["agentbay-fencing-token"] == str(a.fencing_token), headers
        assert headers["agentbay-call-id"], headers
    assert seen[0][1]["agentbay-call-id"] == seen[1][1]["agentbay-call-id"]
