//! The site's model servers as capacity: every model call to a site
//! profile's server (the builtin loop's and `CallModel`'s alike) is
//! admitted here first, within the limits its profile sets (calls in
//! flight, requests and tokens a minute). A call beyond them waits in the
//! server's queue, fair between tenants ([`ServerQueue`]); its attempt is
//! paused meanwhile (waiting, not active; its compute given back after the
//! usual grace) and runs again when its turn comes.
//!
//! What is held here is held in memory: a restart starts every queue
//! empty, and the attempts it paused are asked again by their reminders.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::clock::SharedClock;
use crate::domain::TenantId;
use crate::domain::model_profile::{ServerLimits, SiteModelProfile};
use crate::domain::model_server::{Admission, ServerQueue};
use crate::telemetry::names;

/// The model servers of the site, by their first endpoint.
pub struct ModelServers {
    clock: SharedClock,
    servers: Mutex<Servers>,
    /// Where the attempts whose turn came go: the runtime lets each one's
    /// grain know.
    turns: mpsc::UnboundedSender<(TenantId, Uuid)>,
}

#[derive(Default)]
struct Servers {
    by_key: HashMap<String, Server>,
    /// The server each attempt holds a place at, with its tenant.
    attempts: HashMap<Uuid, (String, TenantId)>,
}

struct Server {
    queue: ServerQueue,
    limits: ServerLimits,
    /// The label its metrics carry: its address (operators read metrics,
    /// tenants never do).
    label: String,
    /// What a waiting attempt reads it as: its profile, never its address.
    words: String,
    /// Its profile's servers, in order: what a probe asks while it is down.
    endpoints: Vec<String>,
    /// While down: when the next probe may start, the wait after a
    /// failed one, and whether one is out.
    probe: Option<Probe>,
}

#[derive(Clone, Copy)]
struct Probe {
    at: std::time::Instant,
    backoff: std::time::Duration,
    out: bool,
}

/// The first wait before a probe of a server that went down, and the
/// longest (the wait doubles after each failed probe).
const PROBE_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
const PROBE_MOST: std::time::Duration = std::time::Duration::from_secs(30);

/// A probe to make: the server's key and its profile's endpoints.
pub struct ProbeDue {
    /// The server.
    pub key: String,
    /// Where to ask, in order: any answer means it is up.
    pub endpoints: Vec<String>,
}

/// An attempt whose wait the outage outlasted: it fails.
pub struct OutageOver {
    /// Its tenant.
    pub tenant: TenantId,
    /// The attempt.
    pub attempt: Uuid,
    /// Why, in words.
    pub why: String,
}

/// A server's key and label: its profile's first endpoint, and that
/// endpoint's `host:port`.
fn key_of(profile: &SiteModelProfile) -> (String, String) {
    (profile.endpoint.clone(), label_of(&profile.endpoint))
}

/// The label a server's metrics carry: its endpoint's `host:port`.
pub fn label_of(endpoint: &str) -> String {
    url::Url::parse(endpoint)
        .ok()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
        .unwrap_or_else(|| endpoint.to_string())
}

impl Server {
    fn new(profile: &SiteModelProfile, label: String) -> Server {
        Server {
            queue: ServerQueue::default(),
            limits: profile.limits,
            label,
            words: format!("of site model profile {}", profile.profile_id),
            endpoints: profile.servers(),
            probe: None,
        }
    }
}

impl ModelServers {
    /// The servers, and where the attempts whose turn comes are sent.
    pub fn new(clock: SharedClock) -> (ModelServers, mpsc::UnboundedReceiver<(TenantId, Uuid)>) {
        let (turns, rx) = mpsc::unbounded_channel();
        (
            ModelServers {
                clock,
                servers: Mutex::new(Servers::default()),
                turns,
            },
            rx,
        )
    }

    /// Attempt `attempt` of `tenant` is about to call `profile`'s server:
    /// go, or wait (why, in words a tenant may read).
    pub fn admit(
        &self,
        profile: &SiteModelProfile,
        tenant: &TenantId,
        attempt: Uuid,
    ) -> Result<(), String> {
        let now = self.clock.now();
        let (key, label) = key_of(profile);
        let mut all = self.servers.lock();
        // A place held at another server (the profile was re-pointed) is
        // given up.
        if let Some((held, _)) = all.attempts.get(&attempt).cloned()
            && held != key
        {
            self.forget_locked(&mut all, attempt);
        }
        let words = format!("of site model profile {}", profile.profile_id);
        let server = all
            .by_key
            .entry(key.clone())
            .or_insert_with(|| Server::new(profile, label));
        // The profile's limits as set now (a change applies at once).
        server.limits = profile.limits;
        server.words = words;
        server.endpoints = profile.servers();
        let admission = server.queue.admit(attempt, tenant, &server.limits, now);
        let words = server.words.clone();
        gauges(server, now);
        all.attempts.insert(attempt, (key, tenant.clone()));
        match admission {
            Admission::Go => Ok(()),
            Admission::Wait(w) => Err(w.why(&words)),
        }
    }

    /// Attempt `attempt`'s call ended with `tokens`: its place is free.
    pub fn ended(&self, attempt: Uuid, tokens: u64) {
        let now = self.clock.now();
        let mut all = self.servers.lock();
        let Some((key, _)) = all.attempts.remove(&attempt) else {
            return;
        };
        let Some(server) = all.by_key.get_mut(&key) else {
            return;
        };
        if tokens > 0 {
            metrics::counter!(names::MODEL_SERVER_TOKENS, "server" => server.label.clone())
                .increment(tokens);
        }
        let turns = server.queue.ended(attempt, tokens, &server.limits, now);
        gauges(server, now);
        self.give(&all, turns);
    }

    /// Attempt `attempt` ended: whatever place it holds is given up.
    pub fn forget(&self, attempt: Uuid) {
        let mut all = self.servers.lock();
        self.forget_locked(&mut all, attempt);
    }

    fn forget_locked(&self, all: &mut Servers, attempt: Uuid) {
        let now = self.clock.now();
        let Some((key, _)) = all.attempts.remove(&attempt) else {
            return;
        };
        let Some(server) = all.by_key.get_mut(&key) else {
            return;
        };
        let turns = server.queue.forget(attempt, &server.limits, now);
        gauges(server, now);
        self.give(all, turns);
    }

    /// Every server of `profile` could not serve now (`why`): it is down
    /// until a probe finds it answering; calls to it wait meanwhile.
    pub fn mark_down(&self, profile: &SiteModelProfile, why: &str) {
        let now = self.clock.now();
        let (key, label) = key_of(profile);
        let mut all = self.servers.lock();
        let server = all
            .by_key
            .entry(key)
            .or_insert_with(|| Server::new(profile, label));
        if server.probe.is_none() {
            tracing::warn!(profile = %profile.profile_id, server = %server.label, reason = %why, "a site model server is down: calls to it wait until it answers");
            server.probe = Some(Probe {
                at: std::time::Instant::now() + PROBE_FIRST,
                backoff: PROBE_FIRST,
                out: false,
            });
        }
        server.queue.set_down(why.to_string(), now);
        metrics::gauge!(names::MODEL_SERVER_UP, "server" => server.label.clone()).set(0.0);
        gauges(server, now);
    }

    /// A probe of server `key` ended: it answered, or not (the next waits
    /// twice as long, up to half a minute).
    pub fn probed(&self, key: &str, answered: bool) {
        let now = self.clock.now();
        let mut all = self.servers.lock();
        let Some(server) = all.by_key.get_mut(key) else {
            return;
        };
        let Some(probe) = server.probe.as_mut() else {
            return;
        };
        if !answered {
            probe.out = false;
            probe.backoff = (probe.backoff * 2).min(PROBE_MOST);
            probe.at = std::time::Instant::now() + probe.backoff;
            return;
        }
        tracing::info!(server = %server.label, "a site model server answers again: the calls that waited for it go");
        server.probe = None;
        metrics::gauge!(names::MODEL_SERVER_UP, "server" => server.label.clone()).set(1.0);
        let turns = server.queue.set_up(&server.limits, now);
        gauges(server, now);
        self.give(&all, turns);
    }

    /// Every second: gives the turns of the servers whose minute moved
    /// on, ends the waits an outage of more than `outage_max` outlasted,
    /// drops idle servers, and returns the probes due.
    pub fn tick(&self, outage_max: chrono::Duration) -> (Vec<ProbeDue>, Vec<OutageOver>) {
        let now = self.clock.now();
        let mut all = self.servers.lock();
        let mut turns = Vec::new();
        let mut probes = Vec::new();
        let mut over = Vec::new();
        for (key, server) in all.by_key.iter_mut() {
            if let Some(why) = server.queue.outage_over(&server.words, outage_max, now) {
                over.extend(
                    server
                        .queue
                        .give_up_waiting()
                        .into_iter()
                        .map(|attempt| (attempt, why.clone())),
                );
            }
            if server.queue.has_waiting() {
                turns.extend(server.queue.serve(&server.limits, now));
            }
            if let Some(probe) = server.probe.as_mut()
                && !probe.out
                && probe.at <= std::time::Instant::now()
            {
                probe.out = true;
                probes.push(ProbeDue {
                    key: key.clone(),
                    endpoints: server.endpoints.clone(),
                });
            }
            gauges(server, now);
        }
        let over = over
            .into_iter()
            .filter_map(|(attempt, why)| {
                let (_, tenant) = all.attempts.remove(&attempt)?;
                Some(OutageOver {
                    tenant,
                    attempt,
                    why,
                })
            })
            .collect();
        all.by_key.retain(|_, s| !s.queue.is_idle());
        self.give(&all, turns);
        (probes, over)
    }

    /// What the server whose first endpoint is `endpoint` is doing now,
    /// in words, for the console: idle, its calls and queue, or down.
    pub fn now(&self, endpoint: &str) -> String {
        let now = self.clock.now();
        let all = self.servers.lock();
        let Some(server) = all.by_key.get(endpoint) else {
            return "idle".into();
        };
        let g = server.queue.gauges(now);
        let queue = match g.queued {
            0 => String::new(),
            n => format!("; {n} waiting (the oldest {:.0} s)", g.oldest_wait_seconds),
        };
        match server.queue.down_since() {
            Some(since) => format!(
                "DOWN since {} (probed with backoff){queue}",
                since.format("%Y-%m-%d %H:%M:%S UTC")
            ),
            None => format!("{} in flight{queue}", g.in_flight),
        }
    }

    /// Whether `attempt` holds a place at a server: in flight, with a turn
    /// given, or queued.
    pub fn holds_place(&self, attempt: Uuid) -> bool {
        self.servers.lock().attempts.contains_key(&attempt)
    }

    /// Where `attempt` waits now and why, if it does: its place moves as
    /// the queue is served.
    pub fn waiting(&self, attempt: Uuid) -> Option<String> {
        let all = self.servers.lock();
        let (key, _) = all.attempts.get(&attempt)?;
        let server = all.by_key.get(key)?;
        server
            .queue
            .position(attempt, &server.limits)
            .map(|w| w.why(&server.words))
    }

    fn give(&self, all: &Servers, turns: Vec<Uuid>) {
        for attempt in turns {
            if let Some((_, tenant)) = all.attempts.get(&attempt) {
                let _ = self.turns.send((tenant.clone(), attempt));
            }
        }
    }
}

/// A server's gauges, as they are now.
fn gauges(server: &Server, now: chrono::DateTime<chrono::Utc>) {
    let g = server.queue.gauges(now);
    let label = server.label.clone();
    metrics::gauge!(names::MODEL_SERVER_IN_FLIGHT, "server" => label.clone())
        .set(g.in_flight as f64);
    metrics::gauge!(names::MODEL_SERVER_QUEUED, "server" => label.clone()).set(g.queued as f64);
    metrics::gauge!(names::MODEL_SERVER_OLDEST_WAIT, "server" => label).set(g.oldest_wait_seconds);
}
