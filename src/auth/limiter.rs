//! Rate limiting of failed secret checks.
//!
//! Each key (a client id, a user name) may fail a fixed number of times in a
//! sliding window; beyond that it is refused without checking the secret,
//! until the window has passed. Successes do not count. The window runs on
//! the appliance's clock.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;

use crate::clock::SharedClock;

/// Counts failures per key in a sliding window.
pub struct FailureLimiter {
    clock: SharedClock,
    max_failures: usize,
    window: chrono::Duration,
    failures: Mutex<HashMap<String, VecDeque<DateTime<Utc>>>>,
}

impl FailureLimiter {
    /// At most `max_failures` failures per key within `window`.
    pub fn new(clock: SharedClock, max_failures: usize, window: Duration) -> Self {
        FailureLimiter {
            clock,
            max_failures,
            window: chrono::Duration::from_std(window).expect("window in range"),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Seconds until `key` may try again, or `None` when it may try now.
    pub fn retry_after(&self, key: &str) -> Option<u64> {
        let now = self.clock.now();
        let mut failures = self.failures.lock();
        let list = failures.get_mut(key)?;
        while list.front().is_some_and(|t| *t + self.window <= now) {
            list.pop_front();
        }
        if list.len() < self.max_failures {
            return None;
        }
        let oldest = *list.front()?;
        Some(((oldest + self.window) - now).num_seconds().max(1) as u64)
    }

    /// Records a failure of `key`.
    pub fn record_failure(&self, key: &str) {
        let now = self.clock.now();
        let mut failures = self.failures.lock();
        // Bound memory under a flood of distinct keys: forget quiet ones.
        if failures.len() > 10_000 {
            failures.retain(|_, list| list.back().is_some_and(|t| *t + self.window > now));
        }
        failures.entry(key.to_string()).or_default().push_back(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn failures_beyond_the_limit_wait_for_the_window() {
        let clock = ManualClock::new(Utc::now());
        let limiter = FailureLimiter::new(clock.clone(), 3, Duration::from_secs(60));
        for _ in 0..3 {
            assert_eq!(limiter.retry_after("c"), None);
            limiter.record_failure("c");
        }
        assert_eq!(limiter.retry_after("c"), Some(60));
        assert_eq!(limiter.retry_after("other"), None);
        clock.advance(Duration::from_secs(59));
        assert_eq!(limiter.retry_after("c"), Some(1));
        clock.advance(Duration::from_secs(1));
        assert_eq!(limiter.retry_after("c"), None);
    }
}
