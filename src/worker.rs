//! Background workers: one small trait, one runner, one registry.
//!
//! Each worker (lease expirer, autoscaler, reconciler, compactor, outbox
//! pruner, ...) has a name, a [`Schedule`] (every so many seconds, or a
//! cron expression in the site's local time) and a [`Retry`] policy (the
//! specification's: none, fixed or exponential, bounded), and does one pass
//! per run. The runner schedules passes on the appliance's [`Clock`]: with
//! the system clock a worker runs when it is due; with a manual clock it
//! runs when a test moves time past its next due time.
//!
//! A failed pass is retried by the worker's policy: after the n-th failure
//! in a row the next pass is due after the policy's delay, while the streak
//! is within the policy's attempts; beyond them (and with no policy) the
//! worker keeps its schedule. The streak is logged once, when it begins and
//! when it ends, and counted in `agentbay_worker_failures_total` and
//! `agentbay_worker_consecutive_failures`. The registry keeps each
//! worker's last outcome, last failure and next due time for `/readyz`,
//! the System page and `agentbay_worker_lag_seconds`.
//!
//! [`Clock`]: crate::clock::Clock

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::clock::SharedClock;
use crate::telemetry::{Gauge, names};

/// A periodic job.
pub trait Worker: Send + Sync + 'static {
    /// Stable name, e.g. `LeaseExpirer`.
    fn name(&self) -> &'static str;
    /// When passes are due. Read after every pass, so a worker that reads
    /// it from a reloadable section follows a reload.
    fn schedule(&self) -> Schedule;
    /// How a failed pass is retried (the specification's policy).
    fn retry(&self) -> RetryKind;
    /// One pass at `now`; returns a one-line summary of what it did.
    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>>;
}

/// When a worker's passes are due.
#[derive(Clone, Debug)]
pub enum Schedule {
    /// Every so long after the last pass began.
    Every(Duration),
    /// At the times a cron expression names, in the site's local time.
    Cron(Box<Cron>),
}

impl Schedule {
    /// Every `seconds` seconds.
    pub fn seconds(seconds: u64) -> Schedule {
        Schedule::Every(Duration::from_secs(seconds))
    }

    /// The first due time after a pass that began at `begun`.
    pub fn next_after(&self, begun: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Schedule::Every(every) => {
                begun + chrono::Duration::from_std(*every).unwrap_or(chrono::Duration::MAX)
            }
            Schedule::Cron(cron) => cron.next_after(begun),
        }
    }

    /// The first due time of a worker that starts at `start`: at once for
    /// an interval (state left by a crash is dealt with before the first
    /// interval has passed), at its next time for a cron schedule.
    fn first(&self, start: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Schedule::Every(_) => start,
            Schedule::Cron(cron) => cron.next_after(start),
        }
    }

    /// Seconds between passes, for an interval schedule.
    fn interval_seconds(&self) -> Option<u64> {
        match self {
            Schedule::Every(every) => Some(every.as_secs()),
            Schedule::Cron(_) => None,
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Every(every) => write!(f, "every {} s", every.as_secs()),
            Schedule::Cron(cron) => write!(f, "cron {} (site-local time)", cron.expression),
        }
    }
}

/// A five-field cron expression (`minute hour day-of-month month
/// day-of-week`), evaluated in the site's local time zone.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cron {
    expression: String,
    cron: croner::Cron,
}

impl Cron {
    /// Parses `expression`, or says why it is not one.
    pub fn parse(expression: &str) -> Result<Cron, String> {
        if expression.split_whitespace().count() != 5 {
            return Err(format!(
                "{expression:?} is not a cron expression of five fields (minute hour day-of-month month day-of-week)"
            ));
        }
        let cron = croner::Cron::from_str(expression)
            .map_err(|e| format!("{expression:?} is not a cron expression: {e}"))?;
        Ok(Cron {
            expression: expression.trim().to_string(),
            cron,
        })
    }

    /// The first time strictly after `t` that the expression names, in the
    /// site's local time.
    pub fn next_after(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        let local = t.with_timezone(&chrono::Local);
        match self.cron.find_next_occurrence(&local, false) {
            Ok(next) => next.with_timezone(&Utc),
            // An expression that never matches again (the 30th of
            // February): never due.
            Err(_) => DateTime::<Utc>::MAX_UTC,
        }
    }
}

impl TryFrom<String> for Cron {
    type Error = String;
    fn try_from(expression: String) -> Result<Cron, String> {
        Cron::parse(&expression)
    }
}

impl From<Cron> for String {
    fn from(cron: Cron) -> String {
        cron.expression
    }
}

impl PartialEq for Cron {
    fn eq(&self, other: &Cron) -> bool {
        self.expression == other.expression
    }
}

/// How a failed pass is retried: the specification names the kind for
/// each worker; the site configures the delays (`[workers]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum RetryKind {
    /// The next pass is the scheduled one.
    None,
    /// After `retry_delay_seconds`, up to `retry_attempts` times.
    Fixed,
    /// After `retry_delay_seconds`, doubled at each failure up to
    /// `retry_max_delay_seconds`, up to `retry_attempts` times.
    Exponential,
}

/// The site's retry settings (`[workers]`), with the worker's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// The kind.
    pub kind: RetryKind,
    /// The first delay (and every delay, for fixed).
    pub delay: Duration,
    /// The longest delay (exponential).
    pub max_delay: Duration,
    /// Retries in a streak before the worker keeps its schedule again.
    pub attempts: u32,
}

impl Retry {
    /// When the pass after the `failures`-th failure in a row is due, by
    /// this policy; `None` when the schedule decides.
    pub fn delay(&self, failures: u32) -> Option<Duration> {
        if failures == 0 || failures > self.attempts {
            return None;
        }
        match self.kind {
            RetryKind::None => None,
            RetryKind::Fixed => Some(self.delay),
            RetryKind::Exponential => {
                let doubled = self
                    .delay
                    .checked_mul(1u32.checked_shl(failures - 1).unwrap_or(u32::MAX))
                    .unwrap_or(self.max_delay);
                Some(doubled.min(self.max_delay))
            }
        }
    }
}

impl std::fmt::Display for Retry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            RetryKind::None => write!(f, "none"),
            RetryKind::Fixed => write!(
                f,
                "fixed: after {} s, {} times",
                self.delay.as_secs(),
                self.attempts
            ),
            RetryKind::Exponential => write!(
                f,
                "exponential: after {} s doubling to {} s, {} times",
                self.delay.as_secs(),
                self.max_delay.as_secs(),
                self.attempts
            ),
        }
    }
}

/// The site's retry settings for every worker (`[workers]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetrySettings {
    /// `workers.retry_delay_seconds`.
    pub delay: Duration,
    /// `workers.retry_max_delay_seconds`.
    pub max_delay: Duration,
    /// `workers.retry_attempts`.
    pub attempts: u32,
}

impl RetrySettings {
    /// The policy of a worker of `kind`.
    pub fn of(&self, kind: RetryKind) -> Retry {
        Retry {
            kind,
            delay: self.delay,
            max_delay: self.max_delay,
            attempts: self.attempts,
        }
    }
}

/// The last known state of a worker.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerStatus {
    /// The worker.
    pub name: &'static str,
    /// When passes are due: `every N s`, or `cron EXPR (site-local time)`.
    pub schedule: String,
    /// Seconds between passes, for an interval schedule.
    pub interval_seconds: Option<u64>,
    /// How a failed pass is retried.
    pub retry: String,
    /// Passes so far.
    pub runs: u64,
    /// Failed passes so far.
    pub failures: u64,
    /// Failed passes in a row now (0: the last pass succeeded).
    pub consecutive_failures: u32,
    /// When the last pass ended.
    pub last_run_at: Option<DateTime<Utc>>,
    /// Summary or error of the last pass.
    pub last_message: Option<String>,
    /// Whether the last pass succeeded.
    pub last_ok: bool,
    /// When the last successful pass ended.
    pub last_success_at: Option<DateTime<Utc>>,
    /// When the last failed pass ended.
    pub last_failure_at: Option<DateTime<Utc>>,
    /// Its error.
    pub last_failure: Option<String>,
    /// When the next pass is due (a retry's time while a streak lasts).
    pub next_run_at: Option<DateTime<Utc>>,
    /// When the pass under way was due, while one runs.
    #[serde(skip)]
    pub running_due: Option<DateTime<Utc>>,
    /// Whether the worker's task is alive.
    pub alive: bool,
}

impl WorkerStatus {
    /// How far past its due time the worker's next (or running) pass is
    /// at `now`, in seconds; 0 when on time.
    pub fn lag_seconds(&self, now: DateTime<Utc>) -> f64 {
        let due = self.running_due.or(self.next_run_at);
        due.map(|d| (now - d).num_milliseconds().max(0) as f64 / 1000.0)
            .unwrap_or(0.0)
    }
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

    /// The workers' gauges as of `now`: lag, failures in a row and the
    /// last success.
    pub fn gauges(&self, now: DateTime<Utc>) -> Vec<Gauge> {
        let mut lag = Gauge::new(
            names::WORKER_LAG,
            "How far past its due time a worker's next pass is, in seconds",
        );
        let mut streak = Gauge::new(
            names::WORKER_CONSECUTIVE_FAILURES,
            "Failed passes in a row of a background worker",
        );
        let mut success = Gauge::new(
            names::WORKER_LAST_SUCCESS,
            "When a worker's last successful pass ended, Unix time",
        );
        for s in self.statuses() {
            let w = [("worker", s.name)];
            lag.set(&w, s.lag_seconds(now));
            streak.set(&w, f64::from(s.consecutive_failures));
            if let Some(at) = s.last_success_at {
                success.set(&w, at.timestamp() as f64);
            }
        }
        vec![lag, streak, success]
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

    fn begin(&self, name: &'static str, due: DateTime<Utc>) {
        if let Some(e) = self.workers.lock().get_mut(name) {
            e.begun += 1;
            e.status.running_due = Some(due);
        }
    }
}

/// Starts a worker's task. It stops when `shutdown` turns true. The
/// schedule is read at every pass, so a worker that reads it from a
/// reloadable section follows a reload.
pub fn spawn(
    worker: Arc<dyn Worker>,
    clock: SharedClock,
    registry: Arc<WorkerRegistry>,
    retries: RetrySettings,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let name = worker.name();
    let schedule = worker.schedule();
    let retry = retries.of(worker.retry());
    let trigger = Arc::new(Notify::new());
    let mut next_due = schedule.first(clock.now());
    registry.workers.lock().insert(
        name,
        Entry {
            status: WorkerStatus {
                name,
                schedule: schedule.to_string(),
                interval_seconds: schedule.interval_seconds(),
                retry: retry.to_string(),
                runs: 0,
                failures: 0,
                consecutive_failures: 0,
                last_run_at: None,
                last_message: None,
                last_ok: true,
                last_success_at: None,
                last_failure_at: None,
                last_failure: None,
                next_run_at: Some(next_due),
                running_due: None,
                alive: true,
            },
            begun: 0,
        },
    );
    registry.triggers.lock().insert(name, trigger.clone());
    tokio::spawn(async move {
        let mut ticks = clock.ticks();
        let mut forced = false;
        let mut streak = 0u32;
        loop {
            if forced || clock.now() >= next_due {
                registry.begin(name, if forced { clock.now() } else { next_due });
                forced = false;
                // Read after the pass is counted as begun, so that a pass
                // asked for after a move of the clock sees the move.
                let now = clock.now();
                let outcome = worker.run(now).await;
                let ended = clock.now();
                let schedule = worker.schedule();
                streak = match &outcome {
                    Ok(_) => 0,
                    Err(_) => streak.saturating_add(1),
                };
                next_due = match retry.delay(streak) {
                    Some(delay) => {
                        ended + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX)
                    }
                    None => schedule.next_after(now),
                };
                let mut ended_streak = 0;
                registry.update(name, |s| {
                    s.runs += 1;
                    s.last_run_at = Some(ended);
                    s.running_due = None;
                    s.next_run_at = Some(next_due);
                    s.schedule = schedule.to_string();
                    s.interval_seconds = schedule.interval_seconds();
                    match &outcome {
                        Ok(message) => {
                            ended_streak = s.consecutive_failures;
                            s.last_ok = true;
                            s.last_success_at = Some(ended);
                            s.last_message = Some(message.clone());
                        }
                        Err(e) => {
                            s.failures += 1;
                            s.last_ok = false;
                            s.last_failure_at = Some(ended);
                            s.last_failure = Some(format!("{e:#}"));
                            s.last_message = s.last_failure.clone();
                        }
                    }
                    s.consecutive_failures = streak;
                });
                match outcome {
                    Ok(message) => {
                        if ended_streak > 0 {
                            tracing::info!(
                                worker = name,
                                failed_passes = ended_streak,
                                "worker recovered"
                            );
                        }
                        if !message.is_empty() {
                            tracing::debug!(worker = name, %message, "worker pass");
                        }
                    }
                    Err(e) => {
                        metrics::counter!(names::WORKER_FAILURES, "worker" => name).increment(1);
                        let error = format!("{e:#}");
                        let next = next_due.to_rfc3339();
                        // Once per streak: the first failure, with what
                        // follows; later ones at debug level.
                        if streak == 1 {
                            tracing::warn!(worker = name, %error, %retry, next_pass = %next, "worker pass failed; retrying by its policy");
                        } else {
                            tracing::debug!(worker = name, %error, failures_in_a_row = streak, next_pass = %next, "worker pass failed again");
                        }
                    }
                }
            }
            let wait = (next_due - clock.now())
                .to_std()
                .unwrap_or(Duration::ZERO)
                .clamp(Duration::from_millis(5), Duration::from_secs(60));
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
    use crate::clock::{Clock, ManualClock};
    use std::sync::atomic::{AtomicU64, Ordering};

    const RETRIES: RetrySettings = RetrySettings {
        delay: Duration::from_secs(10),
        max_delay: Duration::from_secs(60),
        attempts: 4,
    };

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
        fn schedule(&self) -> Schedule {
            Schedule::seconds(self.1.load(Ordering::SeqCst))
        }
        fn retry(&self) -> RetryKind {
            RetryKind::None
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
            RETRIES,
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
        fn schedule(&self) -> Schedule {
            Schedule::seconds(3600)
        }
        fn retry(&self) -> RetryKind {
            RetryKind::None
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
            RETRIES,
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
            RETRIES,
            stop_rx,
        );
        wait_for(&count, 1).await;
        every.store(600, Ordering::SeqCst);
        clock.advance(Duration::from_secs(60));
        wait_for(&count, 2).await;
        assert_eq!(registry.statuses()[0].interval_seconds, Some(600));
        // Ten minutes now: a minute later, nothing.
        clock.advance(Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(count.load(Ordering::SeqCst), 2);
        clock.advance(Duration::from_secs(540));
        wait_for(&count, 3).await;
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
    }

    /// Fails its passes while told to; counts them.
    struct Flaky {
        kind: RetryKind,
        failing: Arc<std::sync::atomic::AtomicBool>,
        count: Arc<AtomicU64>,
    }

    impl Worker for Flaky {
        fn name(&self) -> &'static str {
            "Flaky"
        }
        fn schedule(&self) -> Schedule {
            Schedule::seconds(3600)
        }
        fn retry(&self) -> RetryKind {
            self.kind
        }
        fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
            Box::pin(async move {
                self.count.fetch_add(1, Ordering::SeqCst);
                if self.failing.load(Ordering::SeqCst) {
                    anyhow::bail!("the disk is away");
                }
                Ok(String::new())
            })
        }
    }

    /// Moves the clock in steps of one second up to `seconds`, letting the
    /// worker run what is due at each step, and says after how many
    /// seconds (from the call) each new pass ran.
    async fn passes_over(
        clock: &ManualClock,
        registry: &WorkerRegistry,
        count: &AtomicU64,
        seconds: u64,
    ) -> Vec<u64> {
        let mut at = Vec::new();
        let mut seen = count.load(Ordering::SeqCst);
        for s in 1..=seconds {
            clock.advance(Duration::from_secs(1));
            let now = clock.now();
            // Settled: nothing is due at `now` and no pass runs.
            for _ in 0..5000 {
                let st = registry.statuses()[0].clone();
                if st.running_due.is_none() && st.next_run_at.is_some_and(|n| n > now) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let n = count.load(Ordering::SeqCst);
            if n > seen {
                at.push(s);
                seen = n;
            }
        }
        at
    }

    #[tokio::test]
    async fn a_failing_worker_backs_off_exponentially_then_keeps_its_schedule() {
        let clock = ManualClock::new(Utc::now());
        let registry = Arc::new(WorkerRegistry::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let count = Arc::new(AtomicU64::new(0));
        let handle = spawn(
            Arc::new(Flaky {
                kind: RetryKind::Exponential,
                failing: failing.clone(),
                count: count.clone(),
            }),
            clock.clone(),
            registry.clone(),
            RETRIES,
            stop_rx,
        );
        wait_for(&count, 1).await;
        // Retries after 10, 20, 40 and 60 (the longest delay) seconds:
        // at 10, 30, 70 and 130 s from the first failure.
        let at = passes_over(&clock, &registry, &count, 200).await;
        assert_eq!(at, vec![10, 30, 70, 130]);
        let status = registry.statuses()[0].clone();
        assert_eq!(status.consecutive_failures, 5);
        assert_eq!(status.failures, 5);
        assert_eq!(status.last_failure.as_deref(), Some("the disk is away"));
        // Four retries spent: the next pass is the scheduled one, an hour
        // after the last.
        let next = status.next_run_at.unwrap();
        assert_eq!(
            next,
            status.last_run_at.unwrap() + chrono::Duration::seconds(3600)
        );
        // It lags once the clock passes that time without a pass.
        assert_eq!(
            status.lag_seconds(next + chrono::Duration::seconds(30)),
            30.0
        );
        // Success ends the streak.
        failing.store(false, Ordering::SeqCst);
        registry.run_now("Flaky").await.unwrap();
        let status = registry.statuses()[0].clone();
        assert_eq!(status.consecutive_failures, 0);
        assert!(status.last_ok && status.last_success_at.is_some());
        assert_eq!(status.last_failure.as_deref(), Some("the disk is away"));
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
    }

    #[tokio::test]
    async fn a_failing_worker_with_a_fixed_policy_retries_at_its_delay() {
        let clock = ManualClock::new(Utc::now());
        let registry = Arc::new(WorkerRegistry::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        let count = Arc::new(AtomicU64::new(0));
        let handle = spawn(
            Arc::new(Flaky {
                kind: RetryKind::Fixed,
                failing: Arc::new(std::sync::atomic::AtomicBool::new(true)),
                count: count.clone(),
            }),
            clock.clone(),
            registry.clone(),
            RETRIES,
            stop_rx,
        );
        wait_for(&count, 1).await;
        let at = passes_over(&clock, &registry, &count, 60).await;
        assert_eq!(at, vec![10, 20, 30, 40]);
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
    }

    #[test]
    fn retry_delays_are_bounded() {
        let r = RETRIES.of(RetryKind::Exponential);
        let delays: Vec<_> = (0..7).map(|n| r.delay(n).map(|d| d.as_secs())).collect();
        assert_eq!(
            delays,
            vec![None, Some(10), Some(20), Some(40), Some(60), None, None]
        );
        assert_eq!(RETRIES.of(RetryKind::None).delay(1), None);
        let huge = Retry {
            attempts: u32::MAX,
            ..r
        };
        assert_eq!(huge.delay(200), Some(Duration::from_secs(60)));
    }

    /// Counts its passes, on a cron schedule.
    struct Nightly(Arc<AtomicU64>, Cron);

    impl Worker for Nightly {
        fn name(&self) -> &'static str {
            "Nightly"
        }
        fn schedule(&self) -> Schedule {
            Schedule::Cron(Box::new(self.1.clone()))
        }
        fn retry(&self) -> RetryKind {
            RetryKind::Fixed
        }
        fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
            Box::pin(async move {
                self.0.fetch_add(1, Ordering::SeqCst);
                Ok(String::new())
            })
        }
    }

    #[tokio::test]
    async fn a_cron_worker_runs_at_its_local_time_and_not_at_start() {
        use chrono::TimeZone;
        // 02:58 site-local time today.
        let today = Utc::now().with_timezone(&chrono::Local).date_naive();
        let start = chrono::Local
            .from_local_datetime(&today.and_hms_opt(2, 58, 0).unwrap())
            .earliest()
            .unwrap()
            .with_timezone(&Utc);
        let clock = ManualClock::new(start);
        let registry = Arc::new(WorkerRegistry::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        let count = Arc::new(AtomicU64::new(0));
        let cron = Cron::parse("0 3 * * *").unwrap();
        let handle = spawn(
            Arc::new(Nightly(count.clone(), cron)),
            clock.clone(),
            registry.clone(),
            RETRIES,
            stop_rx,
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(
            count.load(Ordering::SeqCst),
            0,
            "a cron worker ran at start"
        );
        let status = registry.statuses()[0].clone();
        assert_eq!(
            status.next_run_at,
            Some(start + chrono::Duration::minutes(2))
        );
        assert_eq!(status.schedule, "cron 0 3 * * * (site-local time)");
        // 02:59:59: not yet; 03:00: once; the next is a day later.
        let at = passes_over(&clock, &registry, &count, 180).await;
        assert_eq!(at, vec![120]);
        let status = registry.statuses()[0].clone();
        assert_eq!(
            status
                .next_run_at
                .unwrap()
                .with_timezone(&chrono::Local)
                .time(),
            chrono::NaiveTime::from_hms_opt(3, 0, 0).unwrap()
        );
        assert!(status.next_run_at.unwrap() > start + chrono::Duration::hours(23));
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
    }

    #[test]
    fn a_cron_expression_is_refused_with_its_reason() {
        assert!(Cron::parse("0 3 * * *").is_ok());
        let e = Cron::parse("0 3 * *").unwrap_err();
        assert!(e.contains("five fields"), "{e}");
        let e = Cron::parse("0 25 * * *").unwrap_err();
        assert!(e.contains("not a cron expression"), "{e}");
    }
}
