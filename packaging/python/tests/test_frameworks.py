"""Agents written with the OpenAI Agents SDK and Pydantic AI, run durably
on the real appliance: model turns through the site's model server (the
release's profile mapped to it), tools through the gate to a site service
that checks fences, approvals as decisions, a worker killed between two
steps and its attempt finished by another with no model turn or tool call
made twice (counted at the model server and the service)."""

from __future__ import annotations

import json
import signal

import pytest
from conftest import TESTS, attempts, run_of, spawn, submit, wait_for

from agentbay.runs.v1 import runs_pb2


def waiting(operator, run_id: str, kind: str, worker=None):
    def check():
        if worker is not None and worker.poll() is not None:
            raise AssertionError(f"the worker ended: {worker.stdout.read()}")
        for a in attempts(operator, run_id):
            if a.state == "WaitingForDecision" and a.pending_decision.kind == kind:
                return a
        return None

    return wait_for(f"a {kind} decision", check)


def approve(operator, run_id: str, tool: str, arguments: dict, worker) -> None:
    a = waiting(operator, run_id, "approval", worker)
    assert a.pending_decision.proposed_call.target == tool, a.pending_decision
    assert json.loads(a.pending_decision.proposed_call.arguments_json) == arguments
    operator.runs.decide_approval(
        runs_pb2.DecideApprovalRequest(decision_id=a.pending_decision_id, approve=True, reason="looks right")
    )


def finished(operator, run_id: str, worker, site, turns_before: int) -> None:
    out, _ = worker.communicate(timeout=120)
    assert "WORKER DONE" in out, out
    run = wait_for("the run to end", lambda: (r := run_of(operator, run_id)).state in ("Succeeded", "Failed") and r)
    assert run.state == "Succeeded", (run.state, out)
    assert json.loads(run.output_json) == site.VERDICT
    (a,) = attempts(operator, run_id)
    return a, out


FRAMEWORKS = [
    pytest.param("openai_agent.py", 3, id="openai-agents"),
    pytest.param("pydantic_agent.py", 2, id="pydantic-ai"),
]


@pytest.mark.parametrize("script,turns", FRAMEWORKS)
def test_an_agent_runs_through_a_tool_an_approval_and_model_turns_to_one_outcome(
    site_appliance, model_site, script, turns
):
    pytest.importorskip("agents" if script.startswith("openai") else "pydantic_ai")
    appliance = site_appliance
    cred = appliance.client_credential("demo", "factory.runs.execute")
    operator_cred = appliance.client_credential("demo", "factory.runs.read", "factory.runs.write", "factory.runs.decide")
    env = {**appliance.env(cred), "TICKETS_URL": model_site.url}
    with appliance.client(operator_cred) as operator:
        run_id = submit(operator, customer="acme", text="checkout is slow")
        turns_before, tools_before = model_site.completed_turns(), len(model_site.tool_calls)
        worker = spawn(TESTS / "workers" / script, env)
        try:
            # The tool needs approval (the agent says so; the policy allows
            # reads): the reviewer approves this exact call.
            approve(operator, run_id, "lookup-ticket", {"customer": "acme"}, worker)
            a, out = finished(operator, run_id, worker, model_site, turns_before)
        finally:
            worker.kill()
        assert (a.model_calls, a.tool_calls) == (turns, 1), a
        assert model_site.completed_turns() - turns_before == turns
        (call,) = model_site.tool_calls[tools_before:]
        # The service saw the call's fence.
        assert call["attempt"] == a.attempt_id and call["token"] == a.fencing_token and call["call"]
        run = run_of(operator, run_id)
        assert [s.state for s in run.steps] == ["Succeeded"]
        assert "claimed attempt" in out or "attempt" in out


@pytest.mark.parametrize("script,turns", FRAMEWORKS)
def test_an_agent_killed_between_two_steps_resumes_on_another_worker_repeating_nothing(
    site_appliance, model_site, script, turns
):
    pytest.importorskip("agents" if script.startswith("openai") else "pydantic_ai")
    appliance = site_appliance
    cred = appliance.client_credential("demo", "factory.runs.execute")
    operator_cred = appliance.client_credential("demo", "factory.runs.read", "factory.runs.write", "factory.runs.decide")
    env = {**appliance.env(cred), "TICKETS_URL": model_site.url}
    with appliance.client(operator_cred) as operator:
        run_id = submit(operator, customer="acme", text="checkout is slow")
        turns_before, tools_before = model_site.completed_turns(), len(model_site.tool_calls)
        first = spawn(TESTS / "workers" / script, {**env, "KILL_AFTER_TOOL": "1"})
        try:
            approve(operator, run_id, "lookup-ticket", {"customer": "acme"}, first)
            for line in first.stdout:
                if line.startswith("KILL-POINT"):
                    break
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        finally:
            first.kill()
        (a,) = attempts(operator, run_id)
        assert (a.model_calls, a.tool_calls) == (1, 1), a

        second = spawn(TESTS / "workers" / script, env)
        try:
            appliance.advance(61)  # the killed worker's lease lapses
            a, out = finished(operator, run_id, second, model_site, turns_before)
        finally:
            second.kill()
        # Every model turn and the tool call were made once, across both
        # workers: the second answered the first's from the records.
        assert (a.model_calls, a.tool_calls) == (turns, 1), a
        assert model_site.completed_turns() - turns_before == turns
        assert len(model_site.tool_calls) - tools_before == 1
        assert a.fencing_token == 2
