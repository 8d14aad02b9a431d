//! Time, injectable.
//!
//! Every TTL, heartbeat, timeout and daily budget in agentbay reads the time
//! from a [`Clock`], never from the system directly, so that tests can drive
//! time forward by hand instead of sleeping. Production uses
//! [`SystemClock`]; tests use [`ManualClock`].

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use tokio::sync::watch;

/// A source of the current time that background workers can also wait on.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;

    /// A receiver that changes whenever the time jumps by hand. Workers
    /// select on it beside their real-time sleep, so that a test advancing
    /// a [`ManualClock`] wakes them at once. The system clock never sends.
    fn ticks(&self) -> watch::Receiver<DateTime<Utc>>;
}

/// Shared handle to the clock in use.
pub type SharedClock = Arc<dyn Clock>;

/// The wall clock.
pub struct SystemClock {
    // Kept so that `ticks()` can hand out receivers; nothing ever sends.
    tick: watch::Sender<DateTime<Utc>>,
}

impl SystemClock {
    /// A shared system clock.
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock {
            tick: watch::channel(Utc::now()).0,
        })
    }
}

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn ticks(&self) -> watch::Receiver<DateTime<Utc>> {
        self.tick.subscribe()
    }
}

/// A clock that moves only when told to.
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
    tick: watch::Sender<DateTime<Utc>>,
}

impl ManualClock {
    /// A manual clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now: Mutex::new(start),
            tick: watch::channel(start).0,
        })
    }

    /// Moves the clock forward and wakes every worker waiting on it.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now += chrono::Duration::from_std(by).expect("duration in range");
        self.tick.send_replace(*now);
    }

    /// Sets the clock to an absolute time (forward or back).
    pub fn set(&self, to: DateTime<Utc>) {
        *self.now.lock() = to;
        self.tick.send_replace(to);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock()
    }

    fn ticks(&self) -> watch::Receiver<DateTime<Utc>> {
        self.tick.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let clock = ManualClock::new(start);
        let mut ticks = clock.ticks();
        assert_eq!(clock.now(), start);
        clock.advance(Duration::from_secs(90));
        assert_eq!(clock.now(), start + chrono::Duration::seconds(90));
        assert!(ticks.has_changed().unwrap());
        assert_eq!(*ticks.borrow_and_update(), clock.now());
    }
}
