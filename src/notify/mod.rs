//! Notifications: each new decision told to the people who may answer it,
//! by mail through the site's relay (`[notify.smtp]`), each with a signed,
//! expiring, single-use link to the decision's page (see
//! [`crate::domain::notify`]).
//!
//! The Notifier reads the event outbox from its own cursor (kept in the
//! store) like the WebhookDispatcher: in one transaction with the
//! cursor's move it stores one mail per person, so a kill -9 anywhere
//! loses none (the cursor is behind, or the mail is stored and pending)
//! and sends none twice to the relay's knowledge more than "at least
//! once" allows. Pending mails are sent at each pass, each try recorded;
//! a failure is tried again with exponential backoff until
//! `notify.smtp.max_tries`, a refusal the relay calls permanent is not.
//!
//! Mail is off while `notify.smtp.relay` is empty: no cursor is kept, and
//! mail starts with the decisions asked after it is turned on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use crate::clock::SharedClock;
use crate::config::{Live, NotifyConfig, SmtpConfig, SmtpSecurity};
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::attempt::{DecisionRequest, DecisionStatus};
use crate::domain::events::EventFilter;
use crate::domain::notify::{
    LINK_PATH, LinkClaims, LinkRefusal, LinkUse, Mail, MailState, MailTry, message, recipients,
};
use crate::domain::user::User;
use crate::domain::webhook::DeliveryPolicy;
use crate::domain::{TenantId, attempt::events::AttemptDecisionRequested};
use crate::store::{Derived, Record, Store, StoreError, Table, Tx};
use crate::telemetry::names;
use crate::worker::{RetryKind, Schedule, Worker};

/// The outbox topic the Notifier reads: a decision was asked for.
pub const TOPIC: &str = <AttemptDecisionRequested as crate::domain::events::EventPayload>::TOPIC;
/// Meta key of the outbox cursor.
const CURSOR: &str = "notify.cursor";
/// Meta key of the links' signing key.
const LINK_KEY: &str = "notify.link_key";
/// Global index of pending mails.
const PENDING: &str = "mail-pending";
/// Outbox events read per pass.
const BATCH: usize = 200;
/// Mails tried per pass.
const SENDS_PER_PASS: usize = 100;
/// Seconds before the first retry of a failed mail; doubled each time.
const RETRY_FIRST: Duration = Duration::from_secs(30);
/// The longest wait between two tries.
const RETRY_MAX: Duration = Duration::from_secs(3600);
/// How often old mails and spent links are looked for.
const PRUNE_EVERY: chrono::Duration = chrono::Duration::minutes(10);

impl Record for Mail {
    const TABLE: Table = Table::Mails;
    const VERSION: u16 = 1;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.mail_id.clone()
    }
    fn derive(&self, d: &mut Derived) {
        if self.state == MailState::Pending {
            d.global(PENDING, "pending");
        }
    }
}

impl Record for LinkUse {
    const TABLE: Table = Table::LinkUses;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.nonce.to_string()
    }
}

/// Links to decisions: made for mails and chat messages, opened by the
/// console.
pub struct Links {
    store: Store,
    clock: SharedClock,
    config: Live<NotifyConfig>,
    listen: SocketAddr,
    key: Vec<u8>,
}

impl Links {
    /// The links of the appliance, with its signing key (made on first
    /// use, kept in the store, so both nodes of a pair sign alike).
    pub async fn open(
        store: Store,
        clock: SharedClock,
        config: Live<NotifyConfig>,
        listen: SocketAddr,
    ) -> Result<Arc<Links>, StoreError> {
        let mut fresh = [0u8; 32];
        getrandom::fill(&mut fresh).expect("the OS random source works");
        let key = store
            .transact(move |tx: &mut Tx| match tx.meta_get(LINK_KEY)? {
                Some(existing) => Ok::<_, StoreError>(existing),
                None => {
                    tx.meta_put(LINK_KEY, &fresh);
                    Ok(fresh.to_vec())
                }
            })
            .await?;
        Ok(Arc::new(Links {
            store,
            clock,
            config,
            listen,
            key,
        }))
    }

    /// A link to `d` for `user` (a mail) or for whoever reads a channel.
    pub fn url(&self, d: &DecisionRequest, user: Option<&str>) -> String {
        let config = self.config.get();
        let claims = LinkClaims::new(d, user, self.clock.now(), config.link_hours);
        format!(
            "{}{LINK_PATH}{}",
            config.base_url(self.listen),
            claims.sign(&self.key)
        )
    }

    /// Opens a link for the signed-in `username` of `tenant`: the
    /// decision's page when the link is ours, unexpired, unused and meant
    /// for this person; the use is recorded, so it opens once.
    pub async fn open_link(
        &self,
        token: &str,
        username: &str,
        may_see: impl Fn(&TenantId) -> bool,
    ) -> Result<LinkClaims, LinkRefusal> {
        let now = self.clock.now();
        let claims = LinkClaims::verify(&self.key, token, now)?;
        if let Some(sent_to) = claims.user.as_ref().filter(|u| *u != username) {
            return Err(LinkRefusal::OtherPerson {
                sent_to: sent_to.clone(),
            });
        }
        if !may_see(&claims.tenant_id) {
            return Err(LinkRefusal::OtherTenant(claims.tenant_id.clone()));
        }
        let used = LinkUse {
            nonce: claims.nonce,
            tenant_id: claims.tenant_id.clone(),
            used_by: username.to_string(),
            used_at: now,
            expires_at: claims.expires_at(),
        };
        let opened = self
            .store
            .transact(move |tx: &mut Tx| {
                let scope = TenantScope::new(used.tenant_id.clone());
                if let Some(before) = tx.get::<LinkUse>(&scope, &Record::id(&used))? {
                    return Ok::<_, StoreError>(Err(LinkRefusal::Used {
                        at: before.used_at,
                        by: before.used_by,
                    }));
                }
                tx.put(&scope, &used)?;
                Ok(Ok(()))
            })
            .await;
        match opened {
            Ok(Ok(())) => Ok(claims),
            Ok(Err(refusal)) => Err(refusal),
            Err(e) => {
                tracing::warn!(error = %e, "recording a link's use");
                Err(LinkRefusal::Unavailable)
            }
        }
    }
}

/// The notifier.
pub struct Notifier {
    store: Store,
    clock: SharedClock,
    config: Live<NotifyConfig>,
    links: Arc<Links>,
    /// When old mails and spent links were last looked for.
    pruned_at: parking_lot::Mutex<Option<DateTime<Utc>>>,
}

impl Notifier {
    /// A notifier over the store.
    pub fn new(
        store: Store,
        clock: SharedClock,
        config: Live<NotifyConfig>,
        links: Arc<Links>,
    ) -> Arc<Notifier> {
        Arc::new(Notifier {
            store,
            clock,
            config,
            links,
            pruned_at: Default::default(),
        })
    }

    fn policy(&self) -> DeliveryPolicy {
        DeliveryPolicy {
            first: RETRY_FIRST,
            max: RETRY_MAX,
            max_tries: self.config.get().smtp.max_tries,
        }
    }

    /// One pass: mails of the new decisions, then the due mails sent, then
    /// old mails and spent links removed.
    pub async fn pass(&self, now: DateTime<Utc>) -> anyhow::Result<String> {
        let config = self.config.get();
        let made = self.fan_out(&config, now).await?;
        let (sent, failed) = match config.smtp.relay() {
            Some(_) => self.send_due(&config.smtp, now).await?,
            None => (0, 0),
        };
        let pruned = self.prune(&config, now).await?;
        Ok(format!(
            "{made} mails made; {sent} sent, {failed} failed; {pruned} old mails and spent links removed"
        ))
    }

    /// Stores the mails of the decisions asked since the cursor and moves
    /// the cursor, in one transaction.
    async fn fan_out(&self, config: &NotifyConfig, now: DateTime<Utc>) -> anyhow::Result<usize> {
        let cursor = self.store.meta_get(CURSOR)?;
        if config.smtp.relay().is_none() {
            // Mail is off: no cursor, so that turning it on starts now.
            if cursor.is_some() {
                self.move_cursor(None, Vec::new()).await?;
            }
            return Ok(0);
        }
        let head = self.store.events_head();
        let cursor = match cursor {
            Some(b) if b.len() == 8 => u64::from_be_bytes(b.try_into().expect("eight bytes")),
            _ => {
                self.move_cursor(Some(head), Vec::new()).await?;
                return Ok(0);
            }
        };
        if cursor >= head {
            return Ok(0);
        }
        let filter = EventFilter {
            tenant: None,
            topics: vec![TOPIC.into()],
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
        let mut users: std::collections::HashMap<TenantId, Vec<User>> = Default::default();
        let mut mails = Vec::new();
        for event in &events {
            let Some(d) = decision_of(&self.store, &event.tenant_id, &event.payload)? else {
                continue;
            };
            // Answered before the pass came: no one needs telling.
            if d.status != DecisionStatus::Pending {
                continue;
            }
            let people = match users.entry(d.tenant_id.clone()) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => v.insert(
                    self.store
                        .list::<User>(&TenantScope::new(d.tenant_id.clone()))?,
                ),
            };
            for u in recipients(&d, people, config.max_recipients as usize) {
                let link = self.links.url(&d, Some(&u.username));
                let words = message(&d, &link);
                mails.push(Mail {
                    mail_id: Mail::key(d.attempt_id, d.decision_id, &u.username),
                    tenant_id: d.tenant_id.clone(),
                    attempt_id: d.attempt_id,
                    decision_id: d.decision_id,
                    username: u.username.clone(),
                    address: u.email.clone().unwrap_or_default(),
                    subject: words.subject,
                    text: words.text,
                    created_at: now,
                    state: MailState::Pending,
                    next_try_at: Some(now),
                    tries: Vec::new(),
                });
            }
        }
        self.move_cursor(Some(next), mails).await
    }

    /// Stores the mails not stored yet and sets (or, with `None`, removes)
    /// the cursor, in one transaction; returns how many were new.
    async fn move_cursor(&self, cursor: Option<u64>, mails: Vec<Mail>) -> anyhow::Result<usize> {
        Ok(self
            .store
            .transact(move |tx: &mut Tx| {
                let mut made = 0;
                for m in &mails {
                    let scope = TenantScope::new(m.tenant_id.clone());
                    if tx.get::<Mail>(&scope, &m.mail_id)?.is_none() {
                        tx.put(&scope, m)?;
                        made += 1;
                    }
                }
                match cursor {
                    Some(c) => tx.meta_put(CURSOR, &c.to_be_bytes()),
                    None => tx.meta_delete(CURSOR),
                }
                Ok::<_, StoreError>(made)
            })
            .await?)
    }

    /// Sends the due mails, oldest first; stops at the first failure that
    /// is not the mail's own (the relay unreachable): the rest wait for the
    /// next pass. Returns (sent, failed).
    async fn send_due(
        &self,
        smtp: &SmtpConfig,
        now: DateTime<Utc>,
    ) -> anyhow::Result<(usize, usize)> {
        let mut due = Vec::new();
        for (tenant, id) in self
            .store
            .global_ids(&PlatformScope::internal(), PENDING, "pending")?
        {
            if let Some(m) = self.store.get::<Mail>(&TenantScope::new(tenant), &id)?
                && m.due(now)
            {
                due.push(m);
            }
        }
        if due.is_empty() {
            return Ok((0, 0));
        }
        due.sort_by_key(|m| m.created_at);
        due.truncate(SENDS_PER_PASS);
        let relay = match transport(smtp) {
            Ok(t) => t,
            Err(why) => {
                tracing::warn!(error = %why, "mail relay: no mail can be sent");
                anyhow::bail!("notify.smtp: {why}");
            }
        };
        let from = sender(smtp)?;
        let (mut sent, mut failed) = (0, 0);
        for mail in due {
            let t = self.try_one(&relay, &from, &mail).await;
            let (ok, relay_down) = (t.error.is_none(), t.error.is_some() && !t.permanent);
            self.record(&mail, t).await?;
            if ok {
                sent += 1;
            } else {
                failed += 1;
                if relay_down {
                    break;
                }
            }
        }
        Ok((sent, failed))
    }

    /// One try of one mail.
    async fn try_one(
        &self,
        relay: &AsyncSmtpTransport<Tokio1Executor>,
        from: &lettre::message::Mailbox,
        mail: &Mail,
    ) -> MailTry {
        let at = self.clock.now();
        let refused = |error: String| MailTry {
            at,
            error: Some(error),
            permanent: true,
        };
        let to = match mail.address.parse::<lettre::message::Mailbox>() {
            Ok(to) => to,
            Err(e) => return refused(format!("the address {:?}: {e}", mail.address)),
        };
        let built = lettre::Message::builder()
            .from(from.clone())
            .to(to)
            .subject(&mail.subject)
            .header(ContentType::TEXT_PLAIN)
            .body(mail.text.clone());
        let message = match built {
            Ok(m) => m,
            Err(e) => return refused(format!("the message: {e}")),
        };
        match relay.send(message).await {
            Ok(_) => MailTry {
                at,
                error: None,
                permanent: false,
            },
            Err(e) => MailTry {
                at,
                permanent: e.is_permanent(),
                error: Some(e.to_string()),
            },
        }
    }

    /// Records a try on the stored mail.
    async fn record(&self, mail: &Mail, t: MailTry) -> Result<(), StoreError> {
        let policy = self.policy();
        let (scope, id) = (
            TenantScope::new(mail.tenant_id.clone()),
            mail.mail_id.clone(),
        );
        self.store
            .transact(move |tx: &mut Tx| {
                let Some(mut stored) = tx.get::<Mail>(&scope, &id)? else {
                    return Ok(());
                };
                if stored.state != MailState::Pending {
                    return Ok(());
                }
                stored.record(t, &policy);
                let outcome = match stored.state {
                    MailState::Sent => "sent",
                    MailState::GaveUp => "gave_up",
                    MailState::Pending => "retry",
                };
                metrics::counter!(names::NOTIFY_MAILS, "outcome" => outcome).increment(1);
                if stored.state == MailState::GaveUp {
                    let why = stored.tries.last().and_then(|t| t.error.clone());
                    tracing::warn!(mail = %stored.mail_id, tenant = %stored.tenant_id, tries = stored.tries.len(), error = ?why, "mail given up");
                }
                tx.put(&scope, &stored)?;
                Ok::<_, StoreError>(())
            })
            .await
    }

    /// Removes mails finished more than `notify.keep_days` ago and the
    /// uses of links that have expired.
    async fn prune(&self, config: &NotifyConfig, now: DateTime<Utc>) -> anyhow::Result<usize> {
        {
            let mut last = self.pruned_at.lock();
            if last.is_some_and(|t| now - t < PRUNE_EVERY) {
                return Ok(0);
            }
            *last = Some(now);
        }
        let cutoff = now - chrono::Duration::days(config.keep_days.into());
        let platform = PlatformScope::internal();
        let mut old: Vec<(TenantScope, String, bool)> = Vec::new();
        for m in self.store.scan_all::<Mail>(&platform)? {
            if m.finished_at().is_some_and(|t| t < cutoff) {
                old.push((TenantScope::new(m.tenant_id.clone()), m.mail_id, true));
            }
        }
        for u in self.store.scan_all::<LinkUse>(&platform)? {
            if u.expires_at < now {
                old.push((
                    TenantScope::new(u.tenant_id.clone()),
                    u.nonce.to_string(),
                    false,
                ));
            }
        }
        if old.is_empty() {
            return Ok(0);
        }
        let count = old.len();
        self.store
            .transact(move |tx: &mut Tx| {
                for (scope, id, mail) in &old {
                    if *mail {
                        tx.delete::<Mail>(scope, id)?;
                    } else {
                        tx.delete::<LinkUse>(scope, id)?;
                    }
                }
                Ok::<_, StoreError>(())
            })
            .await?;
        Ok(count)
    }

    /// Mails about one decision, for its page: who was told, and how it
    /// went.
    pub fn mails_of(
        &self,
        scope: &TenantScope,
        d: &DecisionRequest,
    ) -> Result<Vec<Mail>, crate::domain::DomainError> {
        Ok(self
            .store
            .list_under::<Mail>(scope, &Mail::prefix(d.attempt_id, d.decision_id))?)
    }
}

/// The decision a `decision-requested` event names, if it is still stored.
pub fn decision_of(
    store: &Store,
    tenant: &TenantId,
    payload: &serde_json::Value,
) -> Result<Option<DecisionRequest>, StoreError> {
    let id = |k: &str| {
        payload
            .get(k)
            .and_then(|v| v.as_str())
            .and_then(|s| s.parse::<uuid::Uuid>().ok())
    };
    let (Some(attempt), Some(decision)) = (id("attemptId"), id("decisionId")) else {
        return Ok(None);
    };
    store.get::<DecisionRequest>(
        &TenantScope::new(tenant.clone()),
        &crate::runtime::decision_key(attempt, decision),
    )
}

/// The relay's transport as configured.
fn transport(smtp: &SmtpConfig) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    let (host, port) = smtp.relay().ok_or_else(|| "relay: not set".to_string())?;
    let tls = |host: &str| -> Result<TlsParameters, String> {
        let mut params = TlsParameters::builder(host.to_string());
        if let Some(path) = &smtp.ca_file {
            let pem =
                std::fs::read(path).map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            let ca = Certificate::from_pem(&pem)
                .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            params = params.add_root_certificate(ca);
        }
        params.build_rustls().map_err(|e| format!("TLS: {e}"))
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&host)
        .port(port)
        .timeout(Some(Duration::from_secs(smtp.timeout_seconds)));
    builder = match smtp.security {
        SmtpSecurity::Starttls => builder.tls(Tls::Required(tls(&host)?)),
        SmtpSecurity::Tls => builder.tls(Tls::Wrapper(tls(&host)?)),
        SmtpSecurity::None => builder.tls(Tls::None),
    };
    if !smtp.username.is_empty() {
        builder = builder.credentials(Credentials::new(
            smtp.username.clone(),
            smtp.password
                .as_ref()
                .map(|p| p.expose().to_string())
                .unwrap_or_default(),
        ));
    }
    Ok(builder.build())
}

/// The sender: `notify.smtp.from`, or `agentbay@<host name>`.
fn sender(smtp: &SmtpConfig) -> anyhow::Result<lettre::message::Mailbox> {
    let from = if smtp.from.is_empty() {
        format!("agentbay@{}", gethostname::gethostname().to_string_lossy())
    } else {
        smtp.from.clone()
    };
    let address: lettre::Address = from
        .parse()
        .map_err(|e| anyhow::anyhow!("notify.smtp.from {from:?}: {e}"))?;
    Ok(lettre::message::Mailbox::new(
        Some("agentbay".into()),
        address,
    ))
}

/// The Notifier worker.
pub struct NotifyWorker {
    /// The notifier.
    pub notifier: Arc<Notifier>,
}

impl Worker for NotifyWorker {
    fn name(&self) -> &'static str {
        "Notifier"
    }

    fn schedule(&self) -> Schedule {
        Schedule::seconds(5)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Fixed
    }

    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(self.notifier.pass(now))
    }
}
