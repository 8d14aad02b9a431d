//! Webhooks: endpoints a tenant's administrator (or a PlatformAdmin, for
//! every tenant) registers, and deliveries of signed messages to them.
//!
//! A delivery is one message to one endpoint, with a stable id (the
//! Standard Webhooks `webhook-id`) that the receiver de-duplicates by: it
//! is created once, from a durable event or from a watched state (a
//! decision about to expire, an Uncertain call, a lease queued too long),
//! and tried until a 2xx answer or until its tries run out, each failure
//! pushing the next try back exponentially.
//!
//! Signing follows the Standard Webhooks convention: the secret is
//! `whsec_` + base64 of 32 random bytes; the signature is
//! `v1,` + base64(HMAC-SHA256(secret, "{id}.{timestamp}.{body}")).

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{FieldError, TenantId};

/// What an endpoint can subscribe to.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
pub enum WebhookEvent {
    /// A human decision (input, approval, escalation) was requested.
    #[serde(rename = "decision.requested")]
    DecisionRequested,
    /// A waiting decision expires within the endpoint's warning time.
    #[serde(rename = "decision.expiring")]
    DecisionExpiring,
    /// A run ended (succeeded, failed, cancelled).
    #[serde(rename = "run.ended")]
    RunEnded,
    /// A call became Uncertain and waits for an operator's settlement.
    #[serde(rename = "call.uncertain")]
    CallUncertain,
    /// A lease request has waited in a pool's queue longer than the
    /// endpoint's threshold.
    #[serde(rename = "lease.queued")]
    LeaseQueued,
}

impl WebhookEvent {
    /// Every event.
    pub const ALL: [WebhookEvent; 5] = [
        WebhookEvent::DecisionRequested,
        WebhookEvent::DecisionExpiring,
        WebhookEvent::RunEnded,
        WebhookEvent::CallUncertain,
        WebhookEvent::LeaseQueued,
    ];

    /// The name on the wire (the message's `type`).
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookEvent::DecisionRequested => "decision.requested",
            WebhookEvent::DecisionExpiring => "decision.expiring",
            WebhookEvent::RunEnded => "run.ended",
            WebhookEvent::CallUncertain => "call.uncertain",
            WebhookEvent::LeaseQueued => "lease.queued",
        }
    }

    /// Parses a name.
    pub fn parse(field: &str, text: &str) -> Result<WebhookEvent, FieldError> {
        WebhookEvent::ALL
            .into_iter()
            .find(|e| e.as_str() == text)
            .ok_or_else(|| {
                FieldError::new(
                    field,
                    format!(
                        "unknown event {text:?}; events: {}",
                        WebhookEvent::ALL.map(|e| e.as_str()).join(", ")
                    ),
                )
            })
    }

    /// The outbox topic a durable event of this kind comes from, if it
    /// comes from one (the others are watched states).
    pub fn topic(self) -> Option<&'static str> {
        match self {
            WebhookEvent::DecisionRequested => {
                Some("execution.attempts.v1.attempt-decision-requested")
            }
            WebhookEvent::RunEnded => Some("execution.runs.v1.run-ended"),
            _ => None,
        }
    }

    /// The event of an outbox topic, if webhooks carry it.
    pub fn of_topic(topic: &str) -> Option<WebhookEvent> {
        WebhookEvent::ALL
            .into_iter()
            .find(|e| e.topic() == Some(topic))
    }

    /// The prefix of the message ids of this event.
    fn id_prefix(self) -> &'static str {
        match self {
            WebhookEvent::DecisionRequested | WebhookEvent::RunEnded => "evt",
            WebhookEvent::DecisionExpiring => "dex",
            WebhookEvent::CallUncertain => "unc",
            WebhookEvent::LeaseQueued => "lq",
        }
    }

    /// The stable message id of this event about `subject` (an outbox
    /// sequence, a decision, a call, a lease): the same message always
    /// gets the same id, so a receiver de-duplicates by it.
    pub fn message_id(self, subject: &str) -> String {
        format!("{}_{subject}", self.id_prefix())
    }
}

/// The longest URL an endpoint may have.
pub const MAX_URL: usize = 2048;
/// The longest description.
pub const MAX_DESCRIPTION: usize = 200;

/// What an administrator sets on an endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointSpec {
    /// Where messages are POSTed (`https://` or `http://`); it must be on
    /// the site's network allowlist.
    #[schema(
        pattern = "^[hH][tT][tT][pP][sS]?://(([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?|((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9]))(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?(/[!-~]*)?$",
        max_length = 2048
    )]
    pub url: String,
    /// What it receives (at least one).
    #[schema(min_items = 1)]
    pub events: BTreeSet<WebhookEvent>,
    /// A note for people.
    #[serde(default)]
    #[schema(pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$", max_length = 200)]
    pub description: String,
    /// Whether messages are sent; a disabled endpoint gets none created.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// `decision.expiring`: how many minutes before its expiry a waiting
    /// decision is announced (1 to 10080; default 60).
    #[serde(default = "default_expiry_minutes")]
    #[schema(minimum = 1, maximum = 10080)]
    pub decision_expiry_minutes: u32,
    /// `lease.queued`: after how many seconds of waiting a queued lease is
    /// announced (1 to 604800; default 300).
    #[serde(default = "default_queued_seconds")]
    #[schema(minimum = 1, maximum = 604800)]
    pub lease_queued_seconds: u32,
}

fn yes() -> bool {
    true
}

fn default_expiry_minutes() -> u32 {
    60
}

fn default_queued_seconds() -> u32 {
    300
}

impl EndpointSpec {
    /// The spec as it is shown (the API, the console): its URL without
    /// credentials, should one stored before they were refused carry any.
    pub fn shown(mut self) -> EndpointSpec {
        self.url = super::reach::redacted(&self.url);
        self
    }

    /// Checks the spec; the error names the field and the reason. Whether
    /// the site allows the URL is the site's rule, checked by the caller.
    pub fn check(&self) -> Result<(), FieldError> {
        if self.url.len() > MAX_URL {
            return Err(FieldError::new(
                "url",
                format!("is longer than {MAX_URL} characters"),
            ));
        }
        let lower = self.url.to_ascii_lowercase();
        if !(lower.starts_with("https://") || lower.starts_with("http://")) {
            return Err(FieldError::new(
                "url",
                format!(
                    "{:?} is not an http:// or https:// URL",
                    super::reach::redacted(&self.url)
                ),
            ));
        }
        super::reach::Target::of_url(&self.url).map_err(|e| FieldError::new("url", e))?;
        if self.events.is_empty() {
            return Err(FieldError::new(
                "events",
                format!(
                    "name at least one event: {}",
                    WebhookEvent::ALL.map(|e| e.as_str()).join(", ")
                ),
            ));
        }
        if self.description.chars().count() > MAX_DESCRIPTION
            || self.description.chars().any(char::is_control)
        {
            return Err(FieldError::new(
                "description",
                format!("at most {MAX_DESCRIPTION} characters, no control characters"),
            ));
        }
        if !(1..=10_080).contains(&self.decision_expiry_minutes) {
            return Err(FieldError::new(
                "decisionExpiryMinutes",
                format!("{} is outside 1..=10080", self.decision_expiry_minutes),
            ));
        }
        if !(1..=604_800).contains(&self.lease_queued_seconds) {
            return Err(FieldError::new(
                "leaseQueuedSeconds",
                format!("{} is outside 1..=604800", self.lease_queued_seconds),
            ));
        }
        Ok(())
    }
}

/// A registered endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookEndpoint {
    /// Its id.
    pub endpoint_id: Uuid,
    /// The tenant that owns it: it receives that tenant's messages, or
    /// every tenant's when it is the platform tenant.
    pub tenant_id: TenantId,
    /// What its administrator set.
    pub spec: EndpointSpec,
    /// The signing secret (`whsec_...`). Never logged; shown once.
    pub secret: String,
    /// Who registered it.
    pub created_by: String,
    /// When.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl WebhookEndpoint {
    /// Whether it receives `event` about `tenant`.
    pub fn receives(&self, event: WebhookEvent, tenant: &TenantId) -> bool {
        self.spec.enabled
            && self.spec.events.contains(&event)
            && (self.tenant_id == *tenant || self.tenant_id.is_platform())
    }
}

/// A new signing secret from 32 random bytes.
pub fn new_secret(random: [u8; 32]) -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(random)
    )
}

/// The Standard Webhooks signature of a message: `v1,<base64>`.
pub fn sign(secret: &str, message_id: &str, timestamp: i64, body: &str) -> String {
    let key_bytes = secret
        .strip_prefix("whsec_")
        .and_then(|k| base64::engine::general_purpose::STANDARD.decode(k).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec());
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key_bytes);
    let tag = ring::hmac::sign(&key, format!("{message_id}.{timestamp}.{body}").as_bytes());
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
    )
}

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum DeliveryState {
    /// Not delivered yet; tried again at `nextTryAt`.
    Pending,
    /// A try got a 2xx answer.
    Delivered,
    /// Its tries ran out.
    GaveUp,
}

/// One try of a delivery.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryTry {
    /// When it was sent.
    pub at: DateTime<Utc>,
    /// The HTTP status of the answer, if one came.
    pub status: Option<u16>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
}

impl DeliveryTry {
    /// Whether the endpoint took the message (a 2xx answer).
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// One message to one endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    /// The stable message id (`webhook-id`).
    pub message_id: String,
    /// The endpoint.
    pub endpoint_id: Uuid,
    /// The endpoint's tenant (the record's owner).
    #[schema(value_type = String)]
    pub tenant_id: TenantId,
    /// The tenant the message is about.
    #[schema(value_type = String)]
    pub subject_tenant: TenantId,
    /// What happened.
    pub event: WebhookEvent,
    /// The body sent, as JSON text.
    pub body: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Where it stands.
    pub state: DeliveryState,
    /// When it is tried next, while pending.
    pub next_try_at: Option<DateTime<Utc>>,
    /// Every try, oldest first.
    pub tries: Vec<DeliveryTry>,
}

/// How failed tries are spaced and when a delivery is given up.
#[derive(Clone, Copy, Debug)]
pub struct DeliveryPolicy {
    /// Delay after the first failure.
    pub first: Duration,
    /// The longest delay.
    pub max: Duration,
    /// Tries before giving up.
    pub max_tries: u32,
}

impl DeliveryPolicy {
    /// The delay after the `failures`-th failed try: doubled each time,
    /// at most `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.first
            .checked_mul(factor)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

impl Delivery {
    /// A new pending delivery, due at once.
    pub fn new(
        endpoint: &WebhookEndpoint,
        event: WebhookEvent,
        message_id: String,
        subject_tenant: TenantId,
        data: serde_json::Value,
        text: Option<String>,
        now: DateTime<Utc>,
    ) -> Delivery {
        let mut body = serde_json::json!({
            "type": event.as_str(),
            "timestamp": now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "tenantId": subject_tenant.as_str(),
            "data": data,
        });
        // A ready chat message: posted as it is by chat systems' incoming
        // webhooks, which read `text` and leave the rest.
        if let Some(text) = text {
            body["text"] = text.into();
        }
        let body = body.to_string();
        Delivery {
            message_id,
            endpoint_id: endpoint.endpoint_id,
            tenant_id: endpoint.tenant_id.clone(),
            subject_tenant,
            event,
            body,
            created_at: now,
            state: DeliveryState::Pending,
            next_try_at: Some(now),
            tries: Vec::new(),
        }
    }

    /// Its record id: `<endpoint>/<message id>`.
    pub fn key(endpoint_id: Uuid, message_id: &str) -> String {
        format!("{endpoint_id}/{message_id}")
    }

    /// Whether it is pending and due at `now`.
    pub fn due(&self, now: DateTime<Utc>) -> bool {
        self.state == DeliveryState::Pending && self.next_try_at.is_some_and(|t| t <= now)
    }

    /// Records a try: delivered on a 2xx status, otherwise pending again
    /// after the policy's delay, or given up once the tries run out.
    pub fn record(&mut self, attempt: DeliveryTry, policy: &DeliveryPolicy) {
        let ok = attempt.succeeded();
        let at = attempt.at;
        self.tries.push(attempt);
        if ok {
            self.state = DeliveryState::Delivered;
            self.next_try_at = None;
            return;
        }
        let failures = self
            .tries
            .iter()
            .rev()
            .take_while(|t| !t.succeeded())
            .count() as u32;
        if failures >= policy.max_tries {
            self.state = DeliveryState::GaveUp;
            self.next_try_at = None;
        } else {
            let delay =
                chrono::Duration::from_std(policy.delay(failures)).unwrap_or(chrono::Duration::MAX);
            self.next_try_at = Some(at + delay);
        }
    }

    /// Asks for another try now (an operator's redelivery): a delivery
    /// given up or delivered is pending again with a fresh count of tries.
    pub fn redeliver(&mut self, now: DateTime<Utc>) {
        if self.state != DeliveryState::Pending {
            self.tries.push(DeliveryTry {
                at: now,
                status: None,
                error: Some("redelivery asked for by an operator".into()),
                duration_ms: 0,
            });
        }
        self.state = DeliveryState::Pending;
        self.next_try_at = Some(now);
    }

    /// When it was finished (delivered or given up).
    pub fn finished_at(&self) -> Option<DateTime<Utc>> {
        match self.state {
            DeliveryState::Pending => None,
            _ => self.tries.last().map(|t| t.at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_stored_with_credentials_before_they_were_refused_is_shown_without_them() {
        let mut e = endpoint();
        e.spec.url = "https://hook:s3cret@hooks.example/agentbay".into();
        assert!(e.spec.check().is_err(), "refused when set");
        let shown = e.spec.clone().shown();
        assert_eq!(shown.url, "https://***@hooks.example/agentbay");
        assert_eq!(
            endpoint().spec.shown().url,
            "https://hooks.example/agentbay"
        );
    }

    fn endpoint() -> WebhookEndpoint {
        WebhookEndpoint {
            endpoint_id: Uuid::now_v7(),
            tenant_id: TenantId::parse_field("t", "acme").unwrap(),
            spec: EndpointSpec {
                url: "https://hooks.example/agentbay".into(),
                events: [WebhookEvent::RunEnded].into(),
                description: String::new(),
                enabled: true,
                decision_expiry_minutes: 60,
                lease_queued_seconds: 300,
            },
            secret: new_secret([7; 32]),
            created_by: "admin".into(),
            created_at: Utc::now(),
            updated_at: Utc::now(),
        }
    }

    #[test]
    fn the_signature_is_the_standard_webhooks_one() {
        // The Standard Webhooks specification's example.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn failed_tries_back_off_exponentially_and_give_up() {
        let policy = DeliveryPolicy {
            first: Duration::from_secs(30),
            max: Duration::from_secs(100),
            max_tries: 4,
        };
        let e = endpoint();
        let now = Utc::now();
        let mut d = Delivery::new(
            &e,
            WebhookEvent::RunEnded,
            WebhookEvent::RunEnded.message_id("7"),
            e.tenant_id.clone(),
            serde_json::json!({}),
            None,
            now,
        );
        assert!(d.due(now));
        let fail = |at| DeliveryTry {
            at,
            status: Some(500),
            error: None,
            duration_ms: 1,
        };
        d.record(fail(now), &policy);
        assert_eq!(d.next_try_at, Some(now + chrono::Duration::seconds(30)));
        d.record(fail(now), &policy);
        assert_eq!(d.next_try_at, Some(now + chrono::Duration::seconds(60)));
        d.record(fail(now), &policy);
        assert_eq!(d.next_try_at, Some(now + chrono::Duration::seconds(100)));
        d.record(fail(now), &policy);
        assert_eq!(d.state, DeliveryState::GaveUp);
        d.redeliver(now);
        assert!(d.due(now));
        d.record(
            DeliveryTry {
                at: now,
                status: Some(204),
                error: None,
                duration_ms: 1,
            },
            &policy,
        );
        assert_eq!(d.state, DeliveryState::Delivered);
        assert_eq!(d.message_id, "evt_7");
    }

    #[test]
    fn a_spec_names_its_bad_field() {
        let mut s = endpoint().spec;
        s.url = "ftp://x".into();
        assert_eq!(s.check().unwrap_err().field, "url");
        let mut s = endpoint().spec;
        s.events.clear();
        assert_eq!(s.check().unwrap_err().field, "events");
        let mut s = endpoint().spec;
        s.lease_queued_seconds = 0;
        assert_eq!(s.check().unwrap_err().field, "leaseQueuedSeconds");
    }

    #[test]
    fn a_platform_endpoint_receives_every_tenant_and_a_tenants_only_its_own() {
        let mut e = endpoint();
        let acme = e.tenant_id.clone();
        let other = TenantId::parse_field("t", "globex").unwrap();
        assert!(e.receives(WebhookEvent::RunEnded, &acme));
        assert!(!e.receives(WebhookEvent::RunEnded, &other));
        assert!(!e.receives(WebhookEvent::LeaseQueued, &acme));
        e.tenant_id = TenantId::platform();
        assert!(e.receives(WebhookEvent::RunEnded, &other));
    }
}
