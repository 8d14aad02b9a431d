//! The engines beneath the store: what a backend must do, in keys and
//! values.
//!
//! Everything above this interface is the same on every backend: [`Tx`]
//! and its overlays, the key encodings, the event counter, the audit
//! chain, the group commit's threads and answers. An engine stores
//! `(table, key, value)` in bytewise key order, and nothing more.
//!
//! - [`KvRead`]: committed state, for readers on any thread. Each call,
//!   and each step of a scan, sees every group of writes whole or not at
//!   all, and every acknowledged one.
//! - [`KvEngine`]: the running store's engine, driven by the writer and
//!   the flusher (`commit.rs`). The writer hands it each group of writes
//!   as it closes ([`KvEngine::apply`]); the flusher makes every group so
//!   far durable in one step ([`KvEngine::make_durable`]) before anyone
//!   hears of them. sled makes a group visible when applied and durable
//!   at the flush; PostgreSQL makes it both in one transaction, so its
//!   writer keeps reading the group from memory until it is committed.
//! - [`KvBulk`]: writes outside the group commit, before it starts:
//!   creating a store, migrations, a restore.
//!
//! [`Tx`]: super::Tx

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tx::Writes;
use super::{StoreError, Table, prefix_end};

/// A key and its value.
pub(super) type Pair = (Vec<u8>, Vec<u8>);

/// A scan, in key order from either end.
pub(super) type Rows<'a> = Box<dyn DoubleEndedIterator<Item = Result<Pair, StoreError>> + 'a>;

/// Takes one record of a bulk load.
pub(super) type Sink<'a> = dyn FnMut(Table, Vec<u8>, Vec<u8>) -> Result<(), StoreError> + 'a;

/// Committed state (see the module's words).
pub(super) trait KvRead: Send + Sync {
    /// The value of `key`.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// The pairs from `start` to `end`, lazily.
    fn range(&self, table: Table, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Rows<'_>;
}

/// Writes outside the group commit (see the module's words). Each write
/// stands alone; [`KvBulk::flush`] makes those so far durable.
pub(super) trait KvBulk: KvRead {
    fn put(&self, table: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    fn remove(&self, table: Table, key: &[u8]) -> Result<(), StoreError>;
    fn flush(&self) -> Result<(), StoreError>;
}

/// The running store's engine (see the module's words).
pub(super) trait KvEngine: Send + Sync {
    /// What readers read.
    fn reader(&self) -> &dyn KvRead;

    /// A read of the writer's transactions beneath their overlays: no
    /// group in flight writes the key, so the engine may keep the answer.
    fn writer_get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.reader().get(table, key)
    }

    /// Whether a group becomes readable only once durable: then the writer
    /// reads it from memory until [`KvEngine::make_durable`] returns.
    fn visible_when_durable(&self) -> bool;

    /// The writer thread hands over group `number`, closed. Returns the
    /// writes again when they are not readable yet (see
    /// [`KvEngine::visible_when_durable`]), for the flusher to commit.
    fn apply(&self, number: u64, writes: Writes) -> Result<Option<Arc<Writes>>, StoreError>;

    /// The flusher thread makes every group handed over so far durable,
    /// with `pending` the writes of those not yet readable, oldest first.
    /// An error leaves the outcome unknown: the store then stops.
    fn make_durable(&self, pending: &[Arc<Writes>]) -> Result<(), StoreError>;

    /// Whether [`KvEngine::between_groups`] has work to do.
    fn maintenance_due(&self) -> bool {
        false
    }

    /// The writer thread, between two groups, with every earlier group
    /// durable: maintenance that needs no write in progress (sled's
    /// reopen, see `engine.rs`). `Ok(Some(pause))` when it ran.
    fn between_groups(&self) -> Result<Option<Duration>, StoreError> {
        Ok(None)
    }

    /// Why the engine cannot take writes now (`Ok`: it can).
    fn health(&self) -> Result<(), String> {
        Ok(())
    }

    /// Whether the database behind the engine answers now (sled's always
    /// does).
    fn reach(&self) -> Reach {
        Reach::default()
    }

    /// The appliance that holds the store, when appliances share it.
    fn leadership(&self) -> Option<crate::domain::cluster::Node> {
        None
    }

    /// Gives the store up after the last write (a clean stop).
    fn release(&self) {}

    /// Bytes the store occupies where it is kept.
    fn size_on_disk(&self) -> Result<u64, StoreError>;

    /// Writes a raw value past every check, for tests that damage what is
    /// stored.
    #[cfg(test)]
    fn damage(&self, table: Table, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError>;
}

/// Whether the database behind the store answers: a PostgreSQL restart
/// or failover is ridden out by waiting, while this appliance keeps its
/// role, instead of failing what was asked.
#[derive(Clone, Debug, Default)]
pub struct Reach {
    /// Since when it has not answered, and its last words; `None` while
    /// it answers.
    pub down: Option<(Instant, String)>,
    /// When it answered again after it last did not, and how long it had
    /// not.
    pub back: Option<(Instant, Duration)>,
    /// How much longer this appliance keeps its role without an answer
    /// (its leader lease, less the margin it keeps).
    pub role_left: Option<Duration>,
}

impl Reach {
    /// Why requests that need the store are answered "come back" now, in
    /// words: `None` while the database answers.
    pub fn unreachable(&self) -> Option<String> {
        let (since, why) = self.down.as_ref()?;
        let mut words = format!(
            "the store's database has not answered for {:.1} s ({why})",
            since.elapsed().as_secs_f64()
        );
        if let Some(left) = self.role_left {
            words.push_str(&format!(
                "; this appliance stays active and waits for it up to {:.1} s more",
                left.as_secs_f64()
            ));
        }
        Some(words)
    }

    /// Why what counts a client's silence against it (an adapter's
    /// lease, a capacity lease's heartbeat) waits now, in words: the
    /// database does not answer, or answered again less than `period`
    /// ago, so a client told to come back has not had `period` to renew.
    pub fn settling(&self, period: Duration) -> Option<String> {
        if let Some(words) = self.unreachable() {
            return Some(words);
        }
        let (at, after) = self.back?;
        let ago = at.elapsed();
        (ago < period).then(|| {
            format!(
                "the store's database answered again {:.1} s ago, after {:.1} s without an answer; clients have {} s to renew first",
                ago.as_secs_f64(),
                after.as_secs_f64(),
                period.as_secs()
            )
        })
    }
}

/// One table of a [`KvRead`], with the shapes of a sled tree.
pub(super) struct Reading<'a> {
    kv: &'a dyn KvRead,
    table: Table,
}

fn bound(b: Bound<&impl AsRef<[u8]>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_ref()),
        Bound::Excluded(k) => Bound::Excluded(k.as_ref()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl<'a> Reading<'a> {
    pub fn new(kv: &'a dyn KvRead, table: Table) -> Reading<'a> {
        Reading { kv, table }
    }

    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, StoreError> {
        self.kv.get(self.table, key.as_ref())
    }

    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Rows<'a> {
        self.kv.range(
            self.table,
            bound(range.start_bound()),
            bound(range.end_bound()),
        )
    }

    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Rows<'a> {
        let prefix = prefix.as_ref();
        if prefix.iter().all(|b| *b == u8::MAX) {
            // No key bounds it above: filter the rest.
            let owned = prefix.to_vec();
            return Box::new(
                self.kv
                    .range(self.table, Bound::Included(prefix), Bound::Unbounded)
                    .filter(move |item| item.as_ref().map_or(true, |(k, _)| k.starts_with(&owned))),
            );
        }
        let end = prefix_end(prefix);
        self.kv.range(
            self.table,
            Bound::Included(prefix),
            Bound::Excluded(end.as_slice()),
        )
    }

    pub fn iter(&self) -> Rows<'a> {
        self.kv
            .range(self.table, Bound::Unbounded, Bound::Unbounded)
    }

    /// The last pair.
    pub fn last(&self) -> Result<Option<Pair>, StoreError> {
        self.iter().next_back().transpose()
    }

    /// Number of entries: a scan.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reach_says_why_requests_and_expiries_wait() {
        let answering = Reach::default();
        assert_eq!(answering.unreachable(), None);
        assert_eq!(answering.settling(Duration::from_secs(60)), None);

        let now = Instant::now();
        let down = Reach {
            down: Some((now - Duration::from_secs(2), "connection refused".into())),
            back: None,
            role_left: Some(Duration::from_secs(5)),
        };
        let words = down.unreachable().unwrap();
        assert!(
            words.contains("has not answered for 2.0 s (connection refused)"),
            "{words}"
        );
        assert!(words.contains("up to 5.0 s more"), "{words}");
        assert_eq!(down.settling(Duration::ZERO), Some(words));

        let back = Reach {
            down: None,
            back: Some((now - Duration::from_secs(1), Duration::from_secs(3))),
            role_left: Some(Duration::from_secs(8)),
        };
        assert_eq!(back.unreachable(), None);
        let words = back.settling(Duration::from_secs(60)).unwrap();
        assert!(words.contains("after 3.0 s without an answer"), "{words}");
        assert!(words.contains("60 s to renew"), "{words}");
        assert_eq!(back.settling(Duration::from_millis(500)), None);
    }
}
