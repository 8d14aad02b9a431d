//! Notifications: telling people that a decision waits for them.
//!
//! Each new decision is told, by mail through the site's relay, to the
//! people who may answer it: its assignees when it names some (a user, or
//! everyone with a role), else everyone of its tenant who may decide, each
//! with a mail address. The same words go to chat in the `text` of the
//! `decision.requested` webhook message. Every message carries a link to
//! the decision's page that is:
//!
//! - signed (HMAC-SHA256 with the appliance's link key): a link not made
//!   here, or changed, is refused;
//! - expiring (`notify.link_hours`, never past the decision's expiry);
//! - single-use: the first opening by a signed-in person is recorded, and
//!   a second one is refused (with a plain way to the inbox);
//! - bound to its person when it went by mail: someone else signed in is
//!   refused;
//! - never a decision by itself: opening it shows the page, where the
//!   person signs in and confirms. A mail scanner that follows the link
//!   meets the sign-in page and uses nothing up.

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::TenantId;
use super::access::{Role, Scope};
use super::attempt::{DecisionKind, DecisionRequest};
use super::user::User;
use super::webhook::DeliveryPolicy;

/// The path links open: `/l/<token>`.
pub const LINK_PATH: &str = "/l/";
/// The longest token accepted (a signed token is about 300 characters).
pub const MAX_TOKEN: usize = 1024;

/// What a link to a decision says, signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkClaims {
    /// The decision's tenant.
    #[serde(rename = "t")]
    pub tenant_id: TenantId,
    /// Its attempt.
    #[serde(rename = "a")]
    pub attempt_id: Uuid,
    /// The decision.
    #[serde(rename = "d")]
    pub decision_id: Uuid,
    /// The person it was sent to (mail); none for a chat message, which
    /// anyone of the channel may open.
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Until when it opens (seconds since the epoch).
    #[serde(rename = "e")]
    pub expires: i64,
    /// Its own id: what a use is recorded under.
    #[serde(rename = "n")]
    pub nonce: Uuid,
}

impl LinkClaims {
    /// A link to `d` for `user` (or a channel), made at `now`: it expires
    /// after `hours`, or with the decision if that comes first.
    pub fn new(d: &DecisionRequest, user: Option<&str>, now: DateTime<Utc>, hours: u32) -> Self {
        let until = (now + chrono::Duration::hours(hours.into())).min(d.expires_at);
        LinkClaims {
            tenant_id: d.tenant_id.clone(),
            attempt_id: d.attempt_id,
            decision_id: d.decision_id,
            user: user.map(str::to_string),
            expires: until.timestamp(),
            nonce: super::ids::new_id(),
        }
    }

    /// When it stops opening.
    pub fn expires_at(&self) -> DateTime<Utc> {
        DateTime::from_timestamp(self.expires, 0).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// The decision's page, where the link leads.
    pub fn page(&self) -> String {
        decision_page(self.attempt_id, self.decision_id)
    }

    /// The signed token: `<claims>.<signature>`, both base64url.
    pub fn sign(&self, key: &[u8]) -> String {
        let body = b64().encode(serde_json::to_vec(self).expect("claims serialize"));
        let tag = ring::hmac::sign(&hmac_key(key), body.as_bytes());
        format!("{body}.{}", b64().encode(tag.as_ref()))
    }

    /// Reads a token: its claims when this appliance signed it and it has
    /// not expired at `now`.
    pub fn verify(key: &[u8], token: &str, now: DateTime<Utc>) -> Result<LinkClaims, LinkRefusal> {
        if token.len() > MAX_TOKEN {
            return Err(LinkRefusal::NotOurs);
        }
        let (body, tag) = token.split_once('.').ok_or(LinkRefusal::NotOurs)?;
        let tag = b64().decode(tag).map_err(|_| LinkRefusal::NotOurs)?;
        ring::hmac::verify(&hmac_key(key), body.as_bytes(), &tag)
            .map_err(|_| LinkRefusal::NotOurs)?;
        let claims: LinkClaims = b64()
            .decode(body)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(LinkRefusal::NotOurs)?;
        if claims.expires_at() <= now {
            return Err(LinkRefusal::Expired(claims.expires_at()));
        }
        Ok(claims)
    }
}

/// Why a link does not open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkRefusal {
    /// Not signed here, changed, or not a link at all.
    NotOurs,
    /// Past its time.
    Expired(DateTime<Utc>),
    /// Opened before.
    Used {
        /// When.
        at: DateTime<Utc>,
        /// By whom.
        by: String,
    },
    /// Sent to someone else than who is signed in.
    OtherPerson {
        /// Whom it was sent to.
        sent_to: String,
    },
    /// About a tenant the signed-in person does not see.
    OtherTenant(TenantId),
    /// Its use could not be recorded now (the store); try again.
    Unavailable,
}

impl LinkRefusal {
    /// In words, for the page that says so.
    pub fn words(&self) -> String {
        let at = |t: &DateTime<Utc>| t.format("%Y-%m-%d %H:%M UTC").to_string();
        match self {
            LinkRefusal::NotOurs => {
                "This link was not made by this appliance, or it was changed on the way.".into()
            }
            LinkRefusal::Expired(t) => format!("This link expired at {}.", at(t)),
            LinkRefusal::Used { at: t, by } => format!(
                "This link was already opened, at {} by {by}; a link opens once.",
                at(t)
            ),
            LinkRefusal::OtherPerson { sent_to } => format!(
                "This link was sent to {sent_to}, and you are signed in as someone else: sign out and sign in as {sent_to}."
            ),
            LinkRefusal::OtherTenant(t) => format!(
                "This link is about a decision of tenant {t}, which you do not see: sign in as one of its people."
            ),
            LinkRefusal::Unavailable => {
                "The appliance could not record the link's use just now; open the link again in a moment.".into()
            }
        }
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

fn hmac_key(key: &[u8]) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key)
}

/// The console page of one decision.
pub fn decision_page(attempt_id: Uuid, decision_id: Uuid) -> String {
    format!("/attempts/{attempt_id}/decisions/{decision_id}")
}

/// A recorded opening of a link: a second one is refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkUse {
    /// The link's id.
    pub nonce: Uuid,
    /// The decision's tenant.
    pub tenant_id: TenantId,
    /// Who opened it.
    pub used_by: String,
    /// When.
    pub used_at: DateTime<Utc>,
    /// When the link expires: the record is kept until then.
    pub expires_at: DateTime<Utc>,
}

/// The words of a notification: a subject line and a plain-text body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// One line.
    pub subject: String,
    /// Plain text, the link on a line of its own.
    pub text: String,
}

/// The notification of `d` to one person, with its link.
pub fn message(d: &DecisionRequest, link: &str) -> Message {
    let subject = subject(d);
    let text = format!(
        "{}\n\n{}\nOpen it, sign in and decide:\n{link}\n\nThe link opens once and only for you; it decides nothing by itself.\n",
        subject,
        details(d)
    );
    Message { subject, text }
}

/// The chat message of `d` (the `text` of a `decision.requested` webhook
/// message, which Slack, Mattermost, Rocket.Chat and Google Chat post as
/// it is), with its link.
pub fn chat(d: &DecisionRequest, link: &str) -> String {
    format!(
        "{}\n{}Open it, sign in and decide (the link opens once): {link}",
        subject(d),
        details(d)
    )
}

fn subject(d: &DecisionRequest) -> String {
    let what = match d.kind {
        DecisionKind::Approval => "An approval",
        DecisionKind::Input => "A question",
        DecisionKind::Escalation => "An escalation",
    };
    format!(
        "{what} waits in {}: {}",
        d.tenant_id,
        one_line(&d.summary, 160)
    )
}

/// What is decided, who is asked, until when: one fact a line.
fn details(d: &DecisionRequest) -> String {
    let mut text = String::new();
    if let Some(p) = &d.proposal {
        text.push_str(&format!("Call: {} {}", p.kind.as_str(), p.target));
        if let Some(c) = p.side_effect_class {
            text.push_str(&format!(" ({})", c.as_str()));
        }
        text.push('\n');
    }
    if !d.options.is_empty() {
        text.push_str(&format!("Options: {}\n", d.options.join(", ")));
    }
    if let Some(a) = &d.assignee {
        text.push_str(&format!("For: {}\n", a.words()));
    }
    text.push_str(&format!(
        "Run {} - asked {} - expires {}\n",
        d.run_id,
        d.requested_at.format("%Y-%m-%d %H:%M UTC"),
        d.expires_at.format("%Y-%m-%d %H:%M UTC")
    ));
    text
}

/// `text` cut to one line of at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match line.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
    }
}

/// Who is told of `d`, from the users of its tenant: enabled, with a mail
/// address, allowed to decide, and among its assignees when it names
/// some; at most `max`, by name.
pub fn recipients<'u>(d: &DecisionRequest, users: &'u [User], max: usize) -> Vec<&'u User> {
    let mut chosen: Vec<&User> = users
        .iter()
        .filter(|u| u.tenant_id == d.tenant_id && u.disabled_at.is_none() && u.email.is_some())
        .filter(|u| u.scopes().contains(&Scope::RunsDecide))
        .filter(|u| {
            let roles: Vec<Role> = u.roles.iter().copied().collect();
            d.assignee
                .as_ref()
                .is_none_or(|a| a.includes(&u.username, &roles))
        })
        .collect();
    chosen.sort_by(|a, b| a.username.cmp(&b.username));
    chosen.truncate(max);
    chosen
}

/// Where a mail stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MailState {
    /// Not sent yet; tried again at `nextTryAt`.
    Pending,
    /// The relay took it.
    Sent,
    /// Its tries ran out, or the relay refused it for good.
    GaveUp,
}

/// One try of a mail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MailTry {
    /// When.
    pub at: DateTime<Utc>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Whether the relay called the refusal permanent.
    #[serde(default)]
    pub permanent: bool,
}

/// One mail to one person about one decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mail {
    /// `<attempt>/<decision>/<user name>`: a decision is never mailed
    /// twice to the same person.
    pub mail_id: String,
    /// The decision's tenant.
    pub tenant_id: TenantId,
    /// The decision.
    pub attempt_id: Uuid,
    /// The decision.
    pub decision_id: Uuid,
    /// To whom.
    pub username: String,
    /// At which address.
    pub address: String,
    /// Subject line.
    pub subject: String,
    /// Plain-text body, with the link.
    pub text: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Where it stands.
    pub state: MailState,
    /// When it is tried next, while pending.
    pub next_try_at: Option<DateTime<Utc>>,
    /// Every try, oldest first.
    pub tries: Vec<MailTry>,
}

impl Mail {
    /// Its id: `<attempt>/<decision>/<username>`.
    pub fn key(attempt_id: Uuid, decision_id: Uuid, username: &str) -> String {
        format!("{}{username}", Mail::prefix(attempt_id, decision_id))
    }

    /// The ids of the mails about one decision start with this.
    pub fn prefix(attempt_id: Uuid, decision_id: Uuid) -> String {
        format!("{attempt_id}/{decision_id}/")
    }

    /// Whether it is pending and due at `now`.
    pub fn due(&self, now: DateTime<Utc>) -> bool {
        self.state == MailState::Pending && self.next_try_at.is_some_and(|t| t <= now)
    }

    /// Records a try: sent when it has no error; otherwise given up when
    /// the refusal is permanent or the tries ran out, else pending again
    /// after the policy's delay.
    pub fn record(&mut self, t: MailTry, policy: &DeliveryPolicy) {
        let at = t.at;
        let (failed, permanent) = (t.error.is_some(), t.permanent);
        self.tries.push(t);
        let tries = self.tries.len() as u32;
        (self.state, self.next_try_at) = match (failed, permanent || tries >= policy.max_tries) {
            (false, _) => (MailState::Sent, None),
            (true, true) => (MailState::GaveUp, None),
            (true, false) => {
                let wait = chrono::Duration::from_std(policy.delay(tries))
                    .unwrap_or(chrono::Duration::MAX);
                (MailState::Pending, Some(at + wait))
            }
        };
    }

    /// When it was finished (sent or given up).
    pub fn finished_at(&self) -> Option<DateTime<Utc>> {
        (self.state != MailState::Pending)
            .then(|| self.tries.last().map(|t| t.at))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::access::Assignee;
    use std::collections::BTreeSet;
    use std::time::Duration;

    fn decision(assignee: Option<Assignee>) -> DecisionRequest {
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        DecisionRequest {
            decision_id: Uuid::from_u128(1),
            attempt_id: Uuid::from_u128(2),
            run_id: Uuid::from_u128(3),
            tenant_id: TenantId::parse("acme").unwrap(),
            kind: DecisionKind::Input,
            approval_id: None,
            proposal: None,
            proposal_hash: None,
            question_ref: None,
            summary: "Which customer is this?\nline two".into(),
            options: vec![],
            recommendation: None,
            status: crate::domain::attempt::DecisionStatus::Pending,
            requested_at: now,
            expires_at: now + chrono::Duration::hours(24),
            answered_at: None,
            answered_by: None,
            choice: None,
            answer_ref: None,
            reason: None,
            consumed: false,
            responded: false,
            assignee,
            edited_request_hash: None,
            answer_schema: None,
            tool_call_id: None,
            purged: None,
        }
    }

    fn user(name: &str, roles: &[Role], email: Option<&str>) -> User {
        User {
            username: name.into(),
            tenant_id: TenantId::parse("acme").unwrap(),
            roles: roles.iter().copied().collect::<BTreeSet<_>>(),
            display_name: name.into(),
            password_hash: String::new(),
            created_at: DateTime::from_timestamp(0, 0).unwrap(),
            created_by: "test".into(),
            disabled_at: None,
            email: email.map(str::to_string),
        }
    }

    #[test]
    fn a_link_opens_only_as_signed_and_only_until_it_expires() {
        let key = [7u8; 32];
        let d = decision(None);
        let now = d.requested_at;
        let claims = LinkClaims::new(&d, Some("alice"), now, 2);
        let token = claims.sign(&key);
        assert_eq!(LinkClaims::verify(&key, &token, now), Ok(claims.clone()));
        assert_eq!(claims.page(), decision_page(d.attempt_id, d.decision_id));
        // Another key, a changed claim, a cut token: not ours.
        assert_eq!(
            LinkClaims::verify(&[8u8; 32], &token, now),
            Err(LinkRefusal::NotOurs)
        );
        let (body, tag) = token.split_once('.').unwrap();
        let mut forged = claims.clone();
        forged.user = Some("mallory".into());
        let forged_body = forged.sign(&[0u8; 32]);
        let forged_body = forged_body.split_once('.').unwrap().0;
        assert_eq!(
            LinkClaims::verify(&key, &format!("{forged_body}.{tag}"), now),
            Err(LinkRefusal::NotOurs)
        );
        assert_eq!(
            LinkClaims::verify(&key, body, now),
            Err(LinkRefusal::NotOurs)
        );
        assert_eq!(
            LinkClaims::verify(&key, &"a".repeat(MAX_TOKEN + 1), now),
            Err(LinkRefusal::NotOurs)
        );
        // Two hours on, it has expired.
        let later = now + chrono::Duration::hours(2);
        assert_eq!(
            LinkClaims::verify(&key, &token, later),
            Err(LinkRefusal::Expired(later))
        );
    }

    #[test]
    fn a_link_never_outlives_its_decision() {
        let d = decision(None);
        let claims = LinkClaims::new(&d, None, d.requested_at, 720);
        assert_eq!(claims.expires_at(), d.expires_at);
    }

    #[test]
    fn the_message_names_the_decision_and_carries_the_link_on_its_own_line() {
        let d = decision(Some(Assignee::Role(Role::Reviewer)));
        let m = message(&d, "https://bay.example:8443/l/abc.def");
        assert_eq!(
            m.subject,
            "A question waits in acme: Which customer is this? line two"
        );
        assert!(m.text.contains("\nhttps://bay.example:8443/l/abc.def\n"));
        assert!(m.text.contains("For: anyone with role Reviewer"));
        assert!(!m.subject.contains('\n'));
        let c = chat(&d, "https://bay.example:8443/l/abc.def");
        assert!(c.starts_with(&m.subject));
        assert!(c.ends_with("(the link opens once): https://bay.example:8443/l/abc.def"));
        let long = DecisionRequest {
            summary: "x".repeat(500),
            ..d
        };
        assert_eq!(
            message(&long, "l").subject.chars().count(),
            "A question waits in acme: ".len() + 161
        );
    }

    #[test]
    fn recipients_are_the_assignees_who_may_decide_and_have_an_address() {
        let users = vec![
            user("carol", &[Role::Reviewer], Some("carol@site")),
            user("alice", &[Role::Reviewer], Some("alice@site")),
            user("bob", &[Role::Reviewer], None),
            user("olga", &[Role::Observer], Some("olga@site")),
            user("opal", &[Role::Operator], Some("opal@site")),
        ];
        let names = |d: &DecisionRequest, max| {
            recipients(d, &users, max)
                .iter()
                .map(|u| u.username.as_str())
                .collect::<Vec<_>>()
        };
        // No assignee: everyone who may decide, with an address.
        let anyone = decision(None);
        let deciders: Vec<&str> = names(&anyone, 10);
        assert!(deciders.contains(&"alice") && deciders.contains(&"carol"));
        assert!(!deciders.contains(&"bob") && !deciders.contains(&"olga"));
        assert_eq!(names(&anyone, 1), vec!["alice"]);
        assert_eq!(
            names(&decision(Some(Assignee::User("carol".into()))), 10),
            vec!["carol"]
        );
        assert_eq!(
            names(&decision(Some(Assignee::Role(Role::Reviewer))), 10),
            vec!["alice", "carol"]
        );
        // An assigned Observer still may not decide.
        assert!(names(&decision(Some(Assignee::User("olga".into()))), 10).is_empty());
    }

    #[test]
    fn a_mail_is_tried_until_sent_given_up_or_refused_for_good() {
        let policy = DeliveryPolicy {
            first: Duration::from_secs(30),
            max: Duration::from_secs(3600),
            max_tries: 3,
        };
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let mut mail = Mail {
            mail_id: Mail::key(Uuid::from_u128(1), Uuid::from_u128(2), "alice"),
            tenant_id: TenantId::parse("acme").unwrap(),
            attempt_id: Uuid::nil(),
            decision_id: Uuid::nil(),
            username: "alice".into(),
            address: "alice@site".into(),
            subject: "s".into(),
            text: "t".into(),
            created_at: now,
            state: MailState::Pending,
            next_try_at: Some(now),
            tries: vec![],
        };
        assert_eq!(
            mail.mail_id,
            "00000000-0000-0000-0000-000000000001/00000000-0000-0000-0000-000000000002/alice"
        );
        assert!(mail.due(now));
        let failed = |at, permanent| MailTry {
            at,
            error: Some("421 try later".into()),
            permanent,
        };
        mail.record(failed(now, false), &policy);
        assert_eq!(mail.state, MailState::Pending);
        assert_eq!(mail.next_try_at, Some(now + chrono::Duration::seconds(30)));
        assert!(!mail.due(now));
        let mut refused = mail.clone();
        refused.record(failed(now, true), &policy);
        assert_eq!(refused.state, MailState::GaveUp);
        assert_eq!(refused.finished_at(), Some(now));
        let mut sent = mail.clone();
        sent.record(
            MailTry {
                at: now,
                error: None,
                permanent: false,
            },
            &policy,
        );
        assert_eq!(sent.state, MailState::Sent);
        mail.record(failed(now, false), &policy);
        mail.record(failed(now, false), &policy);
        assert_eq!(mail.state, MailState::GaveUp);
    }
}
