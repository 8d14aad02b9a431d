//! What happened, with its content: the artifacts behind a call's request,
//! result and receipts, an attempt's output and its validator's feedback,
//! read from the tenant's artifact store and made readable
//! ([`crate::domain::content`]). Purged content shows its tombstone.

use serde::Serialize;
use uuid::Uuid;

use super::{Runtime, RuntimeError};
use crate::domain::DomainError;
use crate::domain::access::TenantScope;
use crate::domain::attempt::{CallKind, CallRecord, ExecutionAttempt};
use crate::domain::content::{Conversation, Message, Shown};
use crate::domain::retention::Tombstone;

/// One call with what it asked and answered.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallContent {
    /// The request (a model call's messages and tools, a tool's arguments).
    pub request: Shown,
    /// The result, once there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Shown>,
    /// The receipt (model-invocation-v1, tool-invocation-v1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Shown>,
    /// A receipt reported after the call was settled as uncertain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_receipt: Option<Shown>,
    /// A model call's messages, as a conversation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<Conversation>,
    /// A model call's reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<Message>,
}

/// An attempt's outcome with its content.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeContent {
    /// The output the adapter reported (also when verification refused it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Shown>,
    /// The validator's violations, for an output that failed verification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feedback: Option<Shown>,
    /// The error the agent's code raised: its type, message and traceback,
    /// as the adapter reported them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::domain::attempt::ErrorDetail>,
}

impl Runtime {
    /// The content behind `hash` in the scope's tenant, or the tombstone
    /// of the record that referred to it.
    pub fn show(&self, scope: &TenantScope, hash: &str, purged: Option<&Tombstone>) -> Shown {
        if let Some(t) = purged {
            return Shown::purged(hash, t);
        }
        match self.store().read_artifact(scope, hash) {
            Ok(Some(bytes)) => Shown::of(hash, &bytes),
            Ok(None) => Shown::missing(hash),
            Err(e) => {
                tracing::warn!(%hash, error = %e, "reading an artifact");
                Shown::missing(hash)
            }
        }
    }

    /// One call of an attempt, by id.
    pub fn call(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        call_id: Uuid,
    ) -> Result<CallRecord, RuntimeError> {
        self.calls(scope, attempt_id)?
            .into_iter()
            .find(|c| c.call_id == call_id)
            .ok_or_else(|| {
                DomainError::not_found("call", format!("{call_id} of attempt {attempt_id}")).into()
            })
    }

    /// What a call asked and answered.
    pub fn call_content(&self, scope: &TenantScope, call: &CallRecord) -> CallContent {
        let purged = call.purged.as_ref();
        let show = |hash: &String| self.show(scope, hash, purged);
        let request = show(&call.request_hash);
        let result = call.result_hash.as_ref().map(show);
        let model = call.kind == CallKind::Model;
        CallContent {
            conversation: request
                .json
                .as_ref()
                .filter(|_| model)
                .and_then(Conversation::of_request),
            reply: result
                .as_ref()
                .and_then(|r| r.json.as_ref())
                .filter(|_| model)
                .and_then(Conversation::reply),
            receipt: call.receipt_ref.as_ref().map(show),
            late_receipt: call.late_receipt_ref.as_ref().map(show),
            request,
            result,
        }
    }

    /// An attempt's output and its validator's feedback.
    pub fn outcome_content(&self, scope: &TenantScope, a: &ExecutionAttempt) -> OutcomeContent {
        let purged = a.purged.as_ref();
        OutcomeContent {
            output: a.output_ref.as_ref().map(|h| self.show(scope, h, purged)),
            feedback: a
                .failure
                .as_ref()
                .and_then(|f| f.feedback_ref.as_ref())
                .map(|h| self.show(scope, h, purged)),
            error: a
                .failure
                .as_ref()
                .and_then(|f| f.detail_ref.as_ref())
                .filter(|_| purged.is_none())
                .and_then(|h| self.store().read_artifact(scope, h).ok().flatten())
                .and_then(|bytes| serde_json::from_slice(&bytes).ok()),
        }
    }

    /// An artifact of the scope's tenant, whole, with its record: what a
    /// reader of the tenant's runs may fetch.
    pub fn artifact(
        &self,
        scope: &TenantScope,
        hash: &str,
    ) -> Result<(crate::store::artifacts::Artifact, Vec<u8>), RuntimeError> {
        Ok(self
            .store()
            .artifact(scope, hash)?
            .ok_or_else(|| DomainError::not_found("artifact", hash))?)
    }
}
