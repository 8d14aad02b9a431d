//! Refused console sign-ins, as the audit trail keeps them: bounded
//! whatever an unauthenticated caller sends.
//!
//! The name tried is kept as [`tried_name`] makes it (an account's name,
//! or the first 64 characters of a name no account has). From one source
//! (an IPv4 address or an IPv6 /64, as the limiter counts them) the first
//! refusal of a minute is recorded at once; the others of that minute are
//! counted, and when the minute is over one record says how many, with the
//! first [`NAMES`] names tried. At most [`SOURCES`] sources are followed
//! at once; refusals from further sources in the meantime are counted
//! together, as "other sources". A flood therefore adds at most two
//! records a minute per followed source, each of bounded size.
//!
//! [`tried_name`]: crate::domain::user::tried_name

use std::collections::HashMap;
use std::net::IpAddr;

use chrono::{DateTime, Duration, Utc};
use parking_lot::Mutex;

use crate::domain::TenantId;
use crate::domain::audit::{Change, Origin, Via};
use crate::store::{Store, StoreError};

/// The action of every record here.
pub const ACTION: &str = "session.sign-in-refused";

/// Sources followed at once.
pub const SOURCES: usize = 1024;

/// Names a minute's record lists.
pub const NAMES: usize = 8;

/// The span refusals from one source are counted over.
fn minute() -> Duration {
    Duration::seconds(60)
}

/// One source's minute: when it began and what came after its first
/// refusal.
struct Minute {
    began: DateTime<Utc>,
    /// Refusals after the first.
    more: u64,
    /// The names those tried, the first [`NAMES`] distinct ones.
    names: Vec<String>,
    /// Whether more distinct names were tried than listed.
    other_names: bool,
}

/// A refusal, or a minute's count of them, to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The source's address (`other sources` for the shared count).
    pub address: String,
    pub at: DateTime<Utc>,
    /// The name tried, or the names a minute's count tried.
    pub names: String,
    pub detail: String,
}

/// The refusals being counted (see the module).
#[derive(Default)]
pub struct Refusals {
    minutes: Mutex<HashMap<Option<IpAddr>, Minute>>,
}

impl Refusals {
    /// A sign-in of `name` (as [`tried_name`] keeps it) from `source` was
    /// refused (`why`) at `now`: what to record now (this refusal, if it
    /// is its source's first of a minute, and the count of every minute
    /// that is over).
    ///
    /// [`tried_name`]: crate::domain::user::tried_name
    pub fn refused(
        &self,
        source: IpAddr,
        name: &str,
        why: &str,
        now: DateTime<Utc>,
    ) -> Vec<Refusal> {
        let mut out = self.ended(now);
        let mut minutes = self.minutes.lock();
        let mut key = Some(super::limiter::source_of(source));
        if !minutes.contains_key(&key) && minutes.len() >= SOURCES {
            key = None;
        }
        match minutes.get_mut(&key) {
            Some(m) => {
                m.more += 1;
                if !m.names.iter().any(|n| n == name) {
                    if m.names.len() < NAMES {
                        m.names.push(name.to_string());
                    } else {
                        m.other_names = true;
                    }
                }
            }
            None => {
                minutes.insert(
                    key,
                    Minute {
                        began: now,
                        more: 0,
                        names: Vec::new(),
                        other_names: false,
                    },
                );
                out.push(Refusal {
                    address: address(key),
                    at: now,
                    names: name.to_string(),
                    detail: why.to_string(),
                });
            }
        }
        out
    }

    /// The counts of the minutes over at `now`, which are forgotten.
    pub fn ended(&self, now: DateTime<Utc>) -> Vec<Refusal> {
        self.take(now, false)
    }

    /// The counts of every minute so far (the appliance stops), which
    /// are forgotten.
    pub fn all(&self, now: DateTime<Utc>) -> Vec<Refusal> {
        self.take(now, true)
    }

    fn take(&self, now: DateTime<Utc>, all: bool) -> Vec<Refusal> {
        let mut minutes = self.minutes.lock();
        let over: Vec<Option<IpAddr>> = minutes
            .iter()
            .filter(|(_, m)| all || now >= m.began + minute())
            .map(|(k, _)| *k)
            .collect();
        let mut out = Vec::new();
        for key in over {
            let Some(m) = minutes.remove(&key) else {
                continue;
            };
            if m.more == 0 {
                continue;
            }
            let mut names = m.names.join(", ");
            if m.other_names {
                names.push_str(", and others");
            }
            out.push(Refusal {
                address: address(key),
                at: (m.began + minute()).min(now),
                detail: format!(
                    "{} more refused sign-ins from {} in the minute from {}",
                    m.more,
                    address(key),
                    m.began.format("%Y-%m-%d %H:%M:%S UTC")
                ),
                names,
            });
        }
        out
    }
}

fn address(key: Option<IpAddr>) -> String {
    key.map_or_else(|| "other sources".to_string(), |ip| ip.to_string())
}

/// Records `refusals` in the audit trail, as the platform's (whose name
/// was tried is not known to be anyone's), in one transaction.
pub async fn record(store: &Store, refusals: Vec<Refusal>) -> Result<(), StoreError> {
    if refusals.is_empty() {
        return Ok(());
    }
    store
        .transact(move |tx| {
            for r in &refusals {
                let origin = Origin {
                    actor: format!("user {}", r.names),
                    address: r.address.clone(),
                    via: Via::Console,
                };
                let change = Change::new(&TenantId::platform(), ACTION, r.names.clone())
                    .detail(r.detail.clone());
                tx.audit_as(&origin, r.at, change)?;
            }
            Ok::<_, StoreError>(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn a_source_is_recorded_once_a_minute_and_counted_after() {
        let r = Refusals::default();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let first = r.refused(ip, "wes", "wrong password", at(0));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].names, "wes");
        for i in 0..20 {
            let name = format!("n{}", i % 10);
            assert!(r.refused(ip, &name, "no such user", at(1 + i)).is_empty());
        }
        assert!(r.ended(at(59)).is_empty());
        let counted = r.ended(at(60));
        assert_eq!(counted.len(), 1, "{counted:?}");
        assert_eq!(
            counted[0].names,
            "n0, n1, n2, n3, n4, n5, n6, n7, and others"
        );
        assert!(
            counted[0]
                .detail
                .starts_with("20 more refused sign-ins from 192.0.2.7")
        );
        assert!(r.ended(at(200)).is_empty(), "a minute is counted once");
        // The next refusal begins a new minute.
        assert_eq!(r.refused(ip, "wes", "wrong password", at(300)).len(), 1);
    }

    #[test]
    fn one_ipv6_host_is_one_source_and_sources_past_the_bound_share_a_count() {
        let r = Refusals::default();
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!(r.refused(a, "x", "why", at(0)).len(), 1);
        assert!(r.refused(b, "x", "why", at(1)).is_empty());
        for i in 1..SOURCES as u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            r.refused(ip, "x", "why", at(2));
        }
        let past: IpAddr = "198.51.100.1".parse().unwrap();
        let shared = r.refused(past, "x", "why", at(3));
        assert_eq!(shared[0].address, "other sources");
        assert!(
            r.refused("198.51.100.2".parse().unwrap(), "x", "why", at(4))
                .is_empty()
        );
        assert_eq!(r.minutes.lock().len(), SOURCES + 1);
    }
}
