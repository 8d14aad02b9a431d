//! One site model server as capacity: the calls in flight on it, the
//! requests and tokens of the last minute, and the queue of attempts whose
//! next call waits for it, fair between tenants.
//!
//! A call goes at once while the server is within its limits and nobody
//! waits; else it joins the queue. When room is made (a call ends, a
//! minute passes), the queue is served round-robin by tenant, first come
//! first served within a tenant: a tenant that queues ten times more calls
//! than another does not get ten times more turns. A turn reserves its
//! place in flight for the attempt, which takes it with its next call.

use std::collections::{HashMap, VecDeque};

use chrono::{DateTime, Duration, Utc};
use uuid::Uuid;

use super::TenantId;
use super::model_profile::ServerLimits;

/// What a call may do now.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Go: it is counted in flight until it ends.
    Go,
    /// Wait: it is queued (or was already), and why.
    Wait(Waiting),
}

/// Why a call waits, and where it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    /// Calls in flight (and turns given, not yet taken).
    pub in_flight: u32,
    /// The limit that holds it, in words.
    pub holds: String,
    /// Its place in the queue, 1 first.
    pub position: usize,
    /// Queued in all.
    pub queued: usize,
}

impl Waiting {
    /// Why, in words, naming the server as `server` says.
    pub fn why(&self, server: &str) -> String {
        format!(
            "waiting for model server {server}: {}; position {} of {} in its queue",
            self.holds, self.position, self.queued
        )
    }
}

/// One server's state.
#[derive(Debug, Default)]
pub struct ServerQueue {
    /// Attempts with a call in flight, or a turn given and not yet taken.
    in_flight: HashMap<Uuid, Held>,
    /// Each tenant's waiting attempts, oldest first.
    waiting: HashMap<TenantId, VecDeque<(Uuid, DateTime<Utc>)>>,
    /// The tenants with waiting attempts, in the order they are served.
    rotation: VecDeque<TenantId>,
    /// When each of the last minute's calls started.
    requests: VecDeque<DateTime<Utc>>,
    /// The tokens of the last minute's ended calls, with when.
    tokens: VecDeque<(DateTime<Utc>, u64)>,
    /// Down: since when, and why (no call goes while it is).
    down: Option<(DateTime<Utc>, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Held {
    /// Its turn came; its next call takes it.
    Turn,
    /// A call is in flight.
    Call,
}

/// What the metrics read of a server.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gauges {
    /// Calls in flight and turns given.
    pub in_flight: usize,
    /// Attempts queued.
    pub queued: usize,
    /// How long the oldest has waited, seconds.
    pub oldest_wait_seconds: f64,
}

impl ServerQueue {
    /// Attempt `attempt` of `tenant` asks to make a call.
    pub fn admit(
        &mut self,
        attempt: Uuid,
        tenant: &TenantId,
        limits: &ServerLimits,
        now: DateTime<Utc>,
    ) -> Admission {
        self.forget_before(now);
        match self.in_flight.get(&attempt) {
            Some(Held::Turn) => {
                self.in_flight.insert(attempt, Held::Call);
                self.requests.push_back(now);
                return Admission::Go;
            }
            // A call that was not ended (its adapter began another): it
            // is the same place.
            Some(Held::Call) => return Admission::Go,
            None => {}
        }
        if !self.is_waiting(attempt) {
            if self.rotation.is_empty() && self.holds(limits).is_none() {
                self.in_flight.insert(attempt, Held::Call);
                self.requests.push_back(now);
                return Admission::Go;
            }
            let queue = self.waiting.entry(tenant.clone()).or_default();
            if queue.is_empty() {
                self.rotation.push_back(tenant.clone());
            }
            queue.push_back((attempt, now));
        }
        Admission::Wait(self.waiting_of(attempt, limits))
    }

    /// Where `attempt` waits and why (`None`: it does not).
    pub fn position(&self, attempt: Uuid, limits: &ServerLimits) -> Option<Waiting> {
        self.is_waiting(attempt)
            .then(|| self.waiting_of(attempt, limits))
    }

    fn waiting_of(&self, attempt: Uuid, limits: &ServerLimits) -> Waiting {
        Waiting {
            in_flight: self.in_flight.len() as u32,
            holds: self
                .holds(limits)
                .unwrap_or_else(|| "attempts queued before it are served first".into()),
            position: self.order().iter().position(|a| *a == attempt).unwrap_or(0) + 1,
            queued: self.waiting.values().map(VecDeque::len).sum(),
        }
    }

    fn is_waiting(&self, attempt: Uuid) -> bool {
        self.waiting
            .values()
            .any(|q| q.iter().any(|(a, _)| *a == attempt))
    }

    /// The order the queue would be served in.
    fn order(&self) -> Vec<Uuid> {
        let mut order = Vec::new();
        let mut depth = 0;
        loop {
            let before = order.len();
            for tenant in &self.rotation {
                if let Some((a, _)) = self.waiting.get(tenant).and_then(|q| q.get(depth)) {
                    order.push(*a);
                }
            }
            if order.len() == before {
                return order;
            }
            depth += 1;
        }
    }

    /// The limit that keeps a new call from going now, in words.
    fn holds(&self, limits: &ServerLimits) -> Option<String> {
        if let Some((since, why)) = &self.down {
            return Some(format!(
                "it is down since {} ({why}); the appliance asks it again and the attempt runs when it answers",
                since.format("%Y-%m-%d %H:%M:%S UTC")
            ));
        }
        if let Some(most) = limits.max_concurrent
            && self.in_flight.len() as u32 >= most
        {
            return Some(format!(
                "{} of {most} calls in flight",
                self.in_flight.len()
            ));
        }
        if let Some(most) = limits.requests_per_minute
            && self.requests.len() as u32 >= most
        {
            return Some(format!(
                "{} of {most} requests in the last minute",
                self.requests.len()
            ));
        }
        let tokens: u64 = self.tokens.iter().map(|(_, t)| t).sum();
        if let Some(most) = limits.tokens_per_minute
            && tokens >= u64::from(most)
        {
            return Some(format!("{tokens} of {most} tokens in the last minute"));
        }
        None
    }

    /// A call of `attempt` ended, with its tokens: its place is free.
    /// Returns the attempts whose turn came.
    pub fn ended(
        &mut self,
        attempt: Uuid,
        tokens: u64,
        limits: &ServerLimits,
        now: DateTime<Utc>,
    ) -> Vec<Uuid> {
        if self.in_flight.remove(&attempt).is_some() && tokens > 0 {
            self.tokens.push_back((now, tokens));
        }
        self.serve(limits, now)
    }

    /// `attempt` ended or went elsewhere: its place in flight or in the
    /// queue is given up. Returns the attempts whose turn came.
    pub fn forget(
        &mut self,
        attempt: Uuid,
        limits: &ServerLimits,
        now: DateTime<Utc>,
    ) -> Vec<Uuid> {
        self.in_flight.remove(&attempt);
        for queue in self.waiting.values_mut() {
            queue.retain(|(a, _)| *a != attempt);
        }
        self.drop_empty();
        self.serve(limits, now)
    }

    /// Gives turns while the limits allow, round-robin by tenant: the
    /// attempts whose turn came.
    pub fn serve(&mut self, limits: &ServerLimits, now: DateTime<Utc>) -> Vec<Uuid> {
        self.forget_before(now);
        let mut turns = Vec::new();
        while self.holds(limits).is_none() {
            let Some(tenant) = self.rotation.pop_front() else {
                break;
            };
            let Some(queue) = self.waiting.get_mut(&tenant) else {
                continue;
            };
            let Some((attempt, _)) = queue.pop_front() else {
                continue;
            };
            if !queue.is_empty() {
                self.rotation.push_back(tenant);
            }
            self.in_flight.insert(attempt, Held::Turn);
            turns.push(attempt);
        }
        self.drop_empty();
        turns
    }

    fn drop_empty(&mut self) {
        self.waiting.retain(|_, q| !q.is_empty());
        let waiting = &self.waiting;
        self.rotation.retain(|t| waiting.contains_key(t));
    }

    /// Forgets the requests and tokens older than a minute.
    fn forget_before(&mut self, now: DateTime<Utc>) {
        let since = now - Duration::minutes(1);
        while self.requests.front().is_some_and(|t| *t <= since) {
            self.requests.pop_front();
        }
        while self.tokens.front().is_some_and(|(t, _)| *t <= since) {
            self.tokens.pop_front();
        }
    }

    /// No server of its profile could serve now (`why`): calls wait until
    /// it answers again. Kept from the first failure on.
    pub fn set_down(&mut self, why: String, now: DateTime<Utc>) {
        if self.down.is_none() {
            self.down = Some((now, why));
        }
    }

    /// It answers again: the queue is served. Returns the attempts whose
    /// turn came.
    pub fn set_up(&mut self, limits: &ServerLimits, now: DateTime<Utc>) -> Vec<Uuid> {
        self.down = None;
        self.serve(limits, now)
    }

    /// Since when it is down, if it is.
    pub fn down_since(&self) -> Option<DateTime<Utc>> {
        self.down.as_ref().map(|(t, _)| *t)
    }

    /// Why the waits end, if it has been down longer than `max`
    /// (`runtime.model_outage_max_minutes`): the server as `server` says.
    pub fn outage_over(&self, server: &str, max: Duration, now: DateTime<Utc>) -> Option<String> {
        let since = self.down_since().filter(|since| now - *since > max)?;
        Some(format!(
            "model server {server} did not answer for {} minutes (since {}; runtime.model_outage_max_minutes = {})",
            (now - since).num_minutes(),
            since.format("%Y-%m-%d %H:%M:%S UTC"),
            max.num_minutes()
        ))
    }

    /// Every attempt waiting, forgotten: the outage outlasted their wait.
    pub fn give_up_waiting(&mut self) -> Vec<Uuid> {
        let all: Vec<Uuid> = self.order();
        self.waiting.clear();
        self.rotation.clear();
        all
    }

    /// Whether anyone waits.
    pub fn has_waiting(&self) -> bool {
        !self.rotation.is_empty()
    }

    /// Whether the server holds nothing: no call, no turn, nobody queued.
    pub fn is_idle(&self) -> bool {
        self.in_flight.is_empty() && self.rotation.is_empty() && self.down.is_none()
    }

    /// What the metrics show.
    pub fn gauges(&self, now: DateTime<Utc>) -> Gauges {
        let oldest = self
            .waiting
            .values()
            .filter_map(|q| q.front().map(|(_, t)| *t))
            .min();
        Gauges {
            in_flight: self.in_flight.len(),
            queued: self.waiting.values().map(VecDeque::len).sum(),
            oldest_wait_seconds: oldest
                .map(|t| (now - t).num_milliseconds().max(0) as f64 / 1000.0)
                .unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(n: u32) -> ServerLimits {
        ServerLimits {
            max_concurrent: Some(n),
            ..ServerLimits::default()
        }
    }

    /// Four in flight at most; the fifth waits, says why and where, and
    /// goes when a call ends.
    #[test]
    fn calls_beyond_the_limit_wait_and_go_when_room_is_made() {
        let now = Utc::now();
        let t = TenantId::parse("acme").unwrap();
        let mut q = ServerQueue::default();
        let l = limits(4);
        let ids: Vec<Uuid> = (0..6).map(|_| crate::domain::ids::new_id()).collect();
        for id in &ids[..4] {
            assert_eq!(q.admit(*id, &t, &l, now), Admission::Go);
        }
        let Admission::Wait(w) = q.admit(ids[4], &t, &l, now) else {
            panic!("the fifth waits")
        };
        assert_eq!(w.position, 1);
        assert!(
            w.why("a").contains("4 of 4 calls in flight"),
            "{}",
            w.why("a")
        );
        let Admission::Wait(w) = q.admit(ids[5], &t, &l, now) else {
            panic!("the sixth waits")
        };
        assert_eq!((w.position, w.queued), (2, 2));
        // Asking again keeps its place.
        let Admission::Wait(w) = q.admit(ids[5], &t, &l, now) else {
            panic!("still waits")
        };
        assert_eq!(w.position, 2);
        assert_eq!(q.ended(ids[0], 100, &l, now), vec![ids[4]]);
        // The turn is held for it: nobody else goes in its place.
        assert!(matches!(
            q.admit(crate::domain::ids::new_id(), &t, &l, now),
            Admission::Wait(_)
        ));
        assert_eq!(q.admit(ids[4], &t, &l, now), Admission::Go);
        assert_eq!(q.gauges(now).in_flight, 4);
        // An attempt that ends while queued gives its place up.
        assert_eq!(q.forget(ids[5], &l, now), Vec::<Uuid>::new());
        assert_eq!(q.gauges(now).queued, 1);
    }

    /// A tenant that queues ten times more calls does not get more turns:
    /// turns alternate between the tenants with waiting calls.
    #[test]
    fn the_queue_is_fair_between_tenants() {
        let now = Utc::now();
        let (big, small) = (
            TenantId::parse("big").unwrap(),
            TenantId::parse("small").unwrap(),
        );
        let mut q = ServerQueue::default();
        let l = limits(1);
        let first = crate::domain::ids::new_id();
        assert_eq!(q.admit(first, &big, &l, now), Admission::Go);
        let bigs: Vec<Uuid> = (0..10).map(|_| crate::domain::ids::new_id()).collect();
        for id in &bigs {
            q.admit(*id, &big, &l, now);
        }
        let smalls: Vec<Uuid> = (0..2).map(|_| crate::domain::ids::new_id()).collect();
        for id in &smalls {
            q.admit(*id, &small, &l, now);
        }
        let Some(w) = q.position(smalls[0], &l) else {
            panic!("queued")
        };
        assert_eq!(w.position, 2, "second, after one of the big tenant's");
        let mut served = Vec::new();
        let mut last = first;
        for _ in 0..4 {
            let turn = q.ended(last, 0, &l, now);
            assert_eq!(turn.len(), 1);
            assert_eq!(
                q.admit(turn[0], &TenantId::platform(), &l, now),
                Admission::Go
            );
            served.push(turn[0]);
            last = turn[0];
        }
        assert_eq!(served, vec![bigs[0], smalls[0], bigs[1], smalls[1]]);
    }

    /// A server that is down holds every call, whatever its limits, until
    /// it is up again; then the queue is served.
    #[test]
    fn a_server_that_is_down_holds_every_call_until_it_answers() {
        let now = Utc::now();
        let t = TenantId::parse("acme").unwrap();
        let mut q = ServerQueue::default();
        let l = ServerLimits::default();
        q.set_down("connection refused".into(), now);
        let a = crate::domain::ids::new_id();
        let Admission::Wait(w) = q.admit(a, &t, &l, now) else {
            panic!("waits while the server is down")
        };
        assert!(w.holds.contains("down since") && w.holds.contains("connection refused"));
        assert_eq!(q.down_since(), Some(now));
        assert_eq!(q.outage_over("s", Duration::minutes(30), now), None);
        let over = q
            .outage_over("s", Duration::minutes(30), now + Duration::minutes(31))
            .expect("past the limit");
        assert!(over.contains("did not answer for 31 minutes"), "{over}");
        assert_eq!(q.set_up(&l, now), vec![a]);
        assert_eq!(q.admit(a, &t, &l, now), Admission::Go);
    }

    /// Requests and tokens a minute hold calls until the minute passes.
    #[test]
    fn requests_and_tokens_a_minute_hold_calls_until_the_minute_passes() {
        let now = Utc::now();
        let t = TenantId::parse("acme").unwrap();
        let mut q = ServerQueue::default();
        let l = ServerLimits {
            requests_per_minute: Some(2),
            tokens_per_minute: Some(1000),
            ..ServerLimits::default()
        };
        let (a, b, c) = (
            crate::domain::ids::new_id(),
            crate::domain::ids::new_id(),
            crate::domain::ids::new_id(),
        );
        assert_eq!(q.admit(a, &t, &l, now), Admission::Go);
        assert_eq!(q.admit(b, &t, &l, now), Admission::Go);
        let Admission::Wait(w) = q.admit(c, &t, &l, now) else {
            panic!("the third request of the minute waits")
        };
        assert!(w.holds.contains("2 of 2 requests"), "{}", w.holds);
        assert!(q.ended(a, 1500, &l, now).is_empty());
        assert!(q.serve(&l, now + Duration::seconds(30)).is_empty());
        // A minute later the requests are forgotten, and so are the tokens.
        assert_eq!(q.serve(&l, now + Duration::seconds(61)), vec![c]);
    }
}
