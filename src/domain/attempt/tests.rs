use chrono::{Duration, TimeZone, Utc};
use proptest::prelude::*;

use super::*;
use crate::domain::release::AttemptLimits;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 1, 8, 0, 0).unwrap()
}

fn limits() -> AttemptLimits {
    AttemptLimits {
        max_minutes: 10,
        max_model_calls: 3,
        max_tool_calls: 3,
        max_context_tokens: 1000,
        max_sub_agent_depth: 1,
        max_total_tokens: 0,
    }
}

/// A new attempt of tenant acme (also the store's tests' sample).
pub(crate) fn attempt() -> ExecutionAttempt {
    ExecutionAttempt::new(
        NewAttempt {
            attempt_id: Uuid::now_v7(),
            run_id: Uuid::now_v7(),
            step_id: Uuid::now_v7(),
            number: 1,
            tenant_id: TenantId::parse("acme").unwrap(),
            project_id: ProjectId::parse("ops").unwrap(),
            environment_id: None,
            fencing_token: 1,
            snapshot_id: Uuid::now_v7(),
            release_id: "triage@1.0.0".into(),
            agent_id: "triage".into(),
            model_profile_id: "local".into(),
            adapter: AdapterKind::External,
            adapter_version: "external/1".into(),
            checkpoint_format: 1,
            limits: limits(),
            max_corrections: 2,
            depth: 0,
            ancestors: Vec::new(),
        },
        t0(),
    )
}

fn running() -> ExecutionAttempt {
    let mut a = attempt();
    a.capacity_granted = true;
    a.claim("adapter-1", None, Duration::seconds(60), t0())
        .unwrap();
    a.start(None, t0()).unwrap();
    a
}

fn tool(class: SideEffectClass) -> CallStart {
    CallStart {
        call_id: Uuid::now_v7(),
        kind: CallKind::Tool,
        target: "search".into(),
        side_effect_class: Some(class),
        request_hash: "sha256:req".into(),
        policy_decision_id: Some(Uuid::now_v7()),
        policy_rule: Some(PolicyRule::Allow),
        approval_id: None,
        context_tokens: None,
        pre_checkpoint_id: None,
        context_since: None,
        timeout_seconds: Some(30),
    }
}

fn model(tokens: u32) -> CallStart {
    CallStart {
        kind: CallKind::Model,
        target: "local".into(),
        side_effect_class: None,
        context_tokens: Some(tokens),
        ..tool(SideEffectClass::Read)
    }
}

fn ok() -> CallResult {
    CallResult {
        ok: true,
        result_hash: Some("sha256:res".into()),
        receipt_ref: Some("sha256:rcpt".into()),
        error: None,
        served_by: None,
        usage: None,
        latency_ms: None,
    }
}

fn interrupt(source: InterruptSource) -> InterruptRequest {
    InterruptRequest {
        requested_at: t0(),
        by: "ops".into(),
        reason: "stop".into(),
        source,
    }
}

#[test]
fn the_state_machine_has_exactly_the_specified_edges() {
    use AttemptState::*;
    let spec = [
        (Claimed, Running),
        (Running, WaitingForTool),
        (WaitingForTool, Running),
        (Running, WaitingForDecision),
        (WaitingForDecision, Running),
        (Running, Paused),
        (Paused, Running),
        (Running, Succeeded),
        (Running, Failed),
        (Running, TimedOut),
        (WaitingForDecision, Failed),
        (Running, Cancelled),
        (WaitingForTool, Cancelled),
        (WaitingForDecision, Cancelled),
        (WaitingForTool, Uncertain),
        (Claimed, Cancelled),
        (Claimed, Failed),
        (Paused, Cancelled),
    ];
    for from in AttemptState::ALL {
        for to in AttemptState::ALL {
            assert_eq!(
                from.edge(to).is_some(),
                spec.contains(&(from, to)),
                "{from} -> {to}"
            );
        }
        if from.is_terminal() {
            assert!(AttemptState::ALL.iter().all(|to| from.edge(*to).is_none()));
        }
    }
}

#[test]
fn a_happy_attempt_reports_one_verified_outcome() {
    let mut a = running();
    let (mut rec, _) = a.begin_call(model(200), 2, t0()).unwrap();
    assert_eq!(a.state, AttemptState::Running);
    a.observe_call(&mut rec, ok(), t0()).unwrap();
    assert_eq!(rec.status, CallStatus::Completed);
    let (mut rec, _) = a.begin_call(tool(SideEffectClass::Read), 2, t0()).unwrap();
    assert_eq!(a.state, AttemptState::WaitingForTool);
    a.observe_call(&mut rec, ok(), t0()).unwrap();
    let (cp, _) = a
        .checkpoint(
            Uuid::now_v7(),
            CheckpointReason::AfterObservation,
            "sha256:s".into(),
            None,
            t0(),
        )
        .unwrap();
    assert_eq!(cp.sequence, 1);
    assert_eq!(cp.hash, cp.compute_hash());
    let report = report_hash(a.attempt_id, true, Some("sha256:out"), None, None);
    let (verdict, events) = a
        .report_success("sha256:out".into(), &[], None, report.clone(), t0())
        .unwrap();
    assert_eq!(verdict, Verdict::Verified);
    assert_eq!(a.state, AttemptState::Succeeded);
    assert!(a.outcome_hash.is_some());
    assert!(
        events
            .iter()
            .any(|e| e.topic.ends_with("attempt-outcome-reported"))
    );
    a.check_repeat_report(&report).unwrap();
    let other = report_hash(
        a.attempt_id,
        false,
        None,
        Some(FailureClass::Transient),
        Some("x"),
    );
    let err = a.check_repeat_report(&other).unwrap_err();
    assert!(err.to_string().contains("already reported"), "{err}");
}

#[test]
fn corrections_stop_at_the_maximum_with_the_feedback() {
    let mut a = running();
    for left in [1, 0] {
        let (verdict, _) = a
            .report_success(
                "sha256:o".into(),
                &["severity: missing".into()],
                None,
                "h".into(),
                t0(),
            )
            .unwrap();
        assert_eq!(
            verdict,
            Verdict::Correct {
                feedback: "severity: missing".into(),
                left
            }
        );
    }
    let (verdict, _) = a
        .report_success(
            "sha256:o".into(),
            &["severity: missing".into()],
            Some("sha256:fb".into()),
            "h".into(),
            t0(),
        )
        .unwrap();
    assert!(matches!(verdict, Verdict::Exhausted { .. }));
    assert_eq!(a.state, AttemptState::Failed);
    let failure = a.failure.clone().unwrap();
    assert_eq!(failure.class, FailureClass::Validation);
    assert_eq!(failure.feedback_ref.as_deref(), Some("sha256:fb"));
    assert!(
        failure.reason.contains("severity: missing"),
        "{}",
        failure.reason
    );
    assert_eq!(a.correction_count, 2);
}

#[test]
fn limits_are_named_when_reached() {
    let mut a = running();
    for _ in 0..3 {
        let (mut rec, _) = a.begin_call(model(10), 2, t0()).unwrap();
        a.observe_call(&mut rec, ok(), t0()).unwrap();
    }
    let Err(CallError::Limit(limit)) = a.begin_call(model(10), 2, t0()) else {
        panic!("the fourth model call must be refused");
    };
    assert_eq!(limit.limit, "maxModelCalls");
    let mut a = running();
    let Err(CallError::Limit(limit)) = a.begin_call(model(5000), 2, t0()) else {
        panic!("too much context must be refused");
    };
    assert_eq!(limit.limit, "maxContextTokens");
    let mut sub = tool(SideEffectClass::Read);
    sub.kind = CallKind::SubAgent;
    a.depth = 1;
    let Err(CallError::Limit(limit)) = a.begin_call(sub, 2, t0()) else {
        panic!("depth must be refused");
    };
    assert_eq!(limit.limit, "maxSubAgentDepth");
}

#[test]
fn model_calls_charge_their_tokens_and_the_token_budget_times_the_attempt_out() {
    let mut a = attempt();
    a.limits.max_total_tokens = 1000;
    a.capacity_granted = true;
    a.claim("adapter-1", None, Duration::seconds(60), t0())
        .unwrap();
    a.start(None, t0()).unwrap();
    let (mut rec, _) = a.begin_call(model(100), 2, t0()).unwrap();
    let answered = CallResult {
        usage: Some(TokenUsage::call(400, 200, 50)),
        latency_ms: Some(1500),
        ..ok()
    };
    a.observe_call(&mut rec, answered, t0() + Duration::seconds(2))
        .unwrap();
    assert_eq!(rec.usage, Some(TokenUsage::call(400, 200, 50)));
    assert_eq!(rec.latency_ms, Some(1500));
    assert_eq!(a.usage.tokens.total(), 600);
    // A tool call's result charges nothing, whatever it says.
    let (mut t, _) = a.begin_call(tool(SideEffectClass::Read), 2, t0()).unwrap();
    let with_usage = CallResult {
        usage: Some(TokenUsage::call(9, 9, 0)),
        ..ok()
    };
    a.observe_call(&mut t, with_usage, t0() + Duration::seconds(3))
        .unwrap();
    assert_eq!(t.usage, None);
    assert_eq!(
        t.latency_ms,
        Some(3000),
        "start to result when not measured"
    );
    assert_eq!(a.usage.tokens.model_calls, 1);
    // 600 used + 500 declared would pass 1000: not made.
    let Err(CallError::Limit(limit)) = a.begin_call(model(500), 2, t0()) else {
        panic!("the token budget must refuse the call");
    };
    assert_eq!(limit.limit, "maxTotalTokens");
    assert_eq!(limit.ends_as(), AttemptState::TimedOut);
    assert!(
        limit.reason.contains("600 tokens used by 1 model calls"),
        "{}",
        limit.reason
    );
    let failure = AttemptFailure {
        class: FailureClass::Budget,
        reason: limit.reason.clone(),
        feedback_ref: None,
        detail_ref: None,
    };
    a.end_as(limit.ends_as(), failure, None, t0()).unwrap();
    assert_eq!(a.state, AttemptState::TimedOut);
    // 400 declared fits.
    let mut b = running();
    b.limits.max_total_tokens = 1000;
    b.usage.tokens = TokenUsage::call(400, 200, 0);
    assert!(b.begin_call(model(400), 2, t0()).is_ok());
}

#[test]
fn a_quota_pause_waits_for_the_quota_not_for_a_renewal() {
    let mut a = running();
    let until = Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap();
    let (_, why) = a
        .pause_for_quota(&"tokensPerDay of project ops: 10 of 10 used today", t0())
        .unwrap();
    assert_eq!(a.state, AttemptState::Paused);
    assert_eq!(a.quota_paused_until, Some(until), "the next UTC day");
    assert!(
        why.contains("no model call until 2026-11-02T00:00:00+00:00"),
        "{why}"
    );
    assert!(matches!(a.gate(), Err(Gate::Paused(why)) if why.contains("tokensPerDay")));
    // A lease renewal does not end a quota pause.
    a.renewed(t0()).unwrap();
    assert_eq!(a.state, AttemptState::Paused);
    // The day turned and the quota still refuses: the next day.
    a.quota_still_out(&"still", until);
    assert_eq!(a.quota_paused_until, Some(until + Duration::days(1)));
    a.quota_resumed(until).unwrap();
    assert_eq!(a.state, AttemptState::Running);
    assert_eq!(a.quota_paused_until, None);
    assert!(a.gate().is_ok());
    // Not from another state.
    let mut idle = attempt();
    assert!(idle.pause_for_quota(&"x", t0()).is_err());
}

#[test]
fn max_minutes_counts_active_time_only() {
    let mut a = running();
    let deadline = a.budget_deadline().unwrap();
    assert_eq!(deadline, t0() + Duration::minutes(10));
    let (_, _) = a
        .request_decision(
            Uuid::now_v7(),
            DecisionKind::Input,
            None,
            None,
            None,
            "which queue?".into(),
            vec![],
            None,
            Duration::minutes(5),
            t0() + Duration::minutes(4),
        )
        .unwrap();
    assert_eq!(a.budget_deadline(), None);
    assert_eq!(a.active_ms(t0() + Duration::hours(1)), 4 * 60_000);

    // Waiting for a delegated child run does not count either; a tool
    // call does.
    let mut a = running();
    let mut sub = tool(SideEffectClass::Read);
    sub.kind = CallKind::SubAgent;
    sub.timeout_seconds = None;
    let (mut rec, _) = a.begin_call(sub, 2, t0() + Duration::minutes(1)).unwrap();
    assert_eq!(a.state, AttemptState::WaitingForTool);
    assert_eq!(a.budget_deadline(), None, "the clock stops for the child");
    a.observe_call(&mut rec, ok(), t0() + Duration::minutes(50))
        .unwrap();
    assert_eq!(a.active_ms(t0() + Duration::minutes(52)), 3 * 60_000);
    let (mut rec, _) = a
        .begin_call(tool(SideEffectClass::Read), 2, t0() + Duration::minutes(52))
        .unwrap();
    a.observe_call(&mut rec, ok(), t0() + Duration::minutes(54))
        .unwrap();
    assert_eq!(a.active_ms(t0() + Duration::minutes(54)), 5 * 60_000);
}

#[test]
fn a_timed_out_read_fails_and_a_timed_out_write_is_uncertain() {
    let mut a = running();
    let (mut rec, _) = a.begin_call(tool(SideEffectClass::Read), 2, t0()).unwrap();
    let id = rec.call_id;
    let due = a.open_call.as_ref().unwrap().timeout_at.unwrap();
    assert_eq!(due, t0() + Duration::seconds(30));
    a.call_timed_out(Some(&mut rec), id, "tool search timed out after 30 s", due)
        .unwrap();
    assert_eq!(rec.status, CallStatus::Failed);
    assert_eq!(
        rec.error.as_deref(),
        Some("tool search timed out after 30 s")
    );
    assert_eq!(a.state, AttemptState::Running);
    assert!(a.open_call.is_none());
    // Settled once: a second timeout of it is refused.
    assert!(a.call_timed_out(Some(&mut rec), id, "again", due).is_err());

    let mut a = running();
    let (mut rec, _) = a
        .begin_call(tool(SideEffectClass::SharedWrite), 2, t0())
        .unwrap();
    let id = rec.call_id;
    a.call_timed_out(Some(&mut rec), id, "tool search timed out after 30 s", t0())
        .unwrap();
    assert_eq!(rec.status, CallStatus::Uncertain);
    assert_eq!(a.state, AttemptState::Uncertain);
    // A model call has no timeout of its own.
    let mut a = running();
    a.begin_call(model(10), 2, t0()).unwrap();
    assert!(a.open_call.as_ref().unwrap().timeout_at.is_none());
}

#[test]
fn an_interrupt_during_a_write_tool_call_is_uncertain_and_a_read_is_not() {
    let mut a = running();
    let (mut rec, _) = a
        .begin_call(tool(SideEffectClass::SharedWrite), 2, t0())
        .unwrap();
    a.request_interrupt(interrupt(InterruptSource::Interrupt), t0());
    assert!(matches!(a.gate(), Err(Gate::Interrupted)));
    a.observe_cancellation(Some(&mut rec), t0()).unwrap();
    assert_eq!(a.state, AttemptState::Uncertain);
    assert_eq!(rec.status, CallStatus::Uncertain);
    assert!(a.cancellation_observed_at.is_some());

    let mut a = running();
    let (mut rec, _) = a.begin_call(tool(SideEffectClass::Read), 2, t0()).unwrap();
    a.request_interrupt(interrupt(InterruptSource::RunCancelled), t0());
    a.observe_cancellation(Some(&mut rec), t0()).unwrap();
    assert_eq!(a.state, AttemptState::Cancelled);
    assert_eq!(rec.status, CallStatus::Abandoned);
}

#[test]
fn a_stale_token_is_refused_and_recorded() {
    let mut a = running();
    let err = a.check_fencing(0, "BeginCall", t0()).unwrap_err();
    assert!(matches!(err, DomainError::Aborted(_)));
    assert_eq!(a.stale_refusals.len(), 1);
    a.check_fencing(1, "BeginCall", t0()).unwrap();
}

#[test]
fn a_failed_renewal_pauses_at_the_next_checkpoint() {
    let mut a = running();
    a.renewal_failed("capacity lease renewal failed".into());
    assert_eq!(a.state, AttemptState::Running);
    a.checkpoint(
        Uuid::now_v7(),
        CheckpointReason::Cadence,
        "s".into(),
        None,
        t0(),
    )
    .unwrap();
    assert_eq!(a.state, AttemptState::Paused);
    assert!(matches!(a.gate(), Err(Gate::Paused(_))));
    a.renewed(t0()).unwrap();
    assert_eq!(a.state, AttemptState::Running);
}

#[test]
fn decisions_resume_or_fail() {
    let mut a = running();
    let (mut d, _) = a
        .request_decision(
            Uuid::now_v7(),
            DecisionKind::Escalation,
            None,
            None,
            None,
            "priority?".into(),
            vec!["p1".into(), "p2".into()],
            Some("p1".into()),
            Duration::minutes(5),
            t0(),
        )
        .unwrap();
    a.resolve_decision(
        &mut d,
        Resolution::Answered {
            by: "rev".into(),
            choice: Some("p2".into()),
            answer_ref: None,
        },
        t0(),
    )
    .unwrap();
    assert_eq!(a.state, AttemptState::Running);
    let (mut d, _) = a
        .request_decision(
            Uuid::now_v7(),
            DecisionKind::Input,
            None,
            None,
            None,
            "q".into(),
            vec![],
            None,
            Duration::minutes(5),
            t0(),
        )
        .unwrap();
    a.resolve_decision(&mut d, Resolution::Expired { minutes: 5 }, t0())
        .unwrap();
    assert_eq!(a.state, AttemptState::Failed);
    assert!(
        a.failure
            .as_ref()
            .unwrap()
            .reason
            .contains("InputTimeoutMinutes")
    );
}

#[test]
fn a_waiting_attempt_gives_capacity_back_and_makes_no_call_until_granted_again() {
    let mut a = running();
    let first = Uuid::now_v7();
    a.capacity_granted(first, t0());
    // Running: nothing to give back.
    assert_eq!(a.return_capacity("busy".into(), t0()), None);
    assert_eq!(a.idle_since(), None);
    let asked = t0() + Duration::seconds(5);
    let (mut d, _) = a
        .request_decision(
            Uuid::now_v7(),
            DecisionKind::Input,
            None,
            None,
            None,
            "which customer?".into(),
            vec![],
            None,
            Duration::minutes(60),
            asked,
        )
        .unwrap();
    assert_eq!(a.idle_since(), Some(asked));
    let later = asked + Duration::seconds(61);
    assert_eq!(a.return_capacity("waited".into(), later), Some(first));
    assert!(!a.capacity_granted);
    assert_eq!(a.capacity_lease_id, None);
    // Once given back, nothing more to give.
    assert_eq!(a.return_capacity("again".into(), later), None);
    assert!(!a.needs_capacity(), "it asks again only once answered");
    a.resolve_decision(
        &mut d,
        Resolution::Answered {
            by: "rev".into(),
            choice: None,
            answer_ref: Some("sha256:a".into()),
        },
        later,
    )
    .unwrap();
    assert_eq!(a.state, AttemptState::Running);
    assert!(a.needs_capacity());
    assert!(matches!(a.gate(), Err(Gate::NoCapacity(why)) if why.contains(&first.to_string())));
    assert!(a.waiting_reason().unwrap().contains("capacity again"));
    a.capacity_requested(later);
    let second = Uuid::now_v7();
    let granted = later + Duration::seconds(3);
    assert!(a.capacity_granted(second, granted).is_empty());
    assert_eq!(a.state, AttemptState::Running);
    assert_eq!(a.gate(), Ok(()));
    let gap = a.capacity_gaps.last().unwrap();
    assert_eq!(
        (
            gap.lease_id,
            gap.returned_at,
            gap.requested_at,
            gap.granted_at,
            gap.new_lease_id
        ),
        (first, later, Some(later), Some(granted), Some(second))
    );
}

/// One command of the property test.
#[derive(Clone, Debug)]
enum Cmd {
    Capacity,
    Claim,
    Start,
    Model(u32),
    Tool(usize),
    SubAgent,
    Observe(bool),
    Checkpoint,
    RenewalFails,
    Renewed,
    Decide(u8),
    Resolve(u8),
    Interrupt,
    ObserveCancel,
    TimeOut,
    Report(bool),
    Fail,
    Wait(u16),
}

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        Just(Cmd::Capacity),
        Just(Cmd::Claim),
        Just(Cmd::Start),
        (0u32..1500).prop_map(Cmd::Model),
        (0usize..5).prop_map(Cmd::Tool),
        Just(Cmd::SubAgent),
        any::<bool>().prop_map(Cmd::Observe),
        Just(Cmd::Checkpoint),
        Just(Cmd::RenewalFails),
        Just(Cmd::Renewed),
        (0u8..3).prop_map(Cmd::Decide),
        (0u8..4).prop_map(Cmd::Resolve),
        Just(Cmd::Interrupt),
        Just(Cmd::ObserveCancel),
        Just(Cmd::TimeOut),
        any::<bool>().prop_map(Cmd::Report),
        Just(Cmd::Fail),
        (0u16..600).prop_map(Cmd::Wait),
    ]
}

/// The invariants that hold after every command.
fn check_invariants(a: &ExecutionAttempt, calls: &[CallRecord]) {
    assert_eq!(
        a.outcome_hash.is_some(),
        a.state.is_terminal(),
        "{:?}",
        a.state
    );
    assert_eq!(
        a.pending_decision.is_some(),
        a.state == AttemptState::WaitingForDecision
    );
    assert!(a.correction_count <= a.max_corrections);
    assert!(a.usage.model_calls <= a.limits.max_model_calls);
    assert!(a.usage.tool_calls <= a.limits.max_tool_calls);
    assert!(a.usage.context_tokens <= a.limits.max_context_tokens);
    assert!(a.depth + u32::from(a.usage.sub_agents > 0) <= a.limits.max_sub_agent_depth);
    let open: Vec<_> = calls.iter().filter(|c| c.is_open()).collect();
    assert!(open.len() <= 1, "at most one call in flight");
    match &a.open_call {
        Some(o) => assert!(
            open.iter().any(|c| c.call_id == o.call_id)
                || calls
                    .iter()
                    .any(|c| c.call_id == o.call_id && c.status == CallStatus::Uncertain)
        ),
        None => assert!(open.is_empty()),
    }
    if a.state == AttemptState::WaitingForTool {
        assert!(a.open_call.is_some());
    }
    if a.state == AttemptState::Uncertain {
        assert!(calls.iter().any(|c| c.status == CallStatus::Uncertain));
    }
    if let Some(at) = a.cancellation_observed_at {
        assert!(
            calls
                .iter()
                .all(|c| c.started_at <= at || c.status == CallStatus::Failed)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_commands_never_break_an_invariant(cmds in proptest::collection::vec(cmd(), 1..60)) {
        let mut a = attempt();
        let mut now = t0();
        let mut calls: Vec<CallRecord> = Vec::new();
        let mut decision: Option<DecisionRequest> = None;
        let mut reported = 0;
        let mut interrupted_at: Option<DateTime<Utc>> = None;
        for cmd in cmds {
            let prior = a.clone();
            let before = a.state;
            let open_index = a
                .open_call
                .as_ref()
                .and_then(|o| calls.iter().position(|c| c.call_id == o.call_id));
            let mut events = Vec::new();
            match cmd {
                Cmd::Capacity => a.capacity_granted = true,
                Cmd::Claim => { let _ = a.claim("h", Some(a.fencing_token + 1), Duration::seconds(60), now); }
                Cmd::Start => { if let Ok(e) = a.start(None, now) { events = e; } }
                Cmd::Model(tokens) => {
                    if let Ok((r, e)) = a.begin_call(model(tokens), 2, now) { calls.push(r); events = e; }
                }
                Cmd::Tool(i) => {
                    if let Ok((r, e)) = a.begin_call(tool(SideEffectClass::ALL[i]), 2, now) { calls.push(r); events = e; }
                }
                Cmd::SubAgent => {
                    let mut s = tool(SideEffectClass::Read);
                    s.kind = CallKind::SubAgent;
                    if let Ok((r, e)) = a.begin_call(s, 2, now) { calls.push(r); events = e; }
                }
                Cmd::Observe(good) => {
                    if let Some(i) = open_index {
                        let result = if good { ok() } else { CallResult { ok: false, result_hash: None, receipt_ref: None, served_by: None, error: Some("boom".into()), usage: None, latency_ms: None } };
                        if let Ok(e) = a.observe_call(&mut calls[i], result, now) { events = e; }
                    }
                }
                Cmd::Checkpoint => {
                    if let Ok((_, e)) = a.checkpoint(Uuid::now_v7(), CheckpointReason::Cadence, "s".into(), None, now) { events = e; }
                }
                Cmd::RenewalFails => a.renewal_failed("lost".into()),
                Cmd::Renewed => { if let Ok(e) = a.renewed(now) { events = e; } }
                Cmd::Decide(kind) => {
                    let kind = [DecisionKind::Approval, DecisionKind::Input, DecisionKind::Escalation][kind as usize];
                    if let Ok((d, e)) = a.request_decision(Uuid::now_v7(), kind, None, None, None, "q".into(), vec![], None, Duration::minutes(5), now) {
                        decision = Some(d);
                        events = e;
                    }
                }
                Cmd::Resolve(r) => {
                    if let Some(d) = decision.as_mut() {
                        let resolution = match r {
                            0 => Resolution::Approved { by: "r".into(), reason: None, edited: None },
                            1 => Resolution::Rejected { by: "r".into(), reason: None, respond: false },
                            2 => Resolution::Answered { by: "r".into(), choice: None, answer_ref: None },
                            _ => Resolution::Expired { minutes: 5 },
                        };
                        if let Ok(e) = a.resolve_decision(d, resolution, now) { events = e; }
                    }
                }
                Cmd::Interrupt => {
                    events = a.request_interrupt(interrupt(InterruptSource::Interrupt), now);
                    if !events.is_empty() { interrupted_at = Some(now); }
                }
                Cmd::ObserveCancel => {
                    let open = open_index.map(|i| &mut calls[i]);
                    if let Ok(e) = a.observe_cancellation(open, now) { events = e; }
                }
                Cmd::TimeOut => {
                    if a.state == AttemptState::Running || a.state == AttemptState::WaitingForTool {
                        let open = open_index.map(|i| &mut calls[i]);
                        if let Ok(e) = a.time_out(open, now) { events = e; }
                    }
                }
                Cmd::Report(valid) => {
                    let violations = if valid { vec![] } else { vec!["bad".to_string()] };
                    if let Ok((_, e)) = a.report_success("o".into(), &violations, None, "h".into(), now) { events = e; }
                }
                Cmd::Fail => {
                    let failure = AttemptFailure { class: FailureClass::Transient, reason: "x".into(), feedback_ref: None, detail_ref: None };
                    if let Ok(e) = a.fail(failure, None, now) { events = e; }
                }
                Cmd::Wait(s) => now += Duration::seconds(i64::from(s)),
            }
            if before != a.state {
                prop_assert!(before.edge(a.state).is_some() || matches!((before, a.state), (AttemptState::WaitingForTool, s) if s.is_terminal()),
                    "{before} -> {} is not an edge", a.state);
                prop_assert!(!before.is_terminal(), "a terminal state changed");
            }
            reported += events.iter().filter(|e| e.topic.ends_with("attempt-outcome-reported")).count();
            prop_assert!(reported <= 1, "two outcomes");
            prop_assert_eq!(reported == 1, a.state.is_terminal());
            check_invariants(&a, &calls);
            // Every transition's result is a state the store accepts over
            // the one before.
            if let Err(rule) = prior.check_successor(&a) {
                prop_assert!(false, "{rule}");
            }
            if let Some(at) = interrupted_at {
                prop_assert!(calls.iter().filter(|c| c.started_at > at).all(|c| c.status == CallStatus::Failed));
            }
        }
    }
}

#[test]
fn an_ended_attempt_accepts_no_successor_that_leaves_its_end_or_changes_its_outcome() {
    let mut a = running();
    a.report_success("sha256:out".into(), &[], None, "sha256:report".into(), t0())
        .unwrap();
    assert_eq!(a.state, AttemptState::Succeeded);
    // The stale copy a lost update would write: Running, an earlier token.
    let mut stale = running();
    stale.attempt_id = a.attempt_id;
    let rule = a.check_successor(&stale).unwrap_err();
    assert!(rule.contains("ended Succeeded"), "{rule}");
    // A second, different outcome.
    let mut other = a.clone();
    other.outcome_hash = Some("sha256:other".into());
    assert!(a.check_successor(&other).is_err());
    // Recording a stale token on the ended attempt is fine.
    let mut refused = a.clone();
    assert!(refused.check_fencing(0, "Heartbeat", t0()).is_err());
    a.check_successor(&refused).unwrap();
    // A token never goes back, and checkpoints are never unwritten.
    let live = running();
    let mut back = live.clone();
    back.fencing_token = 0;
    assert!(
        live.check_successor(&back)
            .unwrap_err()
            .contains("fencing token")
    );
    let mut cp = live.clone();
    cp.checkpoint(
        Uuid::now_v7(),
        CheckpointReason::Cadence,
        "s".into(),
        None,
        t0(),
    )
    .unwrap();
    assert!(cp.check_successor(&live).unwrap_err().contains("unwrite"));
}
