//! Throttling of secret checks (client secrets at `/oauth/token`, console
//! passwords), so that guessing is slow, a flood cannot exhaust memory, and
//! nobody can lock an account out by failing on purpose.
//!
//! Failures are counted in a sliding window (one minute, on the appliance's
//! clock) under three keys, each with its own limit and its own answer:
//!
//! - **a name from one source** (`auth.failures_per_name_and_source`): over
//!   the limit that pair is refused with 429 until the window frees it. The
//!   same name from elsewhere is not affected.
//! - **a source** (`auth.failures_per_source`): over the limit, its checks go
//!   one at a time, each after a one-second delay; more than a few waiting
//!   are refused with 429. A flooding address slows down only itself.
//! - **a name** (`auth.failures_per_name`): over the limit, every check of
//!   that name waits one second first and then goes ahead: a third party can
//!   slow an account down, never lock its owner out.
//!
//! Every check (and every hash of a new secret) takes a slot of the hashing
//! gate, sized from `auth.hash_memory_mb` (an argon2id check holds 19 MiB);
//! a check that finds no slot within two seconds is refused with 429, so
//! memory stays bounded whatever the number of callers.
//!
//! A source is an IPv4 address or an IPv6 /64 (one host's usual share).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::AuthError;
use crate::clock::SharedClock;
use crate::config::{AuthConfig, Live};

/// Memory an argon2id check with the default parameters holds, in MiB.
pub const HASH_MEMORY_MIB: u64 = 19;

/// How long a check waits for a hashing slot before it is refused.
const HASH_WAIT: Duration = Duration::from_secs(2);

/// The delay of a throttled check.
const DELAY: Duration = Duration::from_secs(1);

/// Checks from one throttled source that may wait behind the one going.
const LANE_QUEUE: usize = 4;

/// The window failures are counted in.
const WINDOW_SECONDS: i64 = 60;

/// Concurrent hashes `auth.hash_memory_mb` allows.
fn hash_slots(auth: &AuthConfig) -> usize {
    (auth.hash_memory_mb / HASH_MEMORY_MIB).max(1) as usize
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Pair(String, IpAddr),
    Source(IpAddr),
    Name(String),
}

/// One source's lane: throttled checks from it go one at a time.
struct Lane {
    turn: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// The process's hashing gate: one slot until [`Throttle::new`] sizes it,
/// so that offline commands hash one secret at a time too.
static HASHING: Semaphore = Semaphore::const_new(1);

/// Sizes [`HASHING`] once.
static HASHING_SIZED: std::sync::Once = std::sync::Once::new();

/// Counts failures and orders throttled checks.
pub struct Throttle {
    clock: SharedClock,
    /// The failure limits are read at every check, so that a reload takes
    /// effect at once; the hashing gate is sized once, at the start.
    config: Live<AuthConfig>,
    failures: Mutex<HashMap<Key, VecDeque<DateTime<Utc>>>>,
    lanes: Mutex<HashMap<IpAddr, Arc<Lane>>>,
    gate: &'static Semaphore,
}

/// A check's turn, within the failure limits; dropping it ends the turn.
pub struct Turn {
    _lane: Option<OwnedSemaphorePermit>,
    gate: &'static Semaphore,
}

impl Turn {
    /// A slot to hash in, refused when none frees within two seconds.
    pub async fn hash_slot(&self) -> Result<HashSlot, AuthError> {
        tokio::time::timeout(HASH_WAIT, HashSlot::of(self.gate))
            .await
            .map_err(|_| {
                metrics::counter!(crate::telemetry::names::AUTH_THROTTLED, "key" => "busy")
                    .increment(1);
                limited(
                    "the appliance is checking too many secrets at once; try again in 1 s".into(),
                    1,
                )
            })
    }
}

/// A slot of the hashing gate, held while one argon2id hash runs.
pub struct HashSlot(#[allow(dead_code)] tokio::sync::SemaphorePermit<'static>);

impl HashSlot {
    /// Waits for a slot (an authenticated action hashing a new secret).
    pub async fn wait() -> HashSlot {
        Self::of(&HASHING).await
    }

    async fn of(gate: &'static Semaphore) -> HashSlot {
        HashSlot(
            gate.acquire()
                .await
                .expect("the hashing gate is never closed"),
        )
    }
}

impl Throttle {
    /// A throttle with the limits of `[auth]`; the first one sizes the
    /// hashing gate.
    pub fn new(clock: SharedClock, config: Live<AuthConfig>) -> Self {
        let slots = hash_slots(&config.get());
        HASHING_SIZED.call_once(|| HASHING.add_permits(slots.saturating_sub(1)));
        Self::with_gate(clock, config, &HASHING)
    }

    fn with_gate(clock: SharedClock, config: Live<AuthConfig>, gate: &'static Semaphore) -> Self {
        Throttle {
            clock,
            config,
            failures: Mutex::new(HashMap::new()),
            lanes: Mutex::new(HashMap::new()),
            gate,
        }
    }

    /// Waits for the turn of a check of `name` (e.g. `user:olga`) from
    /// `source` under the failure limits, or refuses it with the seconds to
    /// wait. The hash itself then takes a [`Turn::hash_slot`].
    pub async fn turn(&self, name: &str, source: IpAddr) -> Result<Turn, AuthError> {
        let source = source_of(source);
        if let Some(seconds) = self.over(&Key::Pair(name.to_string(), source)) {
            return Err(limited(
                format!(
                    "too many failed attempts for this name from your address; try again in {seconds} s"
                ),
                seconds,
            ));
        }
        let lane = match self.over(&Key::Source(source)) {
            None => None,
            Some(_) => Some(self.lane_turn(source).await?),
        };
        if self.over(&Key::Name(name.to_string())).is_some() {
            metrics::counter!(crate::telemetry::names::AUTH_THROTTLED, "key" => "name")
                .increment(1);
            tokio::time::sleep(DELAY).await;
        }
        Ok(Turn {
            _lane: lane,
            gate: self.gate,
        })
    }

    /// Records a failed check of `name` from `source`.
    pub fn failed(&self, name: &str, source: IpAddr) {
        let source = source_of(source);
        let now = self.clock.now();
        let mut failures = self.failures.lock();
        // Bound memory under a flood of distinct keys: forget quiet ones.
        if failures.len() > 10_000 {
            let window = chrono::Duration::seconds(WINDOW_SECONDS);
            failures.retain(|_, list| list.back().is_some_and(|t| *t + window > now));
        }
        for key in [
            Key::Pair(name.to_string(), source),
            Key::Source(source),
            Key::Name(name.to_string()),
        ] {
            failures.entry(key).or_default().push_back(now);
        }
    }

    /// Seconds until `key` is under its limit again, or `None` when it is.
    fn over(&self, key: &Key) -> Option<u64> {
        let config = self.config.get();
        let limit = match key {
            Key::Pair(..) => config.failures_per_name_and_source,
            Key::Source(_) => config.failures_per_source,
            Key::Name(_) => config.failures_per_name,
        } as usize;
        let now = self.clock.now();
        let window = chrono::Duration::seconds(WINDOW_SECONDS);
        let mut failures = self.failures.lock();
        let list = failures.get_mut(key)?;
        while list.front().is_some_and(|t| *t + window <= now) {
            list.pop_front();
        }
        if list.len() < limit {
            return None;
        }
        let oldest = *list.get(list.len() - limit)?;
        Some(((oldest + window) - now).num_seconds().max(1) as u64)
    }

    /// Waits for `source`'s lane, then for the delay; refuses when too many
    /// checks of that source already wait.
    async fn lane_turn(&self, source: IpAddr) -> Result<OwnedSemaphorePermit, AuthError> {
        let lane = {
            let mut lanes = self.lanes.lock();
            if lanes.len() > 1_000 {
                lanes.retain(|_, lane| Arc::strong_count(lane) > 1);
            }
            lanes
                .entry(source)
                .or_insert_with(|| {
                    Arc::new(Lane {
                        turn: Arc::new(Semaphore::new(1)),
                        waiting: AtomicUsize::new(0),
                    })
                })
                .clone()
        };
        let waiting = lane.waiting.fetch_add(1, Ordering::AcqRel);
        if waiting >= LANE_QUEUE {
            lane.waiting.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!(crate::telemetry::names::AUTH_THROTTLED, "key" => "source")
                .increment(1);
            let seconds = (waiting as u64 + 1) * DELAY.as_secs();
            return Err(limited(
                format!("too many failed attempts from your address; try again in {seconds} s"),
                seconds,
            ));
        }
        let permit = lane.turn.clone().acquire_owned().await;
        lane.waiting.fetch_sub(1, Ordering::AcqRel);
        let permit = permit.expect("a lane is never closed");
        tokio::time::sleep(DELAY).await;
        Ok(permit)
    }
}

fn limited(message: String, retry_after: u64) -> AuthError {
    AuthError::RateLimited {
        message,
        retry_after,
    }
}

/// The source a failure counts against: an IPv4 address, or an IPv6 /64.
pub(super) fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn limits() -> AuthConfig {
        AuthConfig {
            failures_per_name_and_source: 3,
            failures_per_source: 5,
            failures_per_name: 4,
            hash_memory_mb: 2 * HASH_MEMORY_MIB,
            ..AuthConfig::default()
        }
    }

    fn throttle(clock: &Arc<ManualClock>) -> Throttle {
        throttle_of(clock, Live::new(limits()))
    }

    fn throttle_of(clock: &Arc<ManualClock>, config: Live<AuthConfig>) -> Throttle {
        let gate = Box::leak(Box::new(Semaphore::new(hash_slots(&config.get()))));
        Throttle::with_gate(clock.clone(), config, gate)
    }

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const THERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[tokio::test]
    async fn a_pair_over_its_limit_waits_for_the_window_and_other_sources_go_on() {
        let clock = ManualClock::new(Utc::now());
        let t = throttle(&clock);
        for _ in 0..3 {
            drop(t.turn("user:olga", HERE).await.unwrap());
            t.failed("user:olga", HERE);
        }
        match t.turn("user:olga", HERE).await {
            Err(AuthError::RateLimited { retry_after, .. }) => assert_eq!(retry_after, 60),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("the fourth failure of a pair must be refused"),
        }
        // The owner, elsewhere, still gets its turn.
        assert!(t.turn("user:olga", THERE).await.is_ok());
        clock.advance(Duration::from_secs(60));
        assert!(t.turn("user:olga", HERE).await.is_ok());
    }

    #[tokio::test]
    async fn a_reloaded_limit_counts_the_failures_already_seen() {
        let clock = ManualClock::new(Utc::now());
        let config = Live::new(limits());
        let t = throttle_of(&clock, config.clone());
        for _ in 0..2 {
            t.failed("user:olga", HERE);
        }
        assert!(t.turn("user:olga", HERE).await.is_ok(), "2 of 3");
        config.set(AuthConfig {
            failures_per_name_and_source: 2,
            ..limits()
        });
        assert!(
            matches!(
                t.turn("user:olga", HERE).await,
                Err(AuthError::RateLimited { .. })
            ),
            "2 of 2 after the reload"
        );
        config.set(AuthConfig {
            failures_per_name_and_source: 10,
            ..limits()
        });
        assert!(t.turn("user:olga", HERE).await.is_ok(), "2 of 10");
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_over_its_limit_is_delayed_not_refused() {
        let clock = ManualClock::new(Utc::now());
        let t = throttle(&clock);
        for i in 0..4u8 {
            let source = IpAddr::V4(std::net::Ipv4Addr::new(10, 1, 0, i));
            t.failed("client:c", source);
        }
        let started = tokio::time::Instant::now();
        assert!(t.turn("client:c", THERE).await.is_ok());
        assert_eq!(started.elapsed(), DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flooding_source_goes_one_at_a_time_and_its_excess_is_refused() {
        let clock = ManualClock::new(Utc::now());
        let t = Arc::new(throttle(&clock));
        for i in 0..5 {
            t.failed(&format!("user:random{i}"), HERE);
        }
        // One goes (after the delay) while LANE_QUEUE wait behind it.
        let mut waiting = Vec::new();
        for i in 0..=LANE_QUEUE {
            let t = t.clone();
            waiting.push(tokio::spawn(async move {
                let turn = t.turn(&format!("user:more{i}"), HERE).await;
                turn.map(|_| tokio::time::Instant::now())
            }));
        }
        tokio::task::yield_now().await;
        match t.turn("user:one-more", HERE).await {
            Err(AuthError::RateLimited { retry_after, .. }) => assert!(retry_after >= 1),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a full lane refuses"),
        }
        let start = tokio::time::Instant::now();
        let mut at: Vec<_> = Vec::new();
        for w in waiting {
            at.push(w.await.unwrap().unwrap() - start);
        }
        at.sort();
        assert_eq!(at, (1..=5).map(|s| DELAY * s).collect::<Vec<_>>());
        // Another source is not slowed.
        let started = tokio::time::Instant::now();
        assert!(t.turn("user:olga", THERE).await.is_ok());
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_hashing_gate_refuses_when_saturated() {
        let clock = ManualClock::new(Utc::now());
        let t = throttle(&clock);
        let turn = t.turn("user:a", HERE).await.unwrap();
        let a = turn.hash_slot().await.unwrap();
        let _b = turn.hash_slot().await.unwrap();
        match turn.hash_slot().await {
            Err(AuthError::RateLimited {
                retry_after,
                message,
            }) => {
                assert_eq!(retry_after, 1);
                assert!(message.contains("too many secrets at once"), "{message}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("two slots, three checks"),
        }
        drop(a);
        assert!(turn.hash_slot().await.is_ok());
    }

    #[test]
    fn an_ipv6_source_is_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_of(mapped), HERE);
    }
}
