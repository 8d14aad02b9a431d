//! The audit trail: who did what to which record, from where, and what it
//! changed, as one hash chain.
//!
//! Every administrative and human action (decisions, settlements,
//! cancels, holds, re-runs, releases, trust, quotas, pools, tenants, users,
//! clients, configuration reloads, sign-ins) leaves one [`AuditRecord`],
//! written in the same store transaction as the change it describes. The
//! records are numbered in commit order and each carries the hash of the
//! one before ([`AuditRecord::seal`]), so that a record edited, removed or
//! inserted afterwards breaks the chain where it happened ([`ChainCheck`]).
//!
//! Most records come from the events a change emits ([`of_event`]): an
//! event of an audited topic, emitted on behalf of a person or a client, is
//! the action. Actions without an event of their own ([`Change`]: an
//! answered question, a pool's settings, a sign-in, a reload) are recorded
//! where they happen.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::FieldError;
use super::ids::TenantId;
use super::release::canonical_json;

/// Through which door an action came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// The web console.
    Console,
    /// The REST API.
    Api,
    /// Connect, gRPC or gRPC-Web.
    Rpc,
    /// The `agentbay` command on the machine, with the store opened directly.
    Cli,
    /// The appliance itself (a configuration reload by signal).
    System,
}

impl Via {
    /// Its name in records and filters.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Console => "console",
            Via::Api => "api",
            Via::Rpc => "rpc",
            Via::Cli => "cli",
            Via::System => "system",
        }
    }
}

/// Who acts and from where: what every audit record of an action says
/// besides the action itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// Who, as events name it (`user wes`, `client c-1`, `local administrator`).
    pub actor: String,
    /// The address the request came from (`local` for the command line).
    pub address: String,
    /// Through which door.
    pub via: Via,
}

/// An action recorded where it happens (see [`of_event`] for the others).
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// The tenant whose data it is about.
    pub tenant_id: TenantId,
    /// What was done, `noun.verb` (`decision.answer`, `pool.set`).
    pub action: String,
    /// What it was done to (an id, a name).
    pub target: String,
    /// The value before, where it changed one.
    pub before: Option<Value>,
    /// The value after.
    pub after: Option<Value>,
    /// Anything else worth a line (why, what was refused).
    pub detail: Option<String>,
}

impl Change {
    /// An action on `target` of `tenant`.
    pub fn new(tenant_id: &TenantId, action: &str, target: impl Into<String>) -> Change {
        Change {
            tenant_id: tenant_id.clone(),
            action: action.to_string(),
            target: target.into(),
            before: None,
            after: None,
            detail: None,
        }
    }

    /// With the value it replaced.
    pub fn before(mut self, value: impl Serialize) -> Change {
        self.before = serde_json::to_value(value).ok().filter(|v| !v.is_null());
        self
    }

    /// With the value it set.
    pub fn after(mut self, value: impl Serialize) -> Change {
        self.after = serde_json::to_value(value).ok().filter(|v| !v.is_null());
        self
    }

    /// With a line of words.
    pub fn detail(mut self, detail: impl Into<String>) -> Change {
        self.detail = Some(detail.into());
        self
    }
}

/// The audited topics: the action each stands for and the payload field
/// naming its target. An event of another topic is the appliance's own
/// doing (a lease granted, a phase reached) and is not an action.
const AUDITED_TOPICS: &[(&str, &str, &[&str])] = &[
    (
        "execution.approvals.v1.approval-decided",
        "approval.decide",
        &["approvalId", "attemptId"],
    ),
    (
        "execution.attempts.v1.attempt-interrupt-requested",
        "attempt.interrupt",
        &["attemptId"],
    ),
    (
        "execution.attempts.v1.call-settled",
        "call.settle",
        &["callId"],
    ),
    ("agentbay.runs.v1.run-hold-changed", "run.hold", &["runId"]),
    (
        "execution.releases.v1.release-loaded",
        "release.load",
        &["releaseId"],
    ),
    (
        "execution.releases.v1.release-load-rejected",
        "release.load-refused",
        &["releaseId"],
    ),
    (
        "execution.releases.v1.release-lifecycle-changed",
        "release.lifecycle",
        &["releaseId"],
    ),
    (
        "execution.releases.v1.publisher-key-changed",
        "trust.change",
        &["keyId"],
    ),
    (
        "capacity.quotas.v1.quota-changed",
        "quota.set",
        &["projectId", "tenantId"],
    ),
    (
        "agentbay.platform.v1.tenant-changed",
        "tenant.set",
        &["tenantId"],
    ),
    (
        "agentbay.platform.v1.project-changed",
        "project.set",
        &["projectId"],
    ),
    (
        "agentbay.admin.v1.client-created",
        "client.create",
        &["clientId"],
    ),
    (
        "agentbay.admin.v1.client-revoked",
        "client.revoke",
        &["clientId"],
    ),
    (
        "agentbay.admin.v1.user-created",
        "user.create",
        &["username"],
    ),
    (
        "agentbay.admin.v1.user-disabled",
        "user.disable",
        &["username"],
    ),
    (
        "agentbay.admin.v1.user-enabled",
        "user.enable",
        &["username"],
    ),
    (
        "agentbay.admin.v1.user-password-changed",
        "user.password",
        &["username"],
    ),
    (
        "agentbay.admin.v1.user-email-set",
        "user.email",
        &["username"],
    ),
];

/// The action an event stands for, with its target, when its topic is an
/// audited one.
pub fn of_event(topic: &str, payload: &Value) -> Option<(&'static str, String)> {
    // A run submitted is an agent's everyday work; one started again from
    // a checkpoint is a person's decision.
    if topic == "execution.runs.v1.run-submitted" {
        return payload
            .get("rerunOf")
            .filter(|v| !v.is_null())
            .and_then(|_| payload.get("runId"))
            .and_then(Value::as_str)
            .map(|run| ("run.rerun", run.to_string()));
    }
    let (_, action, fields) = AUDITED_TOPICS.iter().find(|(t, ..)| *t == topic)?;
    let target = fields
        .iter()
        .find_map(|f| payload.get(*f))
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default();
    Some((action, target))
}

/// Every action name the trail can hold, for the console's filter.
pub fn actions() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = AUDITED_TOPICS.iter().map(|(_, a, _)| *a).collect();
    all.extend(RECORDED_ACTIONS);
    all.push("run.rerun");
    all.sort_unstable();
    all.dedup();
    all
}

/// Actions recorded where they happen ([`Change`]).
pub const RECORDED_ACTIONS: &[&str] = &[
    "decision.answer",
    "run.cancel",
    "pool.set",
    "model-profile.set",
    "model-profile.delete",
    "webhook.set",
    "webhook.delete",
    "webhook.rotate-secret",
    "config.reload",
    "backup.create",
    "backup.restore",
    "run.export",
    "webhook.redeliver",
    "worker.run",
    "session.sign-in",
    "session.sign-in-refused",
    "session.sign-out",
];

/// One action, as kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// Position in the trail, from 1, in commit order.
    pub sequence: u64,
    /// When.
    pub at: DateTime<Utc>,
    /// Whose data.
    #[schema(value_type = String)]
    pub tenant_id: TenantId,
    /// Who.
    pub actor: String,
    /// From which address.
    pub address: String,
    /// Through which door.
    pub via: Via,
    /// What was done.
    pub action: String,
    /// To what.
    pub target: String,
    /// The value before, where it changed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    /// The value after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
    /// Anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The hash of the record before (`sha256:` and zeros for the first).
    pub previous_hash: String,
    /// The hash of this record: of its fields and `previous_hash`.
    pub hash: String,
}

/// The hash the first record follows.
pub fn genesis() -> String {
    format!("sha256:{}", "0".repeat(64))
}

impl AuditRecord {
    /// The record of `change` by `origin`, sealed onto the chain whose last
    /// record is number `sequence - 1` with hash `previous_hash`.
    pub fn seal(
        sequence: u64,
        previous_hash: &str,
        at: DateTime<Utc>,
        origin: &Origin,
        change: Change,
    ) -> AuditRecord {
        let mut record = AuditRecord {
            sequence,
            at,
            tenant_id: change.tenant_id,
            actor: origin.actor.clone(),
            address: origin.address.clone(),
            via: origin.via,
            action: change.action,
            target: change.target,
            before: change.before,
            after: change.after,
            detail: change.detail,
            previous_hash: previous_hash.to_string(),
            hash: String::new(),
        };
        record.hash = record.digest();
        record
    }

    /// The hash its fields give: sha256 over the canonical JSON of every
    /// field but `hash` (which holds `previous_hash`, so the chain is in it).
    pub fn digest(&self) -> String {
        let mut value = serde_json::to_value(self).expect("audit records serialise");
        if let Value::Object(map) = &mut value {
            map.remove("hash");
        }
        format!("sha256:{:x}", Sha256::digest(canonical_json(&value)))
    }
}

/// Where the chain is broken, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChainBreak {
    /// The first record that does not follow (or the number missing).
    pub sequence: u64,
    /// Why, in words.
    pub reason: String,
}

/// Checks records in order against the chain: the one before the first is
/// number `from - 1` with hash `previous` (the genesis, or the last record
/// retention removed).
#[derive(Clone, Debug)]
pub struct ChainCheck {
    next: u64,
    previous: String,
    /// Records checked so far.
    pub checked: u64,
    /// The first break found.
    pub broken: Option<ChainBreak>,
}

impl ChainCheck {
    /// A check from record `from`, which must follow `previous`.
    pub fn new(from: u64, previous: String) -> ChainCheck {
        ChainCheck {
            next: from,
            previous,
            checked: 0,
            broken: None,
        }
    }

    /// Takes the next record; false once broken (later records are not
    /// checked: the chain after a break proves nothing).
    pub fn take(&mut self, record: &AuditRecord) -> bool {
        if self.broken.is_some() {
            return false;
        }
        let fail = |reason: String| ChainBreak {
            sequence: record.sequence.min(self.next),
            reason,
        };
        let problem = if record.sequence != self.next {
            Some(fail(format!(
                "record {} is missing: the next record kept is {}",
                self.next, record.sequence
            )))
        } else if record.previous_hash != self.previous {
            Some(fail(format!(
                "record {} names {} as the hash before it, but record {} hashes to {}",
                record.sequence,
                record.previous_hash,
                record.sequence.saturating_sub(1),
                self.previous
            )))
        } else {
            let digest = record.digest();
            (digest != record.hash).then(|| {
                fail(format!(
                    "record {} was changed after it was written: its fields hash to {digest}, it says {}",
                    record.sequence, record.hash
                ))
            })
        };
        if let Some(problem) = problem {
            self.broken = Some(problem);
            return false;
        }
        self.checked += 1;
        self.next += 1;
        self.previous = record.hash.clone();
        true
    }

    /// The hash of the last record checked (the chain's head when whole).
    pub fn head(&self) -> &str {
        &self.previous
    }
}

/// Which records a reader wants.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    /// Only this tenant's; `None` for every tenant (PlatformAdmin).
    pub tenant: Option<TenantId>,
    /// At or after.
    pub from: Option<DateTime<Utc>>,
    /// Before.
    pub until: Option<DateTime<Utc>>,
    /// The actor contains this (case-insensitive).
    pub actor: Option<String>,
    /// The action is this, or starts with this and a dot (`user` for every
    /// `user.*`).
    pub action: Option<String>,
    /// The target contains this.
    pub target: Option<String>,
}

impl AuditFilter {
    /// Whether `record` passes.
    pub fn admits(&self, record: &AuditRecord) -> bool {
        let contains = |hay: &str, needle: &Option<String>| {
            needle
                .as_deref()
                .is_none_or(|n| hay.to_lowercase().contains(&n.to_lowercase()))
        };
        self.tenant.as_ref().is_none_or(|t| *t == record.tenant_id)
            && self.from.is_none_or(|f| record.at >= f)
            && self.until.is_none_or(|u| record.at < u)
            && contains(&record.actor, &self.actor)
            && contains(&record.target, &self.target)
            && self.action.as_deref().is_none_or(|a| {
                record.action == a
                    || record
                        .action
                        .strip_prefix(a)
                        .is_some_and(|rest| rest.starts_with('.'))
            })
    }
}

/// A query of the trail, as the API and the console take it.
#[derive(Clone, Debug, Default)]
pub struct AuditQuery {
    /// Which records.
    pub filter: AuditFilter,
    /// Only records before this one (the next page).
    pub before: Option<u64>,
    /// At most this many.
    pub limit: usize,
}

/// Most records one answer holds.
pub const MAX_AUDIT_PAGE: usize = 5_000;

impl AuditQuery {
    /// The parameters it reads.
    pub const PARAMS: &'static [&'static str] = &[
        "from",
        "to",
        "actor",
        "action",
        "target",
        "olderThan",
        "limit",
    ];

    /// Reads the parameters `get` finds (empty ones are absent); the tenant
    /// is the caller's to set.
    pub fn parse<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<AuditQuery, FieldError> {
        // A parameter given empty is a mistake (a form leaves it out).
        for k in Self::PARAMS {
            if get(k).is_some_and(|v| v.trim().is_empty()) {
                return Err(FieldError::new(
                    *k,
                    "is empty: leave it out, or give a value",
                ));
            }
        }
        let get = |k: &str| get(k).map(str::trim).filter(|v| !v.is_empty());
        let text = |k: &str| -> Result<Option<String>, FieldError> {
            match get(k) {
                Some(v) if v.chars().count() > 200 => {
                    Err(FieldError::new(k, "is longer than 200 characters"))
                }
                v => Ok(v.map(str::to_string)),
            }
        };
        let number = |k: &str, max: u64| -> Result<Option<u64>, FieldError> {
            get(k)
                .map(|v| match v.parse::<u64>() {
                    Ok(n) if (1..=max).contains(&n) => Ok(n),
                    _ => Err(FieldError::new(
                        k,
                        format!("{v:?} is not a number from 1 to {max}"),
                    )),
                })
                .transpose()
        };
        let from = get("from").map(|v| instant("from", v, false)).transpose()?;
        let until = get("to").map(|v| instant("to", v, true)).transpose()?;
        Ok(AuditQuery {
            filter: AuditFilter {
                tenant: None,
                from,
                until,
                actor: text("actor")?,
                action: text("action")?,
                target: text("target")?,
            },
            before: number("olderThan", i64::MAX as u64)?,
            limit: number("limit", MAX_AUDIT_PAGE as u64)?.map_or(100, |n| n as usize),
        })
    }
}

/// An instant as RFC 3339, or a UTC day (`YYYY-MM-DD`): its start, or for
/// the end of a range (`end`) the start of the day after, so that
/// `to=2026-12-05` includes that whole day.
fn instant(field: &str, text: &str, end: bool) -> Result<DateTime<Utc>, FieldError> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    let day = FieldError::parse_day(field, text).map_err(|_| {
        FieldError::new(
            field,
            format!("{text:?} is neither a day (YYYY-MM-DD) nor a time (RFC 3339)"),
        )
    })?;
    let day = if end {
        day.succ_opt().unwrap_or(day)
    } else {
        day
    };
    Ok(day.and_time(chrono::NaiveTime::MIN).and_utc())
}

/// The CSV header of an export.
pub const CSV_HEADER: &str =
    "sequence,at,tenant,actor,address,via,action,target,before,after,detail,previous_hash,hash";

impl AuditRecord {
    /// The record as one CSV line (RFC 4180 quoting), without the newline.
    pub fn csv_line(&self) -> String {
        let json = |v: &Option<Value>| v.as_ref().map(|v| v.to_string()).unwrap_or_default();
        let fields = [
            self.sequence.to_string(),
            self.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            self.tenant_id.to_string(),
            self.actor.clone(),
            self.address.clone(),
            self.via.as_str().to_string(),
            self.action.clone(),
            self.target.clone(),
            json(&self.before),
            json(&self.after),
            self.detail.clone().unwrap_or_default(),
            self.previous_hash.clone(),
            self.hash.clone(),
        ];
        super::csv::line(&fields)
    }
}

/// What a check of the whole chain found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrailReport {
    /// Records checked.
    pub checked: u64,
    /// The first record kept (retention removes older ones), if any.
    pub first: Option<u64>,
    /// The last record checked.
    pub last: Option<u64>,
    /// The hash the first kept record follows (the last one removed, or
    /// the genesis).
    pub anchor: String,
    /// The hash of the last record: write it down elsewhere, and a later
    /// check proves nothing before it was rewritten.
    pub head: String,
    /// The first break, if the chain is not whole.
    pub broken: Option<ChainBreak>,
    /// What the check was asked to expect and did not find (a kept chain
    /// that starts later than the first record noted, a noted head no
    /// record has); empty when nothing was expected or all was found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmet: Vec<String>,
}

/// What a check of the trail is told to expect, from notes kept outside
/// the store: the chain cannot prove its own start, since whoever can
/// write the data directory can cut the oldest records and rewrite the
/// anchor they follow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    /// The first record's sequence, as noted: a kept chain that starts
    /// later lost records.
    pub first: Option<u64>,
    /// A head hash noted earlier: a record of the kept chain must have it.
    pub head: Option<String>,
}

impl Expect {
    /// Expectations as given: `first` a sequence (1 or more), `head` a
    /// record hash (`sha256:` and 64 hex digits); refused naming the field
    /// (`expectFirst`, `expectHead`).
    pub fn new(first: Option<u64>, head: Option<String>) -> Result<Expect, FieldError> {
        if first == Some(0) {
            return Err(FieldError::new(
                "expectFirst",
                "is 0; records are numbered from 1",
            ));
        }
        if let Some(h) = &head
            && !h
                .strip_prefix("sha256:")
                .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(FieldError::new(
                "expectHead",
                format!("{h:?} is not a record hash (sha256: and 64 hex digits)"),
            ));
        }
        Ok(Expect { first, head })
    }

    /// What `report` (whose chain held a record hashed `head` at the
    /// sequence `head_at`, if it did) does not show of what was expected.
    pub fn unmet(&self, report: &TrailReport, head_at: Option<u64>) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(n) = self.first {
            match report.first {
                Some(first) if first > n => out.push(format!(
                    "the kept chain starts at record {first}, later than the expected first record {n}: records {n} to {} are gone (retention removes records older than retention.audit_days; younger ones removed mean the trail was cut)",
                    first - 1
                )),
                None => out.push(format!(
                    "no record is kept, though the chain was expected to start at record {n}"
                )),
                _ => {}
            }
        }
        if let Some(h) = &self.head
            && head_at.is_none()
        {
            out.push(format!(
                "no kept record has the hash {h} noted earlier: the records up to it were rewritten or removed"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin {
            actor: "user wes".into(),
            address: "10.0.0.7".into(),
            via: Via::Console,
        }
    }

    fn chain(n: u64) -> Vec<AuditRecord> {
        let tenant = TenantId::parse("acme").unwrap();
        let mut previous = genesis();
        (1..=n)
            .map(|i| {
                let r = AuditRecord::seal(
                    i,
                    &previous,
                    DateTime::from_timestamp(1_800_000_000 + i as i64, 0).unwrap(),
                    &origin(),
                    Change::new(&tenant, "quota.set", "acme")
                        .before(serde_json::json!({"concurrentRuns": i}))
                        .after(serde_json::json!({"concurrentRuns": i + 1})),
                );
                previous = r.hash.clone();
                r
            })
            .collect()
    }

    #[test]
    fn a_whole_chain_checks_and_its_head_is_the_last_hash() {
        let records = chain(5);
        let mut check = ChainCheck::new(1, genesis());
        assert!(records.iter().all(|r| check.take(r)));
        assert_eq!(check.checked, 5);
        assert_eq!(check.head(), records[4].hash);
        assert!(check.broken.is_none());
    }

    #[test]
    fn an_edited_record_breaks_the_chain_where_it_was_edited() {
        let mut records = chain(5);
        records[2].after = Some(serde_json::json!({"concurrentRuns": 99}));
        let mut check = ChainCheck::new(1, genesis());
        records.iter().for_each(|r| {
            check.take(r);
        });
        let broken = check.broken.unwrap();
        assert_eq!(broken.sequence, 3);
        assert!(
            broken.reason.contains("changed after it was written"),
            "{}",
            broken.reason
        );
        assert_eq!(check.checked, 2);
    }

    #[test]
    fn a_removed_record_and_a_rehashed_one_are_found() {
        let mut records = chain(5);
        records.remove(1);
        let mut check = ChainCheck::new(1, genesis());
        records.iter().for_each(|r| {
            check.take(r);
        });
        assert_eq!(check.broken.as_ref().unwrap().sequence, 2);
        assert!(check.broken.unwrap().reason.contains("missing"));

        // Rewritten with its own hash recomputed: the next record's link fails.
        let mut records = chain(5);
        records[1].actor = "user mallory".into();
        records[1].hash = records[1].digest();
        let mut check = ChainCheck::new(1, genesis());
        records.iter().for_each(|r| {
            check.take(r);
        });
        let broken = check.broken.unwrap();
        assert_eq!(broken.sequence, 3);
        assert!(
            broken.reason.contains("hash before it"),
            "{}",
            broken.reason
        );
    }

    #[test]
    fn events_of_audited_topics_are_actions_with_their_target() {
        let payload = serde_json::json!({"clientId": "c-1", "tenantId": "acme"});
        assert_eq!(
            of_event("agentbay.admin.v1.client-created", &payload),
            Some(("client.create", "c-1".to_string()))
        );
        assert_eq!(
            of_event("capacity.leases.v1.capacity-lease-granted", &payload),
            None
        );
    }

    #[test]
    fn filters_and_csv() {
        let records = chain(2);
        let filter = AuditFilter {
            action: Some("quota".into()),
            actor: Some("WES".into()),
            ..AuditFilter::default()
        };
        assert!(filter.admits(&records[0]));
        let filter = AuditFilter {
            action: Some("quo".into()),
            ..AuditFilter::default()
        };
        assert!(!filter.admits(&records[0]));
        let line = records[0].csv_line();
        assert!(line.starts_with("1,"), "{line}");
        assert!(line.contains("\"{\"\"concurrentRuns\"\":1}\""), "{line}");
        assert_eq!(line.split(",sha256:").count(), 3, "{line}");
    }
}
