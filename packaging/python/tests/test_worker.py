"""The Worker against the real appliance: every move of an attempt, a
worker killed with SIGKILL and its attempt resumed by another, a stale
fence refused, the rewritten example adapter."""

from __future__ import annotations

import json
import signal
import ssl
import urllib.request

import pytest
from conftest import EXAMPLES, TESTS, attempts, run_of, spawn, submit, wait_for

import agentbay
from agentbay.adapter.v1 import adapter_pb2
from agentbay.runs.v1 import runs_pb2
from agentbay.runtime.v1 import runtime_pb2


def run_state(operator, run_id: str) -> str:
    return run_of(operator, run_id).state


def waiting(operator, run_id: str, kind: str):
    def check():
        for a in attempts(operator, run_id):
            if a.state == "WaitingForDecision" and a.pending_decision.kind == kind:
                return a
        return None

    return wait_for(f"a {kind} decision", check)


def events(operator, attempt_id: str) -> list[runtime_pb2.AttemptUpdate]:
    return list(operator.runtime.watch_attempt(runtime_pb2.WatchAttemptRequest(attempt_id=attempt_id)))


def finish(proc, timeout: float = 60) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def test_a_worker_drives_an_attempt_through_every_move_to_one_outcome(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="checkout is down")
    worker = spawn(TESTS / "workers" / "full.py", appliance.env(adapter_cred))
    try:
        question = waiting(operator, run_id, "input")
        assert "support tier" in question.pending_decision.summary
        # The schema travels apart from the question, as the builtin
        # loop's: the inbox answers it with a form, and checks the answer.
        assert json.loads(question.pending_decision.answer_schema_json)["required"] == ["tier"]
        with pytest.raises(agentbay.errors.InvalidArgument):
            operator.runtime.answer_decision(
                runtime_pb2.AnswerDecisionRequest(
                    attempt_id=question.attempt_id,
                    decision_id=question.pending_decision_id,
                    answer_json=json.dumps("about 40 users"),
                )
            )
        operator.runtime.answer_decision(
            runtime_pb2.AnswerDecisionRequest(
                attempt_id=question.attempt_id,
                decision_id=question.pending_decision_id,
                answer_json=json.dumps({"tier": "gold"}),
            )
        )
        approval = waiting(operator, run_id, "approval")
        assert approval.pending_decision.proposed_call.target == "page-oncall"
        assert json.loads(approval.pending_decision.proposed_call.arguments_json) == {"message": "outage at acme (gold)"}
        operator.runs.decide_approval(
            runs_pb2.DecideApprovalRequest(approval_id=approval.pending_decision.approval_id, approve=True, reason="real outage")
        )
        out = finish(worker)
    finally:
        worker.kill()
    assert worker.returncode == 0, out
    assert "VERIFIED -> Succeeded" in out, out
    assert run_state(operator, run_id) == "Succeeded"
    (attempt,) = attempts(operator, run_id)
    assert attempt.tool_calls == 2 and attempt.state == "Succeeded"
    # The worker says what it does, one line each.
    a = attempt.attempt_id
    for line in [
        "worker for agent triage: claiming up to",
        f"claimed attempt {a} of run {run_id}",
        f"attempt {a} waits for decision",
        "answered by",
        f"attempt {a} resumes with the answer",
        f"attempt {a} reported its output: VERIFIED -> Succeeded",
        "worker for agent triage stops: 1 attempt reached an outcome here",
    ]:
        assert line in out, (line, out)
    output = json.loads(operator.runs.get_run(runs_pb2.GetRunRequest(run_id=run_id)).run.output_json)
    assert output == {"severity": "high", "summary": "2 open tickets, tier gold", "paged": True}
    topics = [e.topic for e in events(operator, attempt.attempt_id)]
    assert topics.count("execution.attempts.v1.attempt-outcome-reported") == 1, topics
    assert topics.count("execution.attempts.v1.attempt-decision-requested") == 2, topics


def test_a_killed_worker_s_attempt_resumes_on_another_from_its_last_checkpoint(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="globex", text="slow")
    env = appliance.env(adapter_cred)
    first = spawn(TESTS / "workers" / "crash.py", env, "--stall")
    lines: list[str] = []
    try:
        for line in first.stdout:
            lines.append(line)
            if line.startswith("STEP 2"):
                break
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        first.kill()
    assert any(line.startswith("STEP 2") for line in lines), "".join(lines)
    stale_token = int(lines[-1].split("token=")[1].split()[0])
    attempt_id = lines[-1].split("attempt=")[1].strip()

    # Nobody heartbeats any more: once the attempt lease lapses (the
    # appliance's clock moves past runtime.attempt_lease_seconds, 60 s),
    # another worker takes it over.
    second = spawn(TESTS / "workers" / "crash.py", env)
    appliance.advance(61)
    out = finish(second)
    assert second.returncode == 0, out
    start = next(line for line in out.splitlines() if line.startswith("START"))
    assert "resumed=True" in start and "done=[1, 2]" in start, "".join(lines) + out
    # Steps 1 and 2 were not called again: only 3 and 4 in this process.
    assert "CALLS [3, 4]" in out, out
    assert run_state(operator, run_id) == "Succeeded"
    (attempt,) = attempts(operator, run_id)
    assert attempt.attempt_id == attempt_id
    assert attempt.tool_calls == 4
    assert attempt.fencing_token > stale_token

    # The killed worker's fence is stale now: refused, and recorded.
    with appliance.client(adapter_cred) as c:
        with pytest.raises(agentbay.Aborted) as refused:
            c.adapter.checkpoint(
                adapter_pb2.CheckpointRequest(attempt_id=attempt_id, fencing_token=stale_token, state_json="{}")
            )
    assert refused.value.code == "aborted"
    assert "token" in refused.value.message


def test_the_example_adapter_runs_a_run_end_to_end(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="checkout is down")
    worker = spawn(EXAMPLES / "adapter" / "triage_adapter.py", appliance.env(adapter_cred), "--once")
    try:
        approval = waiting(operator, run_id, "approval")
        operator.runs.decide_approval(
            runs_pb2.DecideApprovalRequest(approval_id=approval.pending_decision.approval_id, approve=True, reason="real outage")
        )
        out = finish(worker)
    finally:
        worker.kill()
    assert "VERIFIED -> Succeeded" in out, out
    run = operator.runs.get_run(runs_pb2.GetRunRequest(run_id=run_id)).run
    assert run.state == "Succeeded"
    assert json.loads(run.output_json)["paged"] is True
    (attempt,) = [a for s in run.steps for a in s.attempts]
    assert attempt.model_calls == 1


def test_sigterm_stops_claiming_and_hands_the_attempt_back(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="umbrella", text="slow")
    env = appliance.env(adapter_cred)
    worker = spawn(TESTS / "workers" / "busy.py", env)
    try:
        for line in worker.stdout:
            if line.startswith("TICKING"):
                break
        worker.send_signal(signal.SIGTERM)
        out = finish(worker, timeout=15)
    finally:
        worker.kill()
    assert worker.returncode == 0, out
    assert "handed back (stopping)" in out, out
    assert "1 handed back, resumed by another worker from their last checkpoint" in out, out
    (attempt,) = attempts(operator, run_id)
    assert attempt.state == "Running"  # not ended: handed back
    ticks = attempt.checkpoints

    second = spawn(TESTS / "workers" / "busy.py", env, "--finish")
    appliance.advance(61)
    out = finish(second)
    assert second.returncode == 0, out
    start = next(line for line in out.splitlines() if line.startswith("START"))
    assert "resumed=True" in start and "ticks=0" not in start, out
    assert run_state(operator, run_id) == "Succeeded"
    (attempt,) = attempts(operator, run_id)
    assert attempt.checkpoints > ticks


def test_a_cancel_reaches_the_handler_at_its_next_move(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="hooli", text="slow")
    worker = spawn(TESTS / "workers" / "busy.py", appliance.env(adapter_cred))
    try:
        for line in worker.stdout:
            if line.startswith("TICKING"):
                break
        operator.runs.cancel_run(runs_pb2.CancelRunRequest(run_id=run_id, reason="not needed"))
        for line in worker.stdout:
            if "stopped:" in line:
                break
        else:
            pytest.fail("the worker never saw the cancel")
    finally:
        worker.kill()
    assert wait_for("the run cancelled", lambda: run_state(operator, run_id) == "Cancelled")


def test_a_sub_agent_runs_and_its_output_comes_back(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme-corp", text="checkout is slow")
    worker = spawn(TESTS / "workers" / "delegate.py", appliance.env(adapter_cred))
    try:
        out = finish(worker, timeout=120)
    finally:
        worker.kill()
    assert worker.returncode == 0, out
    run = operator.runs.get_run(runs_pb2.GetRunRequest(run_id=run_id)).run
    assert run.state == "Succeeded", out
    output = json.loads(run.output_json)
    assert output["summary"].startswith("delegated: "), output
    # The child: a run of the builtin triage release under this run, which
    # succeeded with the output the parent reported.
    children = [r for r in operator.runs.list_runs(runs_pb2.ListRunsRequest(release_id="triage-1.0.0")).runs
                if r.parent_run_id == run_id]
    assert len(children) == 1, children
    child = operator.runs.get_run(runs_pb2.GetRunRequest(run_id=children[0].run_id)).run
    assert child.state == "Succeeded" and child.depth == 1
    assert output["summary"] == "delegated: " + json.loads(child.output_json)["summary"]


def test_usage_of_reads_a_completion_a_stream_and_a_langchain_message():
    completion = {"usage": {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}}
    assert agentbay.usage_of(completion) == (10, 3, 4)
    stream = [{"choices": [{"delta": {"content": "a"}}]}, {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}]
    assert agentbay.usage_of(stream) == (7, 2, 0)
    message = {"usage_metadata": {"input_tokens": 5, "output_tokens": 1, "input_token_details": {"cache_read": 2}}}
    assert agentbay.usage_of(message) == (5, 1, 2)
    assert agentbay.usage_of({"choices": []}) == (0, 0, 0)


def test_an_adapters_own_model_call_is_charged_with_the_usage_its_stream_reported(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="checkout is slow")
    out = finish(spawn(TESTS / "workers" / "own_model.py", appliance.env(adapter_cred)))
    assert run_state(operator, run_id) == "Succeeded", out
    run = run_of(operator, run_id)
    assert (run.tokens.input_tokens, run.tokens.output_tokens, run.tokens.cached_tokens) == (812, 64, 512)
    attempt = attempts(operator, run_id)[0]
    assert attempt.tokens.total_tokens == 876
    usage = operator.runs.get_usage(runs_pb2.GetUsageRequest(group_by="agent"))
    assert [(r.agent_id, r.usage.total_tokens) for r in usage.rows] == [("triage", usage.total.total_tokens)]
    assert usage.total.total_tokens >= 876


def test_a_bug_in_the_handler_fails_once_as_the_agents_own_with_its_traceback(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="checkout is slow")
    worker = spawn(TESTS / "workers" / "buggy.py", appliance.env(adapter_cred))
    out = finish(worker)
    assert "raised" in out and "KeyError" in out, out
    run = wait_for("the run to fail", lambda: (r := run_of(operator, run_id)).state == "Failed" and r)
    # A deterministic bug is not retried as if the machine had failed: the
    # release allows two attempts, and one was made.
    tried = [a for s in run.steps for a in s.attempts]
    assert len(tried) == 1, tried
    assert tried[0].failure_class == "agent"
    assert "KeyError: 'customer_name'" in tried[0].failure_reason
    # The traceback reached the appliance and is kept with the attempt.
    tls = ssl.create_default_context(cafile=appliance.ca)
    get = urllib.request.Request(
        f"{appliance.url}/runtime/attempts/{tried[0].attempt_id}",
        headers={"Authorization": f"Bearer {operator.tokens.get()}"},
    )
    with urllib.request.urlopen(get, context=tls) as r:
        error = json.loads(r.read())["outcome"]["error"]
    assert error["errorType"] == "KeyError"
    assert "customer_name" in error["message"]
    assert 'ticket["customer_name"]' in error["traceback"] and "in summarise" in error["traceback"], error


def test_an_input_the_release_does_not_declare_is_refused_naming_each_field(operator):
    with pytest.raises(agentbay.InvalidArgument) as e:
        operator.runs.submit_run(runs_pb2.SubmitRunRequest(project_id="support", release_id="triage-external-1.0.0", input_json="{}"))
    fields = {v.field for v in e.value.field_violations}
    assert fields == {"inputJson.customer", "inputJson.text"}, e.value.field_violations


def test_an_approval_with_changed_arguments_is_the_call_the_handler_makes(appliance, adapter_cred, operator):
    run_id = submit(operator, customer="acme", text="checkout is down")
    worker = spawn(TESTS / "workers" / "page.py", appliance.env(adapter_cred))
    approval = waiting(operator, run_id, "approval")
    assert json.loads(approval.pending_decision.proposed_call.arguments_json) == {"message": "outage at acme"}
    operator.runs.decide_approval(
        runs_pb2.DecideApprovalRequest(
            decision_id=approval.pending_decision_id, approve=True, reason="name the service",
            arguments_json=json.dumps({"message": "checkout outage at acme: page the payments team"}),
        )
    )
    out = finish(worker)
    assert "PAGED checkout outage at acme: page the payments team" in out, out
    assert "PAGED outage at acme\n" not in out, out
    assert wait_for("the run to succeed", lambda: run_of(operator, run_id).state == "Succeeded")
