//! One decision's page, and the links to it that notifications carry.

use askama::Template;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};

use super::work::{DecisionView, parse_uuid};
use super::{Console, Layout, PageError, render};
use crate::domain::access::Scope;
use crate::domain::notify::{LinkRefusal, Mail, MailState, decision_page};

#[derive(Template)]
#[template(path = "console/decision.html")]
struct DecisionPage {
    l: Layout,
    dv: DecisionView,
    can_decide: bool,
    /// This page: where a decision made here comes back to.
    back: String,
    /// The run, for the way back to its story.
    run: String,
    /// Who was told by mail, and how it went.
    mails: Vec<MailLine>,
}

/// One mail about the decision, in words.
struct MailLine {
    to: String,
    state: &'static str,
    tone: &'static str,
    detail: String,
}

impl MailLine {
    fn of(m: &Mail) -> MailLine {
        let (state, tone) = match m.state {
            MailState::Pending => ("pending", "warn"),
            MailState::Sent => ("sent", "ok"),
            MailState::GaveUp => ("gave up", "bad"),
        };
        let last = m.tries.last();
        let detail = match (m.state, last) {
            (_, None) => "not tried yet".to_string(),
            (MailState::Sent, Some(t)) => format!("at {}", super::when(&t.at)),
            (_, Some(t)) => format!(
                "{} tr{}; last: {}",
                m.tries.len(),
                if m.tries.len() == 1 { "y" } else { "ies" },
                t.error.clone().unwrap_or_default()
            ),
        };
        MailLine {
            to: format!("{} <{}>", m.username, m.address),
            state,
            tone,
            detail,
        }
    }
}

/// `GET /attempts/{attemptId}/decisions/{decisionId}`: one decision, with
/// its form while it waits, who it is for and who was told.
pub async fn page(
    console: Console,
    Path((attempt_id, decision_id)): Path<(String, String)>,
) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let attempt = parse_uuid("attemptId", &attempt_id)?;
    let decision = parse_uuid("decisionId", &decision_id)?;
    let runtime = &console.state.runtime;
    let d = runtime.decision(&scope, attempt, decision)?;
    let mails = console
        .state
        .notifier
        .mails_of(&scope, &d)?
        .iter()
        .map(MailLine::of)
        .collect();
    let run = format!("/runs/{}", d.run_id);
    render(&DecisionPage {
        l: console.layout("Decision", "/decisions"),
        back: decision_page(attempt, decision),
        run,
        dv: DecisionView::read(runtime, &scope, d),
        can_decide: console.can(Scope::RunsDecide),
        mails,
    })
}

/// `GET /l/{token}`: a link from a notification. Without a session the
/// console's sign-in comes first (and comes back here), so a mail scanner
/// that follows the link uses nothing up. Signed in, the link is checked
/// (ours, unexpired, for this person and a tenant the person sees), its
/// use recorded, and the decision's page opens: the person decides there.
pub async fn open_link(console: Console, Path(token): Path<String>) -> Result<Response, PageError> {
    let principal = console.principal();
    let opened = console
        .state
        .links
        .open_link(&token, &console.session.username, |tenant| {
            principal.scope_for(tenant).is_ok()
        })
        .await;
    match opened {
        Ok(claims) => {
            // A PlatformAdmin looks at the decision's tenant.
            if claims.tenant_id != console.session.tenant {
                console
                    .state
                    .sessions
                    .view_tenant(&console.cookie, claims.tenant_id.clone());
            }
            Ok(Redirect::to(&claims.page()).into_response())
        }
        // Spent or late: the inbox, which lists what still waits.
        Err(why @ (LinkRefusal::Used { .. } | LinkRefusal::Expired(_))) => Ok(console.done(
            "/decisions",
            Err::<String, _>(crate::api::error::ApiError::new(
                crate::api::error::ErrorCode::FailedPrecondition,
                format!("{} The decisions waiting are below.", why.words()),
            )),
        )),
        Err(why @ LinkRefusal::NotOurs) => Err(PageError::bad(why.words())),
        Err(why @ LinkRefusal::Unavailable) => Err(PageError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: why.words(),
        }),
        Err(why) => Err(PageError::forbidden(why.words())),
    }
}
