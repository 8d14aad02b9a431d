//! Console sessions: a signed-in user's cookie, its CSRF token, the tenant
//! it looks at and the one message to show after a form.
//!
//! Sessions live in memory, keyed by the SHA-256 of the cookie value (the
//! cookie itself is never kept), and end after `auth.session_idle_minutes`
//! without a request or `auth.session_max_hours` after sign-in, on the
//! appliance clock. A restart signs everyone out; disabling a user ends its
//! sessions at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::token::random_token;
use super::{Principal, Subject};
use crate::clock::SharedClock;
use crate::config::{AuthConfig, Live};
use crate::domain::TenantId;
use crate::domain::access::{Role, Scope};
use crate::domain::user::User;

/// Name of the session cookie. The `__Host-` prefix makes browsers refuse it
/// unless it is Secure, has no Domain and has Path=/.
pub const COOKIE: &str = "__Host-agentbay_session";

/// A message for the next page: what a form did, or why it was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flash {
    /// Whether it reports a success.
    pub ok: bool,
    /// The message.
    pub text: String,
    /// The form field a refusal names (camelCase, as the form's input is
    /// named): the page shows the reason beside it.
    pub field: Option<String>,
}

/// A signed-in user.
#[derive(Clone, Debug)]
pub struct Session {
    /// The user's name.
    pub username: String,
    /// The user's name as shown.
    pub display_name: String,
    /// The user's tenant.
    pub tenant: TenantId,
    /// The user's roles there.
    pub roles: BTreeSet<Role>,
    /// The scopes those roles stand for.
    pub scopes: BTreeSet<Scope>,
    /// The token every form must echo.
    pub csrf: String,
    /// The tenant the pages show; another than `tenant` only for a
    /// PlatformAdmin.
    pub viewing: TenantId,
    /// When the user signed in.
    pub created_at: DateTime<Utc>,
    /// The last request.
    pub seen_at: DateTime<Utc>,
}

impl Session {
    /// The principal the services see.
    pub fn principal(&self) -> Principal {
        Principal {
            subject: Subject::User(self.username.clone()),
            tenant: self.tenant.clone(),
            scopes: self.scopes.clone(),
        }
    }
}

struct Entry {
    session: Session,
    flash: Option<Flash>,
}

/// Every live session.
pub struct Sessions {
    clock: SharedClock,
    config: Live<AuthConfig>,
    live: Mutex<HashMap<[u8; 32], Entry>>,
}

fn key(cookie: &str) -> [u8; 32] {
    Sha256::digest(cookie.as_bytes()).into()
}

impl Sessions {
    /// Sessions that end after `auth.session_idle_minutes` idle or
    /// `auth.session_max_hours` in all, as configured now (a reload
    /// applies to live sessions too).
    pub fn new(clock: SharedClock, config: Live<AuthConfig>) -> Arc<Sessions> {
        Arc::new(Sessions {
            clock,
            config,
            live: Mutex::new(HashMap::new()),
        })
    }

    /// Starts a session for `user`; returns the cookie value.
    pub fn start(&self, user: &User) -> String {
        let now = self.clock.now();
        let cookie = random_token();
        let session = Session {
            username: user.username.clone(),
            display_name: user.display_name.clone(),
            tenant: user.tenant_id.clone(),
            roles: user.roles.clone(),
            scopes: user.scopes(),
            csrf: random_token(),
            viewing: user.tenant_id.clone(),
            created_at: now,
            seen_at: now,
        };
        let mut live = self.live.lock();
        live.retain(|_, e| self.alive(&e.session, now));
        live.insert(
            key(&cookie),
            Entry {
                session,
                flash: None,
            },
        );
        cookie
    }

    fn alive(&self, s: &Session, now: DateTime<Utc>) -> bool {
        self.ends_at(s) > now
    }

    /// When a session ends unless it is used again before then.
    pub fn ends_at(&self, s: &Session) -> DateTime<Utc> {
        let config = self.config.get();
        let idle_end = s.seen_at + Duration::minutes(config.session_idle_minutes as i64);
        let hard_end = s.created_at + Duration::hours(config.session_max_hours as i64);
        idle_end.min(hard_end)
    }

    /// Minutes without a request after which a session ends.
    pub fn idle_minutes(&self) -> u64 {
        self.config.get().session_idle_minutes
    }

    /// The session of a cookie, touched; `None` when unknown or expired.
    pub fn get(&self, cookie: &str) -> Option<Session> {
        let now = self.clock.now();
        let mut live = self.live.lock();
        let k = key(cookie);
        let entry = live.get_mut(&k)?;
        if !self.alive(&entry.session, now) {
            live.remove(&k);
            return None;
        }
        entry.session.seen_at = now;
        Some(entry.session.clone())
    }

    /// Whether the session of a cookie is still live, without counting as
    /// activity: a page left open with live updates does not keep its
    /// session from ending.
    pub fn is_live(&self, cookie: &str) -> bool {
        let now = self.clock.now();
        self.live
            .lock()
            .get(&key(cookie))
            .is_some_and(|e| self.alive(&e.session, now))
    }

    /// Takes the message waiting for the session's next page.
    pub fn take_flash(&self, cookie: &str) -> Option<Flash> {
        self.live.lock().get_mut(&key(cookie))?.flash.take()
    }

    /// Leaves a message for the session's next page.
    pub fn flash(&self, cookie: &str, flash: Flash) {
        if let Some(e) = self.live.lock().get_mut(&key(cookie)) {
            e.flash = Some(flash);
        }
    }

    /// Points the session's pages at another tenant.
    pub fn view_tenant(&self, cookie: &str, tenant: TenantId) {
        if let Some(e) = self.live.lock().get_mut(&key(cookie)) {
            e.session.viewing = tenant;
        }
    }

    /// Ends one session.
    pub fn end(&self, cookie: &str) {
        self.live.lock().remove(&key(cookie));
    }

    /// Ends every session of a user but the one of `cookie`.
    pub fn end_user_except(&self, username: &str, cookie: &str) {
        let keep = key(cookie);
        self.live
            .lock()
            .retain(|k, e| *k == keep || e.session.username != username);
    }

    /// Ends every session of a user.
    pub fn end_user(&self, username: &str) {
        self.live
            .lock()
            .retain(|_, e| e.session.username != username);
    }

    /// Number of live sessions.
    pub fn count(&self) -> usize {
        let now = self.clock.now();
        self.live
            .lock()
            .values()
            .filter(|e| self.alive(&e.session, now))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn user(name: &str) -> User {
        User::create(
            TenantId::parse("acme").unwrap(),
            name,
            "",
            [Role::Reviewer].into(),
            "h".into(),
            "t",
            Utc::now(),
        )
        .unwrap()
        .0
    }

    fn lifetimes(idle_minutes: u64, max_hours: u64) -> Live<AuthConfig> {
        Live::new(AuthConfig {
            session_idle_minutes: idle_minutes,
            session_max_hours: max_hours,
            ..AuthConfig::default()
        })
    }

    #[test]
    fn sessions_end_when_idle_or_old() {
        let clock = ManualClock::new(Utc::now());
        let sessions = Sessions::new(clock.clone(), lifetimes(30, 1));
        let cookie = sessions.start(&user("rita"));
        let s = sessions.get(&cookie).unwrap();
        assert!(s.scopes.contains(&Scope::RunsDecide));
        assert_ne!(s.csrf, cookie);
        assert!(sessions.get("forged").is_none());
        clock.advance(std::time::Duration::from_secs(29 * 60));
        assert!(
            sessions.get(&cookie).is_some(),
            "touched within the idle time"
        );
        clock.advance(std::time::Duration::from_secs(29 * 60));
        assert!(sessions.get(&cookie).is_some());
        clock.advance(std::time::Duration::from_secs(3 * 60));
        assert!(sessions.get(&cookie).is_none(), "past the absolute hour");

        let cookie = sessions.start(&user("rita"));
        clock.advance(std::time::Duration::from_secs(31 * 60));
        assert!(sessions.get(&cookie).is_none(), "idle too long");
    }

    #[test]
    fn a_reloaded_idle_time_applies_to_live_sessions() {
        let clock = ManualClock::new(Utc::now());
        let config = lifetimes(30, 12);
        let sessions = Sessions::new(clock.clone(), config.clone());
        let cookie = sessions.start(&user("rita"));
        clock.advance(std::time::Duration::from_secs(10 * 60));
        assert!(sessions.get(&cookie).is_some());
        config.set(AuthConfig {
            session_idle_minutes: 5,
            ..AuthConfig::default()
        });
        clock.advance(std::time::Duration::from_secs(6 * 60));
        assert!(sessions.get(&cookie).is_none(), "idle past the new limit");
    }

    #[test]
    fn flashes_are_shown_once_and_users_are_signed_out() {
        let clock = ManualClock::new(Utc::now());
        let sessions = Sessions::new(clock, lifetimes(30, 12));
        let cookie = sessions.start(&user("otto"));
        sessions.flash(
            &cookie,
            Flash {
                ok: true,
                text: "done".into(),
                field: None,
            },
        );
        assert_eq!(sessions.take_flash(&cookie).unwrap().text, "done");
        assert!(sessions.take_flash(&cookie).is_none());
        assert!(sessions.is_live(&cookie));
        sessions.end_user("otto");
        assert!(!sessions.is_live(&cookie));
        assert!(sessions.get(&cookie).is_none());
        assert_eq!(sessions.count(), 0);
    }
}
