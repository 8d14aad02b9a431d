//! How long what a tenant's work leaves behind is kept.
//!
//! Two clocks per tenant, each in days and counted from the end of the run
//! they belong to:
//! - **payload retention**: artifacts (prompts, model responses, tool
//!   payloads, adapter state, outputs). When it passes, the records that
//!   referred to the content keep their hashes and get a [`Tombstone`]
//!   saying what removed it and when, so timelines still say what was there.
//! - **history retention**: the records themselves (finished runs with
//!   their attempts, checkpoints, call records and decisions; ended leases;
//!   per-day minutes; events).
//!
//! The configuration sets the defaults, a PlatformAdmin may override them
//! per tenant, and a run on [`Hold`] keeps everything until the hold is
//! released.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::error::FieldError;
use super::ids::TenantId;

/// The most days either retention may be set to (about 100 years).
pub const MAX_DAYS: u32 = 36_500;

/// Days of each retention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// Days artifacts are kept after their run ended.
    pub payload_days: u32,
    /// Days finished history is kept after it ended.
    pub history_days: u32,
}

/// A tenant's overrides of the configured defaults; `None` inherits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionOverride {
    /// Payload retention in days.
    #[serde(default)]
    pub payload_days: Option<u32>,
    /// History retention in days.
    #[serde(default)]
    pub history_days: Option<u32>,
}

impl RetentionOverride {
    /// Checks the days: at least 1, at most [`MAX_DAYS`], and payload not
    /// longer than history when both are set. (Against inherited defaults
    /// the shorter history wins: content cannot outlive the records that
    /// refer to it.)
    pub fn check(&self) -> Result<(), FieldError> {
        for (field, days) in [
            ("retention.payloadDays", self.payload_days),
            ("retention.historyDays", self.history_days),
        ] {
            if let Some(d) = days
                && !(1..=MAX_DAYS).contains(&d)
            {
                return Err(FieldError::new(
                    field,
                    format!("{d} days is outside 1..={MAX_DAYS}"),
                ));
            }
        }
        if let (Some(p), Some(h)) = (self.payload_days, self.history_days)
            && p > h
        {
            return Err(FieldError::new(
                "retention.payloadDays",
                format!(
                    "payload retention ({p} days) cannot be longer than history retention ({h} days): content cannot outlive the records that refer to it"
                ),
            ));
        }
        Ok(())
    }

    /// The retention in force.
    pub fn resolve(&self, defaults: Retention) -> Retention {
        let history_days = self.history_days.unwrap_or(defaults.history_days);
        Retention {
            payload_days: self
                .payload_days
                .unwrap_or(defaults.payload_days)
                .min(history_days),
            history_days,
        }
    }
}

impl Retention {
    /// Things that ended before this are past payload retention at `now`.
    pub fn payload_cutoff(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now - Duration::days(self.payload_days.into())
    }

    /// Things that ended before this are past history retention at `now`.
    pub fn history_cutoff(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now - Duration::days(self.history_days.into())
    }
}

/// What stands where purged content was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tombstone {
    /// When the content was removed.
    pub purged_at: DateTime<Utc>,
    /// The tenant whose retention removed it.
    pub tenant_id: TenantId,
    /// The payload retention in force then, in days.
    pub payload_days: u32,
}

impl Tombstone {
    /// In words, for timelines and the API.
    pub fn describe(&self) -> String {
        format!(
            "purged on {} by the payload retention of tenant {} ({} days)",
            self.purged_at.format("%Y-%m-%d"),
            self.tenant_id,
            self.payload_days
        )
    }
}

/// A legal hold on a run: nothing of it is purged until it is released.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    /// Why (required).
    pub reason: String,
    /// Who placed it.
    pub by: String,
    /// When.
    pub at: DateTime<Utc>,
}

impl Hold {
    /// A hold with a reason, which must be given.
    pub fn new(reason: &str, by: &str, at: DateTime<Utc>) -> Result<Hold, FieldError> {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(FieldError::new(
                "reason",
                "a hold needs a reason (a case or ticket number)",
            ));
        }
        FieldError::check_text("reason", reason)?;
        Ok(Hold {
            reason: reason.to_string(),
            by: by.to_string(),
            at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: Retention = Retention {
        payload_days: 30,
        history_days: 90,
    };

    #[test]
    fn overrides_resolve_and_are_checked() {
        let o = RetentionOverride {
            payload_days: Some(7),
            history_days: None,
        };
        o.check().unwrap();
        assert_eq!(
            o.resolve(DEFAULTS),
            Retention {
                payload_days: 7,
                history_days: 90
            }
        );
        let e = RetentionOverride {
            payload_days: Some(0),
            history_days: None,
        }
        .check()
        .unwrap_err();
        assert_eq!(e.field, "retention.payloadDays");
        let e = RetentionOverride {
            payload_days: Some(20),
            history_days: Some(10),
        }
        .check()
        .unwrap_err();
        assert!(e.reason.contains("cannot be longer"), "{e}");
        // A short history caps an inherited payload retention.
        let short = RetentionOverride {
            payload_days: None,
            history_days: Some(10),
        };
        assert_eq!(short.resolve(DEFAULTS).payload_days, 10);
    }

    #[test]
    fn a_hold_needs_a_reason() {
        assert_eq!(
            Hold::new("  ", "ops", Utc::now()).unwrap_err().field,
            "reason"
        );
        assert_eq!(
            Hold::new("case 7", "ops", Utc::now()).unwrap().reason,
            "case 7"
        );
    }

    #[test]
    fn tombstones_say_what_removed_the_content() {
        let t = Tombstone {
            purged_at: "2026-03-01T10:00:00Z".parse().unwrap(),
            tenant_id: TenantId::parse("acme").unwrap(),
            payload_days: 30,
        };
        assert_eq!(
            t.describe(),
            "purged on 2026-03-01 by the payload retention of tenant acme (30 days)"
        );
    }
}
