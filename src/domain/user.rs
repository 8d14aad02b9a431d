//! Console users: people who sign in to the web console.
//!
//! A user belongs to one tenant and holds roles there; each role stands for
//! a set of scopes ([`Role::scopes`]). Only a user of the platform tenant may
//! hold PlatformAdmin, the one role that crosses tenants. User names are
//! unique across the appliance, so signing in needs no tenant. The password
//! is never stored, only its argon2id hash.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::access::{Role, Scope};
use super::error::{DomainError, FieldError};
use super::events::{EventPayload, NewEvent};
use super::ids::TenantId;

/// A console user as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// The sign-in name, unique across the appliance.
    pub username: String,
    /// The tenant the user acts in.
    pub tenant_id: TenantId,
    /// Roles in that tenant.
    pub roles: BTreeSet<Role>,
    /// Name shown to people.
    pub display_name: String,
    /// argon2id PHC string of the password.
    pub password_hash: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Who created it.
    pub created_by: String,
    /// When it was disabled; a disabled user cannot sign in.
    #[serde(default)]
    pub disabled_at: Option<DateTime<Utc>>,
    /// Where mail reaches the user: decisions waiting for them are told
    /// there (`[notify.smtp]`). None: no mail.
    #[serde(default)]
    pub email: Option<String>,
}

/// Payload of `agentbay.admin.v1.user-created`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserCreated<'a> {
    /// The user.
    pub username: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Its roles.
    pub roles: &'a BTreeSet<Role>,
    /// Who created it.
    pub created_by: &'a str,
}

impl EventPayload for UserCreated<'_> {
    const TOPIC: &'static str = "agentbay.admin.v1.user-created";
}

/// Payload of `agentbay.admin.v1.user-disabled`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserDisabled<'a> {
    /// The user.
    pub username: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Who disabled it.
    pub by: &'a str,
}

impl EventPayload for UserDisabled<'_> {
    const TOPIC: &'static str = "agentbay.admin.v1.user-disabled";
}

/// Payload of `agentbay.admin.v1.user-enabled`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserEnabled<'a> {
    /// The user.
    pub username: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Who enabled it again.
    pub by: &'a str,
}

impl EventPayload for UserEnabled<'_> {
    const TOPIC: &'static str = "agentbay.admin.v1.user-enabled";
}

/// Payload of `agentbay.admin.v1.user-password-changed`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserPasswordChanged<'a> {
    /// The user.
    pub username: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Who changed it: the user, or an administrator who reset it.
    pub by: &'a str,
}

impl EventPayload for UserPasswordChanged<'_> {
    const TOPIC: &'static str = "agentbay.admin.v1.user-password-changed";
}

/// Payload of `agentbay.admin.v1.user-email-set`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserEmailSet<'a> {
    /// The user.
    pub username: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Whether it has an address now (the address is not in the event).
    pub has_email: bool,
    /// Who set it.
    pub by: &'a str,
}

impl EventPayload for UserEmailSet<'_> {
    const TOPIC: &'static str = "agentbay.admin.v1.user-email-set";
}

/// Longest mail address accepted (RFC 5321's path limit): a local part of
/// at most 64 characters, a domain of at most 189.
pub const MAX_EMAIL_LEN: usize = 254;

/// The published form of a mail address (the API's contract says the same
/// pattern): `local@domain`, neither with a space, control character or
/// `@ < > , ;`, the domain not starting or ending with a dot.
pub const EMAIL_PATTERN: &str = "^[^\\s\\x00-\\x1f\\x7f-\\x9f@<>,;]{1,64}@[^\\s\\x00-\\x1f\\x7f-\\x9f@<>,;.]([^\\s\\x00-\\x1f\\x7f-\\x9f@<>,;]{0,187}[^\\s\\x00-\\x1f\\x7f-\\x9f@<>,;.])?$";

/// Checks a mail address: exactly [`EMAIL_PATTERN`]. Empty is no address.
pub fn parse_email(field: &str, text: &str) -> Result<Option<String>, FieldError> {
    if text.is_empty() {
        return Ok(None);
    }
    let fits = |part: &str, max: usize| {
        (1..=max).contains(&part.chars().count())
            && !part.chars().any(|c| {
                c.is_control() || c.is_whitespace() || matches!(c, '@' | '<' | '>' | ',' | ';')
            })
    };
    let shaped = text.split_once('@').is_some_and(|(local, domain)| {
        fits(local, 64) && fits(domain, 189) && !domain.starts_with('.') && !domain.ends_with('.')
    });
    if shaped {
        Ok(Some(text.to_string()))
    } else {
        Err(FieldError::new(
            field,
            format!(
                "{text:?} is not a mail address (name@domain: at most 64 characters before the @, 189 after)"
            ),
        ))
    }
}

/// Shortest password accepted.
pub const MIN_PASSWORD_LEN: usize = 12;
/// Longest password accepted (argon2 takes any length; this bounds the work).
pub const MAX_PASSWORD_LEN: usize = 256;

/// Checks a user name: 3 to 64 of `a-z 0-9 . _ -`, starting with a letter or
/// digit (exactly: the API's contract says the same pattern). Signing in
/// is forgiving instead: [`sign_in_name`].
pub fn parse_username(name: &str) -> Result<String, FieldError> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
    let ok_start = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric());
    if !(3..=MAX_USERNAME_LEN).contains(&name.len()) || !ok_chars || !ok_start {
        return Err(FieldError::new(
            "username",
            format!(
                "{name:?} is not a user name: use 3 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
            ),
        ));
    }
    Ok(name.to_string())
}

/// The published form of a user name: exactly [`parse_username`]'s rule
/// (the API's contract says the same pattern).
pub const USERNAME_PATTERN: &str = "^[a-z0-9][a-z0-9._-]{2,63}$";

/// The user name a person typed at sign-in, trimmed and lower-cased.
pub fn sign_in_name(typed: &str) -> String {
    typed.trim().to_ascii_lowercase()
}

/// Longest user name ([`parse_username`]).
pub const MAX_USERNAME_LEN: usize = 64;

/// A name typed at sign-in as records, counters and the refusal page keep
/// it, whatever was sent: trimmed and lower-cased, its first
/// [`MAX_USERNAME_LEN`] characters (no account's name is longer), control
/// characters shown as `?`.
pub fn tried_name(typed: &str) -> String {
    typed
        .trim()
        .chars()
        .take(MAX_USERNAME_LEN)
        .map(|c| {
            if c.is_control() {
                '?'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// Checks a new password's length.
pub fn check_password(password: &str) -> Result<(), FieldError> {
    let len = password.chars().count();
    if len < MIN_PASSWORD_LEN {
        return Err(FieldError::new(
            "password",
            format!("is {len} characters long; at least {MIN_PASSWORD_LEN} are required"),
        ));
    }
    if len > MAX_PASSWORD_LEN {
        return Err(FieldError::new(
            "password",
            format!("is longer than {MAX_PASSWORD_LEN} characters"),
        ));
    }
    Ok(())
}

impl User {
    /// A new user. Roles must not be empty; PlatformAdmin stays in the
    /// platform tenant.
    pub fn create(
        tenant_id: TenantId,
        username: &str,
        display_name: &str,
        roles: BTreeSet<Role>,
        password_hash: String,
        created_by: &str,
        now: DateTime<Utc>,
    ) -> Result<(User, NewEvent), DomainError> {
        let username = parse_username(username)?;
        if roles.is_empty() {
            return Err(FieldError::new("roles", "at least one role is required").into());
        }
        if roles.contains(&Role::PlatformAdmin) && !tenant_id.is_platform() {
            return Err(FieldError::new(
                "roles",
                format!(
                    "PlatformAdmin can only be held by users of the platform tenant, not of {tenant_id}"
                ),
            )
            .into());
        }
        let display_name = display_name.trim();
        if display_name.chars().count() > 100 {
            return Err(FieldError::new("displayName", "is longer than 100 characters").into());
        }
        let user = User {
            display_name: if display_name.is_empty() {
                username.clone()
            } else {
                display_name.to_string()
            },
            username,
            tenant_id,
            roles,
            password_hash,
            created_at: now,
            created_by: created_by.to_string(),
            disabled_at: None,
            email: None,
        };
        let event = NewEvent::new(
            &user.tenant_id,
            now,
            &UserCreated {
                username: &user.username,
                tenant_id: &user.tenant_id,
                roles: &user.roles,
                created_by,
            },
        );
        Ok((user, event))
    }

    /// Disables the user. Disabling twice emits nothing the second time.
    pub fn disable(&mut self, by: &str, now: DateTime<Utc>) -> Option<NewEvent> {
        if self.disabled_at.is_some() {
            return None;
        }
        self.disabled_at = Some(now);
        Some(NewEvent::new(
            &self.tenant_id,
            now,
            &UserDisabled {
                username: &self.username,
                tenant_id: &self.tenant_id,
                by,
            },
        ))
    }

    /// Enables a disabled user again. Enabling an enabled user emits
    /// nothing.
    pub fn enable(&mut self, by: &str, now: DateTime<Utc>) -> Option<NewEvent> {
        self.disabled_at?;
        self.disabled_at = None;
        Some(NewEvent::new(
            &self.tenant_id,
            now,
            &UserEnabled {
                username: &self.username,
                tenant_id: &self.tenant_id,
                by,
            },
        ))
    }

    /// Whether it is an active PlatformAdmin user.
    pub fn is_active_platform_admin(&self) -> bool {
        self.disabled_at.is_none() && self.roles.contains(&Role::PlatformAdmin)
    }

    /// Refuses to disable the last active PlatformAdmin user, so that the
    /// console stays manageable. `platform` holds the users of the platform
    /// tenant.
    pub fn check_disablable(&self, platform: &[User]) -> Result<(), DomainError> {
        let others = platform
            .iter()
            .filter(|u| u.username != self.username && u.is_active_platform_admin())
            .count();
        if self.is_active_platform_admin() && others == 0 {
            return Err(DomainError::FailedPrecondition(format!(
                "user {} is the last active PlatformAdmin user; create or enable another PlatformAdmin user first",
                self.username
            )));
        }
        Ok(())
    }

    /// Replaces the password hash. A disabled user keeps its password: it
    /// cannot sign in anyway.
    pub fn set_password(&mut self, hash: String, by: &str, now: DateTime<Utc>) -> NewEvent {
        self.password_hash = hash;
        NewEvent::new(
            &self.tenant_id,
            now,
            &UserPasswordChanged {
                username: &self.username,
                tenant_id: &self.tenant_id,
                by,
            },
        )
    }

    /// Sets or clears the mail address; the same address again emits
    /// nothing.
    pub fn set_email(
        &mut self,
        email: Option<String>,
        by: &str,
        now: DateTime<Utc>,
    ) -> Option<NewEvent> {
        if self.email == email {
            return None;
        }
        self.email = email;
        Some(NewEvent::new(
            &self.tenant_id,
            now,
            &UserEmailSet {
                username: &self.username,
                tenant_id: &self.tenant_id,
                has_email: self.email.is_some(),
                by,
            },
        ))
    }

    /// The scopes the user's roles stand for.
    pub fn scopes(&self) -> BTreeSet<Scope> {
        self.roles.iter().flat_map(|r| r.scopes()).collect()
    }
}

/// Parses role names (`Reviewer`, `reviewer`), naming the field on error.
pub fn parse_roles<S: AsRef<str>>(names: &[S]) -> Result<BTreeSet<Role>, FieldError> {
    names
        .iter()
        .map(|n| {
            let n = n.as_ref().trim();
            Role::ALL
                .iter()
                .copied()
                .find(|r| r.as_str().eq_ignore_ascii_case(n))
                .ok_or_else(|| {
                    let known: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
                    FieldError::new(
                        "roles",
                        format!("unknown role {n:?}; roles are {}", known.join(", ")),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mail_addresses_are_checked_and_named() {
        assert_eq!(
            parse_email("email", "ana@site.example"),
            Ok(Some("ana@site.example".into()))
        );
        // The published pattern, as a JSON Schema validator reads it.
        let schema = serde_json::json!({"type": "string", "pattern": EMAIL_PATTERN});
        let validator = jsonschema::validator_for(&schema).unwrap();
        let pattern = |text: &str| validator.is_valid(&serde_json::json!(text));
        assert!(pattern("ana@site.example"));
        assert_eq!(parse_email("email", ""), Ok(None));
        for bad in [
            "ana",
            "@site",
            "ana@",
            "ana@@site",
            "a na@site",
            "ana@site.",
            "Ana <ana@site>",
            "a@b,c@d",
            " ana@site",
            "ana@.site",
        ] {
            assert!(!pattern(bad), "{bad}");
            let e = parse_email("email", bad).unwrap_err();
            assert_eq!(e.field, "email", "{bad}");
            assert!(e.reason.contains("is not a mail address"), "{bad}");
        }
        for long in [
            format!("{}@site", "a".repeat(65)),
            format!("a@{}", "b".repeat(190)),
        ] {
            assert!(parse_email("email", &long).is_err());
            assert!(!pattern(&long));
        }
        let names = jsonschema::validator_for(
            &serde_json::json!({"type": "string", "pattern": USERNAME_PATTERN}),
        )
        .unwrap();
        for name in ["alice.b", "a-1", "Alice", "ab", "-ab", &"a".repeat(65)] {
            assert_eq!(
                names.is_valid(&serde_json::json!(name)),
                parse_username(name).is_ok(),
                "{name}"
            );
        }
        let longest = format!("{}@{}", "a".repeat(64), "b".repeat(189));
        assert_eq!(longest.len(), MAX_EMAIL_LEN);
        assert!(parse_email("email", &longest).is_ok() && pattern(&longest));
    }

    fn acme() -> TenantId {
        TenantId::parse("acme").unwrap()
    }

    #[test]
    fn user_names_are_checked_and_normalised() {
        assert_eq!(parse_username("alice.b").unwrap(), "alice.b");
        assert_eq!(
            parse_username(&sign_in_name(" Alice.B ")).unwrap(),
            "alice.b"
        );
        for bad in [
            " alice",
            "Alice",
            "ab",
            "-x-y",
            "a b c",
            "é-user",
            &"a".repeat(65),
        ] {
            let err = parse_username(bad).unwrap_err();
            assert_eq!(err.field, "username", "{bad}");
        }
    }

    #[test]
    fn passwords_need_twelve_characters() {
        let err = check_password("short").unwrap_err();
        assert_eq!(err.field, "password");
        assert!(err.reason.contains("at least 12"), "{}", err.reason);
        assert!(check_password("correct horse battery").is_ok());
    }

    #[test]
    fn platform_admin_stays_in_the_platform_tenant() {
        let now = Utc::now();
        let err = User::create(
            acme(),
            "mallory",
            "",
            [Role::PlatformAdmin].into(),
            "h".into(),
            "admin",
            now,
        )
        .unwrap_err();
        assert!(err.to_string().contains("PlatformAdmin"), "{err}");
        let (user, event) = User::create(
            acme(),
            "rita",
            "Rita R.",
            [Role::Reviewer, Role::Observer].into(),
            "h".into(),
            "admin",
            now,
        )
        .unwrap();
        assert_eq!(event.topic, "agentbay.admin.v1.user-created");
        assert!(user.scopes().contains(&Scope::RunsDecide));
        assert!(!user.scopes().contains(&Scope::CapacityAdmin));
        let empty = User::create(acme(), "nobody", "", BTreeSet::new(), "h".into(), "a", now);
        assert!(empty.unwrap_err().to_string().contains("roles"));
    }

    #[test]
    fn roles_parse_by_name() {
        let roles = parse_roles(&["reviewer", "Operator"]).unwrap();
        assert_eq!(roles, [Role::Reviewer, Role::Operator].into());
        let err = parse_roles(&["Boss"]).unwrap_err();
        assert!(err.reason.contains("WorkspaceAdmin"), "{}", err.reason);
    }

    #[test]
    fn disabling_twice_emits_once() {
        let now = Utc::now();
        let (mut user, _) = User::create(
            acme(),
            "otto",
            "",
            [Role::Operator].into(),
            "h".into(),
            "a",
            now,
        )
        .unwrap();
        assert!(user.disable("admin", now).is_some());
        assert!(user.disable("admin", now).is_none());
    }
}
