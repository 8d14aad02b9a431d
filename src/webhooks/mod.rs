//! Webhooks: signed messages to the site's endpoints, from a durable
//! outbox.
//!
//! Where messages come from:
//! - durable events (`decision.requested`, `run.ended`): the
//!   WebhookDispatcher reads the event outbox from its cursor (kept in the
//!   store) and, in one transaction with the cursor's move, creates one
//!   delivery per receiving endpoint. The event was written in the same
//!   transaction as the change it describes, so a kill -9 anywhere between
//!   the change and the delivery loses nothing: the cursor is behind, or
//!   the delivery is stored and pending.
//! - watched states (`decision.expiring`, `call.uncertain`,
//!   `lease.queued`): each pass looks at what waits and creates the
//!   delivery of each thing once (its message id is the thing's id, and a
//!   delivery that exists is never created again).
//!
//! Every pending delivery due is sent (at most [`SENDERS`] at once) through
//! the site's network rule for the endpoint's tenant ([`SiteRules`]), with
//! the Standard Webhooks headers; the try is recorded, and a failure is
//! retried with exponential backoff until `webhooks.max_tries`. Deliveries
//! are at least once: a receiver de-duplicates by `webhook-id`.

use crate::domain::audit::Change as AuditChange;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use uuid::Uuid;

use crate::capacity::Capacity;
use crate::clock::SharedClock;
use crate::config::{Live, SiteRules, WebhooksConfig};
use crate::domain::TenantId;
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::events::EventFilter;
use crate::domain::ids::new_id;
use crate::domain::reach::Target;
use crate::domain::webhook::{
    Delivery, DeliveryPolicy, DeliveryState, DeliveryTry, EndpointSpec, WebhookEndpoint,
    WebhookEvent, new_secret,
};
use crate::domain::{DomainError, FieldError};
use crate::runtime::Runtime;
use crate::store::{Derived, Record, Store, StoreError, Table, Tx};
use crate::telemetry::{Gauge, names};
use crate::worker::{RetryKind, Schedule, Worker};

/// Consecutive failed tries after which an endpoint is paused.
pub const BREAKER_FAILURES: u32 = 3;
/// The first pause of a failing endpoint, doubled at each further failure.
const BREAKER_FIRST_SECONDS: i64 = 30;
/// The longest pause.
const BREAKER_MAX_SECONDS: i64 = 600;
/// Outbox events read per pass.
const BATCH: usize = 500;
/// Meta key of the outbox cursor.
const CURSOR: &str = "webhooks.cursor";
/// Global index of pending deliveries.
const PENDING: &str = "webhook-pending";

impl Record for WebhookEndpoint {
    const TABLE: Table = Table::WebhookEndpoints;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.endpoint_id.to_string()
    }
}

impl Record for Delivery {
    const TABLE: Table = Table::WebhookDeliveries;
    const VERSION: u16 = 1;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        Delivery::key(self.endpoint_id, &self.message_id)
    }
    fn derive(&self, d: &mut Derived) {
        if self.state == DeliveryState::Pending {
            d.global(PENDING, "pending");
        }
    }
}

/// Errors of the webhook service.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// Bad input, or a rule of the site.
    #[error(transparent)]
    Domain(#[from] DomainError),
    /// No such endpoint or delivery in the tenant.
    #[error("{0}")]
    NotFound(String),
    /// The store could not do it.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<FieldError> for WebhookError {
    fn from(e: FieldError) -> WebhookError {
        WebhookError::Domain(e.into())
    }
}

/// The webhook service.
pub struct Webhooks {
    store: Store,
    clock: SharedClock,
    /// `[webhooks]`, reloadable.
    config: Live<WebhooksConfig>,
    site: SiteRules,
    runtime: Arc<Runtime>,
    capacity: Arc<Capacity>,
    /// Links to decisions, for the chat text of `decision.requested`.
    links: Arc<crate::notify::Links>,
    /// The tries under way, per endpoint and tenant, and each endpoint's
    /// breaker.
    lanes: parking_lot::Mutex<Lanes>,
    /// Told when a try ends: the dispatcher makes another pass.
    pub tried: Arc<tokio::sync::Notify>,
}

/// Who is being sent to now: at most one try per endpoint (its deliveries
/// go in order, and a slow endpoint holds one sender), at most
/// `webhooks.senders_per_tenant` per tenant and `webhooks.senders` in all;
/// and each endpoint's run of failures.
#[derive(Default)]
struct Lanes {
    endpoints: HashSet<Uuid>,
    tenants: HashMap<TenantId, usize>,
    total: usize,
    breakers: HashMap<Uuid, Breaker>,
}

/// An endpoint's failed tries in a row, and until when it is paused.
#[derive(Clone, Copy, Default)]
struct Breaker {
    failures: u32,
    paused_until: Option<DateTime<Utc>>,
}

impl Breaker {
    /// A try failed: the [`BREAKER_FAILURES`]th failure in a row and each
    /// after it pause the endpoint, for longer each time (the seconds).
    /// A success forgets the breaker.
    fn failed(&mut self, now: DateTime<Utc>) -> Option<i64> {
        self.failures += 1;
        if self.failures < BREAKER_FAILURES {
            return None;
        }
        let doublings = (self.failures - BREAKER_FAILURES).min(10);
        let seconds = (BREAKER_FIRST_SECONDS << doublings).min(BREAKER_MAX_SECONDS);
        self.paused_until = Some(now + chrono::Duration::seconds(seconds));
        Some(seconds)
    }
}

impl Webhooks {
    /// The service.
    pub fn new(
        store: Store,
        clock: SharedClock,
        config: Live<WebhooksConfig>,
        site: SiteRules,
        runtime: Arc<Runtime>,
        capacity: Arc<Capacity>,
        links: Arc<crate::notify::Links>,
    ) -> Arc<Webhooks> {
        Arc::new(Webhooks {
            store,
            clock,
            config,
            site,
            runtime,
            capacity,
            links,
            lanes: Default::default(),
            tried: Default::default(),
        })
    }

    fn policy(&self) -> DeliveryPolicy {
        let config = self.config.get();
        DeliveryPolicy {
            first: Duration::from_secs(config.retry_first_seconds),
            max: Duration::from_secs(config.retry_max_seconds),
            max_tries: config.max_tries,
        }
    }

    /// Why the site does not let `tenant`'s endpoint reach `url`, if it
    /// does not: the same allowlist a tenant's releases are held to.
    fn refusal(&self, tenant: &TenantId, url: &str) -> Option<String> {
        let target = match Target::of_url(url) {
            Ok(t) => t,
            Err(e) => return Some(e),
        };
        self.site
            .reach(tenant.as_str())
            .target_refusal("webhook endpoint", &target, &[])
    }

    fn checked(&self, tenant: &TenantId, spec: &EndpointSpec) -> Result<(), WebhookError> {
        spec.check()?;
        if let Some(why) = self.refusal(tenant, &spec.url) {
            return Err(DomainError::Refused(format!("url: {why}")).into());
        }
        Ok(())
    }

    /// Registers an endpoint with a new secret.
    pub async fn create(
        &self,
        scope: &TenantScope,
        spec: EndpointSpec,
        by: &str,
    ) -> Result<WebhookEndpoint, WebhookError> {
        self.checked(scope.tenant(), &spec)?;
        let most = self.config.get().max_endpoints_per_tenant;
        let now = self.clock.now();
        let endpoint = WebhookEndpoint {
            endpoint_id: new_id(),
            tenant_id: scope.tenant().clone(),
            spec,
            secret: new_secret(random()),
            created_by: by.to_string(),
            created_at: now,
            updated_at: now,
        };
        let (s, e) = (scope.clone(), endpoint.clone());
        self.store
            .transact(move |tx: &mut Tx| {
                // Counted in the transaction that adds one: concurrent
                // registrations cannot pass the cap together.
                let held = tx.list::<WebhookEndpoint>(&s)?.len();
                if held >= most as usize {
                    return Err(WebhookError::Domain(DomainError::Refused(format!(
                        "tenant {} has {held} webhook endpoints, the most webhooks.max_endpoints_per_tenant allows ({most}): remove one first",
                        s.tenant()
                    ))));
                }
                tx.put(&s, &e)?;
                let change = AuditChange::new(s.tenant(), "webhook.set", e.endpoint_id.to_string())
                    .after(&e.spec);
                tx.audit(now, change)?;
                Ok(())
            })
            .await?;
        tracing::info!(endpoint = %endpoint.endpoint_id, tenant = %endpoint.tenant_id, by, "webhook endpoint registered");
        Ok(endpoint)
    }

    /// The tenant's endpoints.
    pub fn list(&self, scope: &TenantScope) -> Result<Vec<WebhookEndpoint>, WebhookError> {
        let mut all: Vec<WebhookEndpoint> = self.store.list(scope)?;
        all.sort_by_key(|e| e.created_at);
        Ok(all)
    }

    /// One endpoint of the tenant.
    pub fn get(&self, scope: &TenantScope, id: Uuid) -> Result<WebhookEndpoint, WebhookError> {
        self.store
            .get(scope, &id.to_string())?
            .ok_or_else(|| not_found(scope, id))
    }

    /// Changes an endpoint's settings (its secret stays).
    pub async fn update(
        &self,
        scope: &TenantScope,
        id: Uuid,
        spec: EndpointSpec,
    ) -> Result<WebhookEndpoint, WebhookError> {
        self.checked(scope.tenant(), &spec)?;
        let now = self.clock.now();
        self.change(scope, id, "webhook.set", move |e| {
            e.spec = spec;
            e.updated_at = now;
        })
        .await
    }

    /// A new secret for an endpoint; the old one stops signing at once.
    pub async fn rotate(
        &self,
        scope: &TenantScope,
        id: Uuid,
    ) -> Result<WebhookEndpoint, WebhookError> {
        let now = self.clock.now();
        let secret = new_secret(random());
        let e = self
            .change(scope, id, "webhook.rotate-secret", move |e| {
                e.secret = secret;
                e.updated_at = now;
            })
            .await?;
        tracing::info!(endpoint = %id, tenant = %scope.tenant(), "webhook secret rotated");
        Ok(e)
    }

    async fn change(
        &self,
        scope: &TenantScope,
        id: Uuid,
        action: &'static str,
        f: impl FnOnce(&mut WebhookEndpoint) + Send + 'static,
    ) -> Result<WebhookEndpoint, WebhookError> {
        let s = scope.clone();
        let now = self.clock.now();
        self.store
            .transact(move |tx: &mut Tx| {
                let mut e: WebhookEndpoint = tx
                    .get(&s, &id.to_string())?
                    .ok_or_else(|| not_found(&s, id))?;
                let before = e.spec.clone();
                f(&mut e);
                tx.put(&s, &e)?;
                // The secret is never recorded: a rotation says only that
                // it happened.
                let change = AuditChange::new(s.tenant(), action, id.to_string())
                    .before(&before)
                    .after(&e.spec);
                tx.audit(now, change)?;
                Ok::<_, WebhookError>(e)
            })
            .await
    }

    /// Removes an endpoint with its deliveries.
    pub async fn delete(&self, scope: &TenantScope, id: Uuid) -> Result<(), WebhookError> {
        let s = scope.clone();
        let now = self.clock.now();
        self.store
            .transact(move |tx: &mut Tx| {
                let Some(gone) = tx.get::<WebhookEndpoint>(&s, &id.to_string())? else {
                    return Err(not_found(&s, id));
                };
                let change = AuditChange::new(s.tenant(), "webhook.delete", id.to_string())
                    .before(&gone.spec);
                tx.audit(now, change)?;
                for d in tx.list_under::<Delivery>(&s, &format!("{id}/"))? {
                    tx.delete::<Delivery>(&s, &Delivery::key(id, &d.message_id))?;
                }
                tx.delete::<WebhookEndpoint>(&s, &id.to_string())?;
                Ok(())
            })
            .await?;
        tracing::info!(endpoint = %id, tenant = %scope.tenant(), "webhook endpoint removed");
        Ok(())
    }

    /// An endpoint's deliveries, newest first, at most `limit`.
    pub fn deliveries(
        &self,
        scope: &TenantScope,
        id: Uuid,
        limit: usize,
    ) -> Result<Vec<Delivery>, WebhookError> {
        self.get(scope, id)?;
        let mut all: Vec<Delivery> = self.store.list_under(scope, &format!("{id}/"))?;
        all.sort_by_key(|d| std::cmp::Reverse(d.created_at));
        all.truncate(limit);
        Ok(all)
    }

    /// Asks for another try of a delivery now.
    pub async fn redeliver(
        &self,
        scope: &TenantScope,
        id: Uuid,
        message_id: &str,
    ) -> Result<Delivery, WebhookError> {
        let now = self.clock.now();
        let (s, key) = (scope.clone(), Delivery::key(id, message_id));
        let message = message_id.to_string();
        self.store
            .transact(move |tx: &mut Tx| {
                let mut d: Delivery = tx.get(&s, &key)?.ok_or_else(|| {
                    WebhookError::NotFound(format!(
                        "endpoint {id} has no delivery {message:?} in tenant {}",
                        s.tenant()
                    ))
                })?;
                d.redeliver(now);
                tx.put(&s, &d)?;
                let change = AuditChange::new(s.tenant(), "webhook.redeliver", id.to_string())
                    .detail(format!("delivery {message} asked for again"));
                tx.audit(now, change)?;
                Ok::<_, WebhookError>(d)
            })
            .await
    }

    /// Every enabled endpoint of every tenant.
    fn endpoints(&self) -> Result<Vec<WebhookEndpoint>, StoreError> {
        Ok(self
            .store
            .scan_all::<WebhookEndpoint>(&PlatformScope::internal())?
            .into_iter()
            .filter(|e| e.spec.enabled)
            .collect())
    }

    /// One pass: messages from the outbox and from watched states, then
    /// every due delivery, then the expired ones' removal.
    pub async fn pass(self: &Arc<Self>, now: DateTime<Utc>) -> anyhow::Result<String> {
        let endpoints = self.endpoints()?;
        let from_events = self.fan_out(&endpoints, now).await?;
        let watched = self.watch(&endpoints, now).await?;
        let (started, paused) = self.deliver(now)?;
        let pruned = self.prune(&endpoints, now).await?;
        Ok(format!(
            "{from_events} messages from events, {watched} from watched states; {started} tries started, {paused} due to paused endpoints; {pruned} old deliveries removed"
        ))
    }

    /// Creates the deliveries of the outbox's events after the cursor and
    /// moves the cursor, in one transaction.
    async fn fan_out(
        &self,
        endpoints: &[WebhookEndpoint],
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        let head = self.store.events_head();
        let cursor = match self.store.meta_get(CURSOR)? {
            Some(b) if b.len() == 8 => u64::from_be_bytes(b.try_into().expect("eight bytes")),
            // The first pass ever: messages start now, not with history.
            _ => {
                self.store
                    .transact(move |tx: &mut Tx| {
                        tx.meta_put(CURSOR, &head.to_be_bytes());
                        Ok::<_, StoreError>(())
                    })
                    .await?;
                return Ok(0);
            }
        };
        if cursor >= head {
            return Ok(0);
        }
        let filter = EventFilter {
            tenant: None,
            topics: WebhookEvent::ALL
                .iter()
                .filter_map(|e| e.topic())
                .map(String::from)
                .collect(),
        };
        let events: Vec<_> = self
            .store
            .events_after(&filter, cursor, BATCH)?
            .into_iter()
            .filter(|e| e.sequence <= head)
            .collect();
        let next = if events.len() < BATCH {
            head
        } else {
            events.last().map_or(head, |e| e.sequence)
        };
        let mut deliveries = Vec::new();
        for event in &events {
            let Some(kind) = WebhookEvent::of_topic(&event.topic) else {
                continue;
            };
            let mut data = event.payload.clone();
            if let Some(o) = data.as_object_mut() {
                o.insert("topic".into(), event.topic.clone().into());
                o.insert("sequence".into(), event.sequence.into());
                o.insert("occurredAt".into(), event.occurred_at.to_rfc3339().into());
            }
            // A decision's message carries a ready chat text with a link
            // of its own per endpoint (a link opens once).
            let decision = match kind {
                WebhookEvent::DecisionRequested => {
                    crate::notify::decision_of(&self.store, &event.tenant_id, &event.payload)?
                }
                _ => None,
            };
            for e in endpoints
                .iter()
                .filter(|e| e.receives(kind, &event.tenant_id))
            {
                let (mut data, mut text) = (data.clone(), None);
                if let Some(d) = &decision {
                    let link = self.links.url(d, None);
                    text = Some(crate::domain::notify::chat(d, &link));
                    data["link"] = link.into();
                }
                deliveries.push(Delivery::new(
                    e,
                    kind,
                    kind.message_id(&event.sequence.to_string()),
                    event.tenant_id.clone(),
                    data,
                    text,
                    now,
                ));
            }
        }
        let created = self.create_deliveries(deliveries, Some(next)).await?;
        Ok(created)
    }

    /// Stores the deliveries that do not exist yet (and moves the cursor,
    /// when given), in one transaction; returns how many were new.
    async fn create_deliveries(
        &self,
        deliveries: Vec<Delivery>,
        cursor: Option<u64>,
    ) -> Result<usize, StoreError> {
        if deliveries.is_empty() && cursor.is_none() {
            return Ok(0);
        }
        self.store
            .transact(move |tx: &mut Tx| {
                let mut created = 0;
                for d in &deliveries {
                    let scope = TenantScope::new(d.tenant_id.clone());
                    if tx.get::<Delivery>(&scope, &Record::id(d))?.is_none() {
                        tx.put(&scope, d)?;
                        created += 1;
                    }
                }
                if let Some(c) = cursor {
                    tx.meta_put(CURSOR, &c.to_be_bytes());
                }
                Ok::<_, StoreError>(created)
            })
            .await
    }

    /// Creates the deliveries of watched states: decisions about to
    /// expire, Uncertain calls, leases queued too long.
    async fn watch(
        &self,
        endpoints: &[WebhookEndpoint],
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        let wants = |k: WebhookEvent| endpoints.iter().any(|e| e.spec.events.contains(&k));
        let mut deliveries = Vec::new();
        let tenants: Vec<TenantId> =
            if wants(WebhookEvent::DecisionExpiring) || wants(WebhookEvent::CallUncertain) {
                self.capacity
                    .tenants()
                    .into_iter()
                    .map(|t| t.tenant_id)
                    .collect()
            } else {
                Vec::new()
            };
        for tenant in &tenants {
            let scope = TenantScope::new(tenant.clone());
            let receivers = |k: WebhookEvent| {
                endpoints
                    .iter()
                    .filter(move |e| e.receives(k, tenant))
                    .collect::<Vec<_>>()
            };
            let expiring = receivers(WebhookEvent::DecisionExpiring);
            if !expiring.is_empty() {
                for d in self
                    .runtime
                    .pending_decisions(&scope, usize::MAX)
                    .unwrap_or_default()
                {
                    let left = d.expires_at - now;
                    for e in &expiring {
                        if left <= chrono::Duration::minutes(e.spec.decision_expiry_minutes.into())
                        {
                            let link = self.links.url(&d, None);
                            deliveries.push(Delivery::new(
                                e,
                                WebhookEvent::DecisionExpiring,
                                WebhookEvent::DecisionExpiring
                                    .message_id(&d.decision_id.to_string()),
                                tenant.clone(),
                                serde_json::json!({
                                    "decisionId": d.decision_id,
                                    "attemptId": d.attempt_id,
                                    "runId": d.run_id,
                                    "kind": d.kind.as_str(),
                                    "summary": d.summary,
                                    "requestedAt": d.requested_at,
                                    "expiresAt": d.expires_at,
                                    "secondsLeft": left.num_seconds().max(0),
                                    "link": link,
                                }),
                                Some(format!(
                                    "Expires soon. {}",
                                    crate::domain::notify::chat(&d, &link)
                                )),
                                now,
                            ));
                        }
                    }
                }
            }
            let uncertain = receivers(WebhookEvent::CallUncertain);
            if !uncertain.is_empty() {
                for c in self.runtime.unsettled_calls(&scope).unwrap_or_default() {
                    if c.settlement.is_some() {
                        continue;
                    }
                    for e in &uncertain {
                        deliveries.push(Delivery::new(
                            e,
                            WebhookEvent::CallUncertain,
                            WebhookEvent::CallUncertain.message_id(&c.call_id.to_string()),
                            tenant.clone(),
                            serde_json::json!({
                                "callId": c.call_id,
                                "attemptId": c.attempt_id,
                                "kind": c.kind.as_str(),
                                "target": c.target,
                                "requestHash": c.request_hash,
                                "receiptRef": c.receipt_ref,
                                "error": c.error,
                                "startedAt": c.started_at,
                            }),
                            None,
                            now,
                        ));
                    }
                }
            }
        }
        if wants(WebhookEvent::LeaseQueued) {
            for snapshot in self.capacity.snapshots().await {
                for waiter in &snapshot.queue {
                    let lease = &waiter.lease;
                    let waited = now - lease.requested_at;
                    for e in endpoints.iter().filter(|e| {
                        e.receives(WebhookEvent::LeaseQueued, &lease.tenant_id)
                            && waited
                                >= chrono::Duration::seconds(e.spec.lease_queued_seconds.into())
                    }) {
                        deliveries.push(Delivery::new(
                            e,
                            WebhookEvent::LeaseQueued,
                            WebhookEvent::LeaseQueued.message_id(&lease.lease_id.to_string()),
                            lease.tenant_id.clone(),
                            serde_json::json!({
                                "leaseId": lease.lease_id,
                                "poolId": lease.pool_id,
                                "projectId": lease.project_id,
                                "runId": lease.run_id,
                                "attemptId": lease.attempt_id,
                                "holderKind": lease.holder_kind,
                                "requestedAt": lease.requested_at,
                                "waitedSeconds": waited.num_seconds(),
                                "queuePosition": waiter.queue_position,
                                "limit": waiter.limit.as_ref().map(|l| l.label()),
                                "reason": waiter.limit.as_ref().map(|l| l.to_string()),
                            }),
                            None,
                            now,
                        ));
                    }
                }
            }
        }
        // A watched thing is announced once: the ids of what exists are
        // read in the transaction, which creates only the new ones.
        self.create_deliveries(deliveries, None).await
    }

    /// Pending deliveries, read through the global index.
    fn pending(&self) -> Result<Vec<Delivery>, StoreError> {
        let mut out = Vec::new();
        for (tenant, id) in self
            .store
            .global_ids(&PlatformScope::internal(), PENDING, "pending")?
        {
            if let Some(d) = self.store.get::<Delivery>(&TenantScope::new(tenant), &id)? {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// Starts a try of each due delivery that may go now (see [`Lanes`];
    /// a paused endpoint's wait), each recorded when it ends, on its own:
    /// the pass waits for none of them. Returns (tries started, deliveries
    /// of paused endpoints).
    fn deliver(self: &Arc<Self>, now: DateTime<Utc>) -> Result<(usize, usize), StoreError> {
        let mut due: Vec<Delivery> = self.pending()?.into_iter().filter(|d| d.due(now)).collect();
        if due.is_empty() {
            return Ok((0, 0));
        }
        due.sort_by_key(|d| (d.next_try_at, d.created_at));
        let endpoints: HashMap<Uuid, WebhookEndpoint> = self
            .store
            .scan_all::<WebhookEndpoint>(&PlatformScope::internal())?
            .into_iter()
            .map(|e| (e.endpoint_id, e))
            .collect();
        let config = self.config.get();
        let (mut started, mut paused) = (0, 0);
        let mut lanes = self.lanes.lock();
        for d in due {
            if lanes.total >= config.senders as usize {
                break;
            }
            if lanes.endpoints.contains(&d.endpoint_id) {
                continue;
            }
            if lanes
                .breakers
                .get(&d.endpoint_id)
                .and_then(|b| b.paused_until)
                .is_some_and(|until| until > now)
            {
                paused += 1;
                continue;
            }
            let tenant_busy = lanes.tenants.get(&d.tenant_id).copied().unwrap_or(0);
            if tenant_busy >= config.senders_per_tenant as usize {
                continue;
            }
            lanes.endpoints.insert(d.endpoint_id);
            *lanes.tenants.entry(d.tenant_id.clone()).or_default() += 1;
            lanes.total += 1;
            started += 1;
            let endpoint = endpoints.get(&d.endpoint_id).cloned();
            let this = self.clone();
            tokio::spawn(async move { this.try_one(endpoint, d).await });
        }
        Ok((started, paused))
    }

    /// One try of `d` and its record; then its lane is free and the
    /// dispatcher is told.
    async fn try_one(self: Arc<Self>, endpoint: Option<WebhookEndpoint>, d: Delivery) {
        let attempt = match &endpoint {
            Some(e) => self.send(e, &d).await,
            None => DeliveryTry {
                at: self.clock.now(),
                status: None,
                error: Some("the endpoint was removed".into()),
                duration_ms: 0,
            },
        };
        let ok = attempt.succeeded();
        if let Err(e) = self.record(&d, attempt).await {
            tracing::warn!(error = %e, endpoint = %d.endpoint_id, "a webhook try could not be recorded; it is tried again");
        }
        {
            let mut lanes = self.lanes.lock();
            lanes.endpoints.remove(&d.endpoint_id);
            if let Some(n) = lanes.tenants.get_mut(&d.tenant_id) {
                *n -= 1;
                if *n == 0 {
                    lanes.tenants.remove(&d.tenant_id);
                }
            }
            lanes.total -= 1;
            if ok {
                lanes.breakers.remove(&d.endpoint_id);
            } else {
                let breaker = lanes.breakers.entry(d.endpoint_id).or_default();
                if let Some(seconds) = breaker.failed(self.clock.now()) {
                    tracing::warn!(endpoint = %d.endpoint_id, tenant = %d.tenant_id, failures = breaker.failures, seconds, "webhook endpoint failing: its deliveries wait");
                }
            }
        }
        self.tried.notify_one();
    }

    /// Records a try of `d` on the stored delivery.
    async fn record(&self, d: &Delivery, attempt: DeliveryTry) -> Result<(), StoreError> {
        let policy = self.policy();
        let (scope, id) = (TenantScope::new(d.tenant_id.clone()), Record::id(d));
        self.store
            .transact(move |tx: &mut Tx| {
                // The stored state, not the one read before sending: an
                // operator may have asked for a redelivery meanwhile.
                let Some(mut stored) = tx.get::<Delivery>(&scope, &id)? else {
                    return Ok(());
                };
                if stored.state != DeliveryState::Pending {
                    return Ok(());
                }
                stored.record(attempt, &policy);
                let outcome = match stored.state {
                    DeliveryState::Delivered => "delivered",
                    DeliveryState::GaveUp => "gave_up",
                    DeliveryState::Pending => "retry",
                };
                metrics::counter!(names::WEBHOOK_DELIVERIES, "outcome" => outcome).increment(1);
                if stored.state == DeliveryState::GaveUp {
                    tracing::warn!(endpoint = %stored.endpoint_id, message = %stored.message_id, tries = stored.tries.len(), "webhook delivery given up");
                }
                tx.put(&scope, &stored)?;
                Ok::<_, StoreError>(())
            })
            .await
    }

    /// Why an endpoint's deliveries wait, if they wait for its breaker.
    pub fn paused(&self, endpoint: Uuid) -> Option<String> {
        let lanes = self.lanes.lock();
        let b = lanes.breakers.get(&endpoint)?;
        let until = b.paused_until.filter(|u| *u > self.clock.now())?;
        Some(format!(
            "{} tries in a row failed: its deliveries wait until {}",
            b.failures,
            until.format("%Y-%m-%d %H:%M:%S UTC")
        ))
    }

    /// One try of a delivery.
    async fn send(&self, endpoint: &WebhookEndpoint, d: &Delivery) -> DeliveryTry {
        let started = std::time::Instant::now();
        let at = self.clock.now();
        let timeout = Duration::from_secs(self.config.get().timeout_seconds);
        let done = |status: Option<u16>, error: Option<String>| DeliveryTry {
            at,
            status,
            error,
            duration_ms: started.elapsed().as_millis() as u64,
        };
        // The site's rule at send time: an allowlist changed since the
        // registration holds.
        let client = match crate::runtime::reach::pinned_client(
            &self.site.reach(endpoint.tenant_id.as_str()),
            "webhook endpoint",
            &endpoint.spec.url,
            timeout,
        )
        .await
        {
            Ok(c) => c,
            Err(why) => return done(None, Some(why)),
        };
        let timestamp = at.timestamp();
        let signature =
            crate::domain::webhook::sign(&endpoint.secret, &d.message_id, timestamp, &d.body);
        let sent = client
            .post(&endpoint.spec.url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header(
                "user-agent",
                concat!("agentbay/", env!("CARGO_PKG_VERSION")),
            )
            .header("webhook-id", &d.message_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(d.body.clone())
            .send()
            .await;
        match sent {
            Ok(r) => {
                let status = r.status().as_u16();
                let error = (!r.status().is_success())
                    .then(|| format!("the endpoint answered {}", r.status()));
                done(Some(status), error)
            }
            Err(e) => done(None, Some(format!("{e}"))),
        }
    }

    /// Removes finished deliveries older than `webhooks.keep_days`.
    async fn prune(
        &self,
        endpoints: &[WebhookEndpoint],
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        let cutoff = now - chrono::Duration::days(self.config.get().keep_days.into());
        let mut old = Vec::new();
        for e in endpoints {
            let scope = TenantScope::new(e.tenant_id.clone());
            for d in self
                .store
                .list_under::<Delivery>(&scope, &format!("{}/", e.endpoint_id))?
            {
                if d.finished_at().is_some_and(|t| t < cutoff) {
                    old.push((scope.clone(), Record::id(&d)));
                }
            }
        }
        let n = old.len();
        if n > 0 {
            self.store
                .transact(move |tx: &mut Tx| {
                    for (scope, id) in old {
                        tx.delete::<Delivery>(&scope, &id)?;
                    }
                    Ok::<_, StoreError>(())
                })
                .await?;
        }
        Ok(n)
    }

    /// The gauges of pending deliveries at `now`.
    pub fn gauges(&self, now: DateTime<Utc>) -> Vec<Gauge> {
        let pending = self.pending().unwrap_or_default();
        let mut count = Gauge::new(
            names::WEBHOOK_PENDING,
            "Webhook deliveries neither delivered nor given up",
        );
        count.set(&[], pending.len() as f64);
        let mut oldest = Gauge::new(
            names::WEBHOOK_OLDEST_PENDING,
            "Age in seconds of the oldest pending webhook delivery",
        );
        oldest.set(
            &[],
            pending
                .iter()
                .map(|d| (now - d.created_at).num_milliseconds().max(0) as f64 / 1000.0)
                .fold(0.0, f64::max),
        );
        vec![count, oldest]
    }
}

fn not_found(scope: &TenantScope, id: Uuid) -> WebhookError {
    WebhookError::NotFound(format!(
        "tenant {} has no webhook endpoint {id}",
        scope.tenant()
    ))
}

fn random() -> [u8; 32] {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system's random source works");
    bytes
}

/// The WebhookDispatcher worker.
pub struct WebhookDispatcher {
    /// The service.
    pub webhooks: Arc<Webhooks>,
}

impl Worker for WebhookDispatcher {
    fn name(&self) -> &'static str {
        "WebhookDispatcher"
    }

    fn schedule(&self) -> Schedule {
        Schedule::seconds(self.webhooks.config.get().poll_seconds)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Fixed
    }

    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(self.webhooks.pass(now))
    }
}
