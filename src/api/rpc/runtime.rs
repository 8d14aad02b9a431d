//! `agentbay.runtime.v1.Runtime`: Interrupt, AnswerDecision, WatchAttempt.

use connectrpc::{RequestContext, Response, ServiceRequest, ServiceResult, ServiceStream};

use super::{principal, tenant_scope};
use crate::api::AppState;
use crate::api::error::rpc;
use crate::api::runtime::parse_json;
use crate::domain::attempt::InterruptSource;
use crate::domain::ids::required_uuid;
use crate::domain::release::canonical_json;
use crate::proto::agentbay::runtime::v1 as pb;
use crate::runtime::grain::AttemptView;

/// The Runtime service.
pub struct RuntimeService {
    state: AppState,
}

impl RuntimeService {
    /// Serves the Runtime RPCs.
    pub fn new(state: AppState) -> Self {
        RuntimeService { state }
    }
}

/// A piece of model text as the RPC sends it.
pub(super) fn text_message(piece: crate::domain::text::TextPiece) -> pb::ModelText {
    use crate::domain::text::PieceKind;
    let mut m = pb::ModelText {
        offset: piece.offset,
        call_id: piece.call_id.to_string(),
        ..Default::default()
    };
    match piece.kind {
        PieceKind::Text { text } => {
            m.kind = "text".into();
            m.text = text;
        }
        PieceKind::Superseded {
            discard_from,
            reason,
        } => {
            m.kind = "superseded".into();
            m.discard_from = discard_from;
            m.reason = reason;
        }
        PieceKind::Ended => m.kind = "ended".into(),
        PieceKind::Gap { up_to } => {
            m.kind = "gap".into();
            m.up_to = up_to;
        }
    }
    m
}

fn update_message(
    runtime: &crate::runtime::Runtime,
    scope: &crate::domain::access::TenantScope,
    view: &AttemptView,
) -> pb::AttemptUpdate {
    let a = &view.attempt;
    pb::AttemptUpdate {
        pending_decision: view
            .decision
            .as_ref()
            .map(|d| super::runs::pending_decision_message(runtime.pending_decision(scope, d)))
            .into(),
        attempt_id: a.attempt_id.to_string(),
        state: a.state.as_str().to_string(),
        phase: a.phase.as_str().to_string(),
        checkpoints: a.usage.checkpoints,
        last_checkpoint_id: a
            .last_checkpoint_id
            .map(|c| c.to_string())
            .unwrap_or_default(),
        waiting_reason: runtime.waiting_reason(view).unwrap_or_default(),
        interrupt_requested: a.interrupt.is_some(),
        interrupt_reason: a
            .interrupt
            .as_ref()
            .map(|i| i.reason.clone())
            .unwrap_or_default(),
        fencing_token: a.fencing_token,
        outcome_hash: a.outcome_hash.clone().unwrap_or_default(),
        version: a.version,
        ..Default::default()
    }
}

#[allow(refining_impl_trait)]
impl pb::Runtime for RuntimeService {
    async fn interrupt(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::InterruptRequest>,
    ) -> ServiceResult<pb::InterruptResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let attempt = self
            .state
            .runtime
            .interrupt(
                &scope,
                id,
                &caller.subject.to_string(),
                request.reason,
                InterruptSource::Interrupt,
            )
            .await
            .map_err(rpc)?;
        let view = self.state.runtime.view(&scope, id).map_err(rpc)?;
        Response::ok(pb::InterruptResponse {
            state: attempt.state.as_str().to_string(),
            observed: attempt.cancellation_observed_at.is_some() || attempt.state.is_terminal(),
            waiting_reason: self.state.runtime.waiting_reason(&view).unwrap_or_default(),
            ..Default::default()
        })
    }

    async fn answer_decision(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::AnswerDecisionRequest>,
    ) -> ServiceResult<pb::AnswerDecisionResponse> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let attempt_id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let decision_id = required_uuid("decisionId", request.decision_id).map_err(rpc)?;
        let answer = match request.answer_json {
            "" => None,
            text => Some(canonical_json(
                &parse_json("answerJson", text).map_err(rpc)?,
            )),
        };
        let choice = (!request.choice.is_empty()).then(|| request.choice.to_string());
        let attempt = self
            .state
            .runtime
            .answer(
                &scope,
                attempt_id,
                decision_id,
                &caller.subject.to_string(),
                choice,
                answer,
            )
            .await
            .map_err(rpc)?;
        Response::ok(pb::AnswerDecisionResponse {
            state: attempt.state.as_str().to_string(),
            ..Default::default()
        })
    }

    async fn watch_attempt(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, pb::WatchAttemptRequest>,
    ) -> ServiceResult<ServiceStream<pb::AttemptUpdate>> {
        let caller = principal(&ctx)?;
        let scope = tenant_scope(&caller, request.tenant_id)?;
        let id = required_uuid("attemptId", request.attempt_id).map_err(rpc)?;
        let events = self
            .state
            .runtime
            .events(
                &scope,
                id,
                request.after_sequence,
                self.state.shutdown.clone(),
            )
            .map_err(rpc)?;
        let now = update_message(
            &self.state.runtime,
            &scope,
            &*self.state.runtime.view(&scope, id).map_err(rpc)?,
        );
        let runtime = self.state.runtime.clone();
        let text_scope = scope.clone();
        let updates = futures::StreamExt::map(events, move |event| {
            let mut update = match runtime.view(&scope, id) {
                Ok(view) => update_message(&runtime, &scope, &view),
                Err(e) => return Err(rpc(e)),
            };
            update.sequence = event.sequence;
            update.topic = event.topic.clone();
            update.occurred_at = event.occurred_at.to_rfc3339();
            update.event_json = event.payload.to_string();
            Ok(update)
        });
        let stream = futures::StreamExt::chain(futures::stream::iter([Ok(now)]), updates);
        if !request.model_text {
            return Ok(Response::new(
                Box::pin(stream) as ServiceStream<pb::AttemptUpdate>
            ));
        }
        let text = self
            .state
            .runtime
            .model_text(
                &text_scope,
                id,
                request.text_offset,
                self.state.shutdown.clone(),
            )
            .map_err(rpc)?;
        let attempt_id = id.to_string();
        let text = futures::StreamExt::map(text, move |piece| {
            Ok(pb::AttemptUpdate {
                attempt_id: attempt_id.clone(),
                text: Some(text_message(piece)).into(),
                ..Default::default()
            })
        });
        Ok(Response::new(
            Box::pin(futures::stream::select(stream, text)) as ServiceStream<pb::AttemptUpdate>,
        ))
    }
}
