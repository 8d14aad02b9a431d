//! Sign-in, sign-out and the tenant a PlatformAdmin looks at.

use askama::Template;
use axum::extract::{RawForm, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::table::ListQuery;
use super::{Console, PageError, render};
use crate::api::AppState;
use crate::auth::AuthError;
use crate::auth::session::COOKIE;
use crate::auth::users;
use crate::domain::TenantId;
use crate::domain::access::Role;

#[derive(Template)]
#[template(path = "console/signin.html")]
struct SignInPage<'a> {
    error: Option<String>,
    next: String,
    username: String,
    version: &'static str,
    fingerprint: &'a str,
    ca_fingerprint: Option<&'a str>,
    schema_version: u32,
}

fn page(state: &AppState, error: Option<String>, next: String, username: String) -> SignInPage<'_> {
    SignInPage {
        error,
        next,
        username,
        version: env!("CARGO_PKG_VERSION"),
        fingerprint: &state.tls.fingerprint,
        ca_fingerprint: state.tls.ca_fingerprint.as_deref(),
        schema_version: state.store.schema_version(),
    }
}

/// Only a path of this appliance is a place to go back to; anything else
/// goes to the overview.
fn safe_next(next: Option<&str>) -> String {
    next.and_then(super::local_path).unwrap_or("/").to_string()
}

/// `GET /signin`.
pub async fn form(State(state): State<AppState>, raw: RawQuery) -> Result<Response, PageError> {
    let query = ListQuery::parse(&raw);
    render(&page(
        &state,
        None,
        safe_next(query.get("next")),
        String::new(),
    ))
}

/// `POST /signin`: checks the password (rate-limited per user name) and
/// starts a session. A browser's cross-site post is refused: the sign-in
/// form has no session to carry a CSRF token yet, and another site must not
/// sign a visitor in as someone else.
pub async fn submit(
    State(state): State<AppState>,
    crate::api::conn::Peer(source): crate::api::conn::Peer,
    parts: axum::http::request::Parts,
    raw: RawForm,
) -> Result<Response, PageError> {
    if let Some(why) = super::foreign_origin(&parts) {
        return Err(PageError::forbidden(format!(
            "sign-in forms are accepted from this appliance's own pages only ({why})"
        )));
    }
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(&raw.0).unwrap_or_default();
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    let (username, password, next) = (
        get("username").trim(),
        get("password"),
        safe_next(Some(get("next"))),
    );
    let refuse = |status: StatusCode, message: String| -> Result<Response, PageError> {
        let mut response = render(&page(
            &state,
            Some(message),
            next.clone(),
            crate::domain::user::tried_name(username),
        ))?;
        *response.status_mut() = status;
        Ok(response)
    };
    if username.is_empty() || password.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "user name and password are both required".into(),
        );
    }
    match users::authenticate(&state.store, &state.auth, username, password, source).await {
        Ok(user) => {
            let cookie = state.sessions.start(&user);
            if user.roles.contains(&Role::PlatformAdmin)
                && let Some(tenant) = busiest_tenant(&state)
            {
                state.sessions.view_tenant(&cookie, tenant);
            }
            tracing::info!(user = %user.username, tenant = %user.tenant_id, "console sign-in");
            let actor = format!("user {}", user.username);
            audit_session(&state, &user.tenant_id, &actor, "session.sign-in", None).await?;
            let mut response = Redirect::to(&next).into_response();
            let value = format!("{COOKIE}={cookie}; Path=/; Secure; HttpOnly; SameSite=Strict");
            response.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&value).map_err(crate::api::error::ApiError::internal)?,
            );
            Ok(response)
        }
        Err(AuthError::RateLimited {
            message,
            retry_after,
        }) => {
            tracing::debug!(%source, "console sign-in throttled");
            let mut response = refuse(StatusCode::TOO_MANY_REQUESTS, message)?;
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
            Ok(response)
        }
        Err(e) => {
            // Whose name was tried is not known to be anyone's: the refusal
            // is the platform's to see, counted per source and minute.
            let tried = crate::domain::user::tried_name(username);
            let now = state.clock.now();
            let refusals = state
                .auth
                .refusals
                .refused(source, &tried, &e.to_string(), now);
            crate::auth::refusals::record(&state.store, refusals)
                .await
                .map_err(crate::api::error::ApiError::internal)?;
            refuse(StatusCode::UNAUTHORIZED, e.to_string())
        }
    }
}

/// Records a sign-in, a refused one or a sign-out in the audit trail, as
/// done by `actor` from the request's address.
async fn audit_session(
    state: &AppState,
    tenant: &crate::domain::TenantId,
    actor: &str,
    action: &'static str,
    detail: Option<String>,
) -> Result<(), PageError> {
    use crate::domain::audit::{Change, Origin, Via};
    let (address, via) =
        crate::acting::current_address().unwrap_or(("in-process".into(), Via::Console));
    let origin = Origin {
        actor: actor.to_string(),
        address,
        via,
    };
    let mut change = Change::new(tenant, action, actor.trim_start_matches("user "));
    change.detail = detail;
    let at = state.clock.now();
    state
        .store
        .transact(move |tx| tx.audit_as(&origin, at, change))
        .await
        .map_err(crate::api::error::ApiError::internal)?;
    Ok(())
}

/// `POST /signout`: ends the session and clears the cookie.
pub async fn signout(console: Console, raw: RawForm) -> Result<Response, PageError> {
    console.form(raw)?;
    console.state.sessions.end(&console.cookie);
    let actor = console.by();
    let tenant = console.session.tenant.clone();
    audit_session(&console.state, &tenant, &actor, "session.sign-out", None).await?;
    let mut response = Redirect::to("/signin").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "__Host-agentbay_session=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    Ok(response)
}

/// `POST /view-tenant`: a PlatformAdmin looks at another tenant.
pub async fn view_tenant(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    let tenant = TenantId::parse_field("tenant", fields.need("tenant")?)?;
    console.principal().scope_for(&tenant)?;
    if console.state.capacity.tenant(&tenant).is_none() {
        return Ok(console.done(
            "/",
            Err::<String, _>(crate::domain::FieldError::new(
                "tenant",
                format!("tenant {tenant} is not registered"),
            )),
        ));
    }
    console
        .state
        .sessions
        .view_tenant(&console.cookie, tenant.clone());
    Ok(console.done(
        "/",
        Ok::<_, crate::api::error::ApiError>(format!("now showing tenant {tenant}")),
    ))
}

#[derive(Template)]
#[template(path = "console/account.html")]
struct AccountPage {
    l: super::Layout,
    facts: Vec<(&'static str, String)>,
    /// The user's mail address, empty when none.
    email: String,
}

/// `GET /account`: who is signed in, with which roles, until when; the
/// form to change one's password.
pub async fn account(console: Console) -> Result<Response, PageError> {
    let s = &console.session;
    let sessions = &console.state.sessions;
    let facts = vec![
        ("User", format!("{} ({})", s.username, s.display_name)),
        ("Tenant", s.tenant.to_string()),
        (
            "Roles",
            s.roles
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "Scopes",
            s.scopes
                .iter()
                .map(|x| x.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        ),
        ("Signed in", super::when(&s.created_at)),
        (
            "Session ends",
            format!(
                "{}, or after {} idle minutes",
                super::when(&sessions.ends_at(s)),
                sessions.idle_minutes()
            ),
        ),
    ];
    let email = users::find(&console.state.store, &s.username)
        .map_err(crate::domain::DomainError::from)?
        .and_then(|u| u.email)
        .unwrap_or_default();
    render(&AccountPage {
        l: console.layout("Account", ""),
        facts,
        email,
    })
}

/// `POST /account/password`: the user changes its own password, proving the
/// current one (rate-limited like sign-in); its other sessions end.
pub async fn change_password(
    console: Console,
    crate::api::conn::Peer(source): crate::api::conn::Peer,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    let result = async {
        let current = fields.need("current")?;
        let new = fields.need("password")?;
        if fields.get("repeat") != Some(new) {
            return Err(crate::api::error::ApiError::invalid(
                "repeat",
                "does not match the new password",
            ));
        }
        let state = &console.state;
        users::authenticate(
            &state.store,
            &state.auth,
            &console.session.username,
            current,
            source,
        )
        .await
        .map_err(|e| crate::api::error::ApiError::invalid("current", e.to_string()))?;
        users::set_password(
            &state.store,
            &console.principal().actor(),
            crate::domain::access::TenantScope::new(console.session.tenant.clone()),
            &console.session.username,
            new,
            state.clock.now(),
        )
        .await?;
        state
            .sessions
            .end_user_except(&console.session.username, &console.cookie);
        Ok("password changed; your other sessions have ended".to_string())
    }
    .await;
    Ok(console.done("/account", result))
}

/// `POST /account/email`: sets or clears the signed-in user's own mail
/// address.
pub async fn change_email(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    let state = &console.state;
    let result = users::set_email(
        &state.store,
        &console.principal().actor(),
        crate::domain::access::TenantScope::new(console.session.tenant.clone()),
        &console.session.username,
        fields.get("email").unwrap_or_default().trim(),
        state.clock.now(),
    )
    .await
    .map(|u| match u.email {
        Some(e) => format!("decisions waiting for you are mailed to {e}"),
        None => "no mail address: you are not mailed".to_string(),
    });
    Ok(console.done("/account", result))
}

/// Where a PlatformAdmin lands: the tenant with the newest run (the
/// platform's own tenant runs nothing), or its own when no tenant has run
/// anything yet.
fn busiest_tenant(state: &AppState) -> Option<crate::domain::TenantId> {
    state
        .capacity
        .tenants()
        .into_iter()
        .filter_map(|t| {
            let scope = crate::domain::access::TenantScope::new(t.tenant_id.clone());
            let newest = state
                .runs
                .list(&scope, &crate::runs::RunFilter::default(), None, 1)
                .ok()?
                .into_iter()
                .next()?;
            Some((newest.created_at, t.tenant_id))
        })
        .max_by_key(|(at, _)| *at)
        .map(|(_, tenant)| tenant)
}
