//! Background workers: one small trait, one runner, one registry.
//!
//! Each worker (lease expirer, autoscaler, reconciler, compactor, outbox
//! pruner, ...) has a name and an interval and does one pass per run. The
//! runner schedules passes on the appliance's [`Clock`]: with the system
//! clock a worker runs every interval; with a manual clock it runs when a
//! test moves time past its next due time. The registry keeps each worker's
//! last outcome for `/readyz` and the console.
//!
//! [`Clock`]: crate::clock::Clock

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::clock::SharedClock;

/// A periodic job.
pub trait Worker: Send + Sync + 'static {
    /// Stable name, e.g. `LeaseExpirer`.
    fn name(&self) -> &'static str;
    /// Time between passes.
    fn interval(&self) -> Duration;
    /// One pass at `now`; returns a one-line summary of what it did.
    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>>;
}

/// The last known state of a worker.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerStatus {
    /// The worker.
    pub name: &'static str,
    /// Seconds between passes.
    pub interval_seconds: u64,
    /// Passes so far.
    pub runs: u64,
    /// Failed passes so far.
    pub failures: u64,
    /// When the last pass ended.
    pub last_run_at: Option<DateTime<Utc>>,
    /// Summary or error of the last pass.
    pub last_message: Option<String>,
    /// Whether the last pass succeeded.
    pub last_ok: bool,
    /// Whether the worker's task is alive.
    pub alive: bool,
}

/// Every worker's status, and a way to run one at once.
#[derive(Default)]
pub struct WorkerRegistry {
    workers: Mutex<BTreeMap<&'static str, Entry>>,
    triggers: Mutex<BTreeMap<&'static str, Arc<Notify>>>,
}

/// A worker's status and how many passes it has begun: a pass that began
/// before a caller asked for one is not the pass it asked for.
struct Entry {
    status: WorkerStatus,
    begun: u64,
}

impl WorkerRegistry {
    /// Snapshots of every worker, by name.
    pub fn statuses(&self) -> Vec<WorkerStatus> {
        self.workers
            .lock()
            .values()
            .map(|e| e.status.clone())
            .collect()
    }

    /// Asks a worker for an extra pass now. Returns false for an unknown name.
    pub fn trigger(&self, name: &str) -> bool {
        match self.triggers.lock().get(name) {
            Some(n) => {
                n.notify_one();
                true
            }
            None => false,
        }
    }

    /// Runs one pass of a worker now and waits for it (up to a minute).
    /// Returns its status after the pass, or `None` for an unknown name.
    ///
    /// The pass waited for is one that begins after this call: a pass
    /// already under way when it is made saw the world before the caller's
    /// last change (a moved clock, a new record), so its end does not count.
    pub async fn run_now(&self, name: &str) -> Option<WorkerStatus> {
        // Passes end in the order they begin, one at a time: the pass asked
        // for is done when the count of ended passes passes the count of
        // begun ones now.
        let begun = self.workers.lock().get(name)?.begun;
        self.trigger(name);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.workers.lock().get(name)?.status.clone();
            if status.runs > begun || !status.alive || tokio::time::Instant::now() > deadline {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Names of workers whose task has died.
    pub fn dead(&self) -> Vec<&'static str> {
        self.workers
            .lock()
            .values()
            .filter(|e| !e.status.alive)
            .map(|e| e.status.name)
            .collect()
    }

    fn update(&self, name: &'static str, f: impl FnOnce(&mut WorkerStatus)) {
        if let Some(e) = self.workers.lock().get_mut(name) {
            f(&mut e.status);
        }
    }

    fn begin(&self, name: &'static str) {
        if let Some(e) = self.workers.lock().get_mut(name) {
            e.begun += 1;
        }
    }
}

/// Starts a worker's task. It stops when `shutdown` turns true. The
/// interval is read at every pass, so a worker that reads it from a
/// reloadable section follows a reload.
pub fn spawn(
    worker: Arc<dyn Worker>,
    clock: SharedClock,
    registry: Arc<WorkerRegistry>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let name = worker.name();
    let interval = worker.interval();
    let trigger = Arc::new(Notify::new());
    registry.workers.lock().insert(
        name,
        Entry {
            status: WorkerStatus {
                name,
                interval_seconds: interval.as_secs(),
                runs: 0,
                failures: 0,
                last_run_at: None,
                last_message: None,
                last_ok: true,
                alive: true,
            },
            begun: 0,
        },
    );
    registry.triggers.lock().insert(name, trigger.clone());
    tokio::spawn(async move {
        let mut ticks = clock.ticks();
        // The first pass runs at start, so that state left by a crash is
        // dealt with before the first interval has passed.
        let mut next_due = clock.now();
        let mut forced = false;
        loop {
            if forced || clock.now() >= next_due {
                forced = false;
                registry.begin(name);
                // Read after the pass is counted as begun, so that a pass
                // asked for after a move of the clock sees the move.
                let now = clock.now();
                let outcome = worker.run(now).await;
                let ended = clock.now();
                registry.update(name, |s| {
                    s.runs += 1;
                    s.last_run_at = Some(ended);
                    match &outcome {
                        Ok(message) => {
                            s.last_ok = true;
                            s.last_message = Some(message.clone());
                        }
                        Err(e) => {
                            s.failures += 1;
                            s.last_ok = false;
                            s.last_message = Some(format!("{e:#}"));
                        }
                    }
                });
                match outcome {
                    Ok(message) if !message.is_empty() => {
                        tracing::debug!(worker = name, %message, "worker pass")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(worker = name, error = %format!("{e:#}"), "worker pass failed")
                    }
                }
                // Read again at every pass: a reload may have changed it.
                let interval = worker.interval();
                registry.update(name, |s| s.interval_seconds = interval.as_secs());
                next_due = now + chrono::Duration::from_std(interval).expect("interval in range");
            }
            let interval = worker.interval();
            let wait = (next_due - clock.now())
                .to_std()
                .unwrap_or(Duration::ZERO)
                .clamp(Duration::from_millis(5), interval);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                changed = ticks.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                _ = trigger.notified() => forced = true,
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
        registry.update(name, |s| s.alive = false);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts its passes; its interval (seconds) can change while it runs.
    struct Counter(Arc<AtomicU64>, Arc<AtomicU64>);

    impl Counter {
        fn every_minute(count: Arc<AtomicU64>) -> Counter {
            Counter(count, Arc::new(AtomicU64::new(60)))
        }
    }

    impl Worker for Counter {
        fn name(&self) -> &'static str {
            "Counter"
        }
        fn interval(&self) -> Duration {
            Duration::from_secs(self.1.load(Ordering::SeqCst))
        }
        fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
            Box::pin(async move {
                self.0.fetch_add(1, Ordering::SeqCst);
                Ok(String::new())
            })
        }
    }

    async fn wait_for(count: &AtomicU64, n: u64) {
        for _ in 0..500 {
            if count.load(Ordering::SeqCst) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!(
            "worker ran {} times, expected {n}",
            count.load(Ordering::SeqCst)
        );
    }

    #[tokio::test]
    async fn workers_run_when_the_clock_says_so() {
        let clock = ManualClock::new(Utc::now());
        let registry = Arc::new(WorkerRegistry::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        let count = Arc::new(AtomicU64::new(0));
        let handle = spawn(
            Arc::new(Counter::every_minute(count.clone())),
            clock.clone(),
            registry.clone(),
            stop_rx,
        );
        wait_for(&count, 1).await;
        // Half an interval: nothing.
        clock.advance(Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(count.load(Ordering::SeqCst), 1);
        clock.advance(Duration::from_secs(30));
        wait_for(&count, 2).await;
        assert!(registry.trigger("Counter"));
        wait_for(&count, 3).await;
        assert_eq!(registry.statuses()[0].runs, 3);
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
        assert_eq!(registry.dead(), vec!["Counter"]);
    }

    /// Holds its first pass until told; says at which time each pass ran.
    struct Held(Arc<Notify>);

    impl Worker for Held {
        fn name(&self) -> &'static str {
            "Held"
        }
        fn interval(&self) -> Duration {
            Duration::from_secs(3600)
        }
        fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
            Box::pin(async move {
                self.0.notified().await;
                Ok(now.to_rfc3339())
            })
        }
    }

    #[tokio::test]
    async fn a_pass_asked_for_is_one_that_begins_after_the_asking() {
        let start = Utc::now();
        let clock = ManualClock::new(start);
        let registry = Arc::new(WorkerRegistry::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        let release = Arc::new(Notify::new());
        let handle = spawn(
            Arc::new(Held(release.clone())),
            clock.clone(),
            registry.clone(),
            stop_rx,
        );
        // The pass at start is under way, held, when the clock moves and a
        // pass is asked for.
        tokio::time::sleep(Duration::from_millis(20)).await;
        clock.advance(Duration::from_secs(60));
        let asked = {
            let registry = registry.clone();
            tokio::spawn(async move { registry.run_now("Held").await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        release.notify_one();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !asked.is_finished(),
            "the held pass was taken for the one asked for"
        );
        release.notify_one();
        let status = asked.await.unwrap();
        assert_eq!(status.runs, 2);
        let moved = (start + chrono::Duration::seconds(60)).to_rfc3339();
        assert_eq!(status.last_message.as_deref(), Some(moved.as_str()));
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
    }

    #[tokio::test]
    async fn a_changed_interval_applies_from_the_next_pass() {
        let clock = ManualClock::new(Utc::now());
        let registry = Arc::new(WorkerRegistry::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        let count = Arc::new(AtomicU64::new(0));
        let every = Arc::new(AtomicU64::new(60));
        let handle = spawn(
            Arc::new(Counter(count.clone(), every.clone())),
            clock.clone(),
            registry.clone(),
            stop_rx,
        );
        wait_for(&count, 1).await;
        every.store(600, Ordering::SeqCst);
        clock.advance(Duration::from_secs(60));
        wait_for(&count, 2).await;
        assert_eq!(registry.statuses()[0].interval_seconds, 600);
        // Ten minutes now: a minute later, nothing.
        clock.advance(Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(count.load(Ordering::SeqCst), 2);
        clock.advance(Duration::from_secs(540));
        wait_for(&count, 3).await;
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
    }
}
