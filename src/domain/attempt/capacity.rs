//! An attempt's capacity: the compute lease it holds or asks for, the
//! run slot its run counts in, the waits during which it gives its compute
//! back (a human, a delegated child run, a pause) and takes it again, and
//! the pauses a failed lease renewal or a used-up `tokensPerDay` cause.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::*;

impl ExecutionAttempt {
    /// Records the capacity lease that was requested for the attempt (or
    /// that replaced a lost one); false when it is the one recorded.
    pub fn use_capacity_lease(&mut self, lease_id: Uuid) -> bool {
        if self.capacity_lease_id == Some(lease_id) {
            return false;
        }
        self.capacity_lease_id = Some(lease_id);
        true
    }

    /// Capacity was granted: the adapter may take the attempt and load the
    /// release, or, after a gap, go on where it stopped.
    pub fn capacity_granted(&mut self, lease_id: Uuid, now: DateTime<Utc>) -> Vec<NewEvent> {
        self.use_capacity_lease(lease_id);
        self.capacity_granted = true;
        if self.state != AttemptState::Claimed {
            if let Some(gap) = self
                .capacity_gaps
                .last_mut()
                .filter(|g| g.granted_at.is_none())
            {
                gap.granted_at = Some(now);
                gap.new_lease_id = Some(lease_id);
            }
            return Vec::new();
        }
        self.set_phase(AttemptPhase::LoadingRelease, now)
    }

    /// The run whose run slot the attempt counts in: its top-level run.
    pub fn run_slot(&self) -> Uuid {
        self.ancestors.last().copied().unwrap_or(self.run_id)
    }

    /// Since when the attempt has made no calls and waits for a human
    /// decision, for a delegated child run, or for its lease to be renewed
    /// (Paused); none otherwise. Its run keeps its run slot meanwhile.
    pub fn idle_since(&self) -> Option<DateTime<Utc>> {
        let waits_for_child = self.state == AttemptState::WaitingForTool
            && self
                .open_call
                .as_ref()
                .is_some_and(|c| c.kind == CallKind::SubAgent);
        if !waits_for_child
            && !matches!(
                self.state,
                AttemptState::WaitingForDecision | AttemptState::Paused
            )
        {
            return None;
        }
        self.phases
            .iter()
            .rev()
            .take_while(|p| p.state == self.state)
            .last()
            .map(|p| p.at)
    }

    /// Gives the capacity lease back while the attempt waits: it is no
    /// longer counted or charged. Returns the lease to release, or none
    /// when the attempt holds none or does not wait.
    pub fn return_capacity(&mut self, reason: String, now: DateTime<Utc>) -> Option<Uuid> {
        self.idle_since()?;
        if !self.capacity_granted {
            return None;
        }
        let lease_id = self.capacity_lease_id.take()?;
        self.capacity_granted = false;
        self.capacity_gaps.push(CapacityGap {
            lease_id,
            returned_at: now,
            reason,
            requested_at: None,
            granted_at: None,
            new_lease_id: None,
        });
        if self.capacity_gaps.len() > HISTORY_LIMIT {
            self.capacity_gaps.remove(0);
        }
        Some(lease_id)
    }

    /// Whether it must ask for capacity now: dispatched and never granted,
    /// or running again after a gap.
    pub fn needs_capacity(&self) -> bool {
        !self.capacity_granted
            && matches!(self.state, AttemptState::Claimed | AttemptState::Running)
    }

    /// It asks for capacity again after a gap.
    pub fn capacity_requested(&mut self, now: DateTime<Utc>) {
        if let Some(gap) = self
            .capacity_gaps
            .last_mut()
            .filter(|g| g.requested_at.is_none())
        {
            gap.requested_at = Some(now);
        }
    }

    /// A lease renewal failed; the attempt pauses at its next checkpoint.
    pub fn renewal_failed(&mut self, why: String) {
        if !self.state.is_terminal() {
            self.renewal_failure = Some(why);
        }
    }

    /// A model call was refused by `limit` (`tokensPerDay`, in the mode
    /// that waits): Running -> Paused until the next UTC day, when the
    /// day's tokens start again, or until the quota allows calls sooner.
    /// No call is in flight. Returns the events and why it waits.
    pub fn pause_for_quota(
        &mut self,
        limit: &impl fmt::Display,
        now: DateTime<Utc>,
    ) -> Result<(Vec<NewEvent>, String), IllegalTransition> {
        if self.state != AttemptState::Running || self.open_call.is_some() {
            return Err(self.illegal("pause for a quota"));
        }
        let mut events = Vec::new();
        let why = self.wait_for_quota(limit, now);
        self.move_to(AttemptState::Paused, self.phase, now, &mut events)?;
        Ok((events, why))
    }

    /// The day turned and `limit` still refuses calls (a limit of 0, or a
    /// day already used up): it waits for the next day.
    pub fn quota_still_out(&mut self, limit: &impl fmt::Display, now: DateTime<Utc>) {
        if self.state == AttemptState::Paused && self.quota_paused_until.is_some() {
            self.wait_for_quota(limit, now);
        }
    }

    /// Waits for `limit` until the next UTC midnight after `now`; says so.
    fn wait_for_quota(&mut self, limit: &impl fmt::Display, now: DateTime<Utc>) -> String {
        let until = (now.date_naive() + chrono::Duration::days(1))
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists")
            .and_utc();
        let why = format!(
            "{limit}: no model call until {} or until the quota allows more (runtime.when_tokens_run_out = wait)",
            until.to_rfc3339()
        );
        self.pause_reason = Some(why.clone());
        self.quota_paused_until = Some(until);
        why
    }

    /// The quota that paused it allows calls again: it runs again, unless
    /// its lease renewal failed meanwhile (then it stays paused for that).
    pub fn quota_resumed(
        &mut self,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        if self.quota_paused_until.take().is_none() {
            return Ok(Vec::new());
        }
        self.run_unless_held(now)
    }

    /// A paused attempt runs again unless something still holds it: a
    /// failed lease renewal (then it says so), its quota, or its turn at a
    /// model server.
    fn run_unless_held(&mut self, now: DateTime<Utc>) -> Result<Vec<NewEvent>, IllegalTransition> {
        let mut events = Vec::new();
        if self.state != AttemptState::Paused {
            return Ok(events);
        }
        if let Some(why) = self.renewal_failure.clone() {
            self.pause_reason = Some(why);
            return Ok(events);
        }
        if self.quota_paused_until.is_some() || self.model_server_wait.is_some() {
            return Ok(events);
        }
        self.pause_reason = None;
        self.move_to(AttemptState::Running, self.phase, now, &mut events)?;
        Ok(events)
    }

    /// The lease was renewed: a paused attempt runs again (one paused by
    /// `tokensPerDay` waits for its quota).
    pub fn renewed(&mut self, now: DateTime<Utc>) -> Result<Vec<NewEvent>, IllegalTransition> {
        self.renewal_failure = None;
        self.run_unless_held(now)
    }

    /// The site's model server its next model call goes to is at its
    /// limits (`why` says which and where the attempt is in its queue):
    /// Running -> Paused until its turn comes, waiting, not active, and
    /// giving its compute back after the usual grace as any pause does.
    /// No call is in flight.
    pub fn wait_for_model_server(
        &mut self,
        server: &str,
        why: String,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        if self.state != AttemptState::Running || self.open_call.is_some() {
            return Err(self.illegal("wait for a model server"));
        }
        let mut events = Vec::new();
        self.pause_reason = Some(why);
        self.model_server_wait = Some(server.to_string());
        self.move_to(AttemptState::Paused, self.phase, now, &mut events)?;
        Ok(events)
    }

    /// Its turn at the model server came: it runs again, unless its lease
    /// renewal failed or its quota ran out meanwhile (then it stays paused
    /// for that).
    pub fn model_server_turn(
        &mut self,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        if self.model_server_wait.take().is_none() {
            return Ok(Vec::new());
        }
        self.run_unless_held(now)
    }

    /// Its model server stayed down past the outage limit while it waited
    /// (`why` says which and for how long): it fails `model-unavailable`
    /// (Paused -> Running -> Failed; no call is in flight).
    pub fn model_outage_over(
        &mut self,
        why: String,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEvent>, IllegalTransition> {
        if self.state != AttemptState::Paused || self.model_server_wait.take().is_none() {
            return Ok(Vec::new());
        }
        let mut events = Vec::new();
        self.pause_reason = None;
        self.move_to(AttemptState::Running, self.phase, now, &mut events)?;
        let failure = AttemptFailure {
            class: FailureClass::ModelUnavailable,
            reason: why,
            feedback_ref: None,
            detail_ref: None,
        };
        events.extend(self.fail(failure, None, now)?);
        Ok(events)
    }
}
