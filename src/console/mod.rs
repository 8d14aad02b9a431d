//! The web console: server-rendered pages over the same services the API
//! uses. Every page works without JavaScript; with it, timelines, queues and
//! pools update over server-sent events that carry server-rendered HTML.
//! Assets come from the binary and the CSP allows nothing else.
//!
//! A page handler takes a [`Console`] (a signed-in session, or a redirect to
//! the sign-in page), checks the scope its data or action needs with
//! [`Console::require`] (a refusal names the roles that would do), reads
//! through the services in the tenant the session looks at, and renders a
//! template whose first field is the [`Layout`]. Every form posts a CSRF
//! token that [`Console::form`] checks before anything else; actions answer
//! with a redirect and a one-time message that says what happened or why not.

mod admin;
mod capacity;
mod decision;
mod live;
mod signin;
mod table;
mod work;

pub use work::export_index;

use std::collections::BTreeSet;

use askama::Template;
use axum::Router;
use axum::extract::{FromRequestParts, RawForm};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use crate::api::AppState;
use crate::api::error::ApiError;
use crate::auth::Principal;
use crate::auth::session::{COOKIE, Flash, Session};
use crate::domain::TenantId;
use crate::domain::access::TenantScope;
use crate::domain::access::{Role, Scope};
use table::Cell;

/// Routes of the console. Their error pages keep the frame
/// ([`framed_errors`]).
pub fn router(state: &AppState) -> Router<AppState> {
    Router::new()
        .route("/", get(work::overview))
        .route("/live/overview", get(live::overview))
        .route("/signin", get(signin::form).post(signin::submit))
        .route("/signout", post(signin::signout))
        .route("/view-tenant", post(signin::view_tenant))
        .route("/account", get(signin::account))
        .route("/account/password", post(signin::change_password))
        .route("/account/email", post(signin::change_email))
        .route("/runs", get(work::runs).post(work::submit_run))
        .route("/runs/new", get(work::run_new))
        .route("/runs/bulk", post(work::bulk_runs))
        .route("/runs/{run_id}", get(work::run))
        .route("/runs/{run_id}/export", get(work::export_run))
        .route("/runs/{run_id}/cancel", post(work::cancel_run))
        .route("/runs/{run_id}/hold", post(work::hold_run))
        .route("/attempts", get(work::attempts))
        .route("/attempts/{attempt_id}", get(work::timeline))
        .route("/attempts/{attempt_id}/live", get(live::timeline))
        .route("/attempts/{attempt_id}/text", get(live::model_text))
        .route("/attempts/{attempt_id}/checkpoints", get(work::checkpoints))
        .route("/attempts/{attempt_id}/rerun", post(work::rerun))
        .route("/attempts/{attempt_id}/interrupt", post(work::interrupt))
        .route(
            "/attempts/{attempt_id}/decisions/{decision_id}",
            get(decision::page).post(work::decide),
        )
        .route("/l/{token}", get(decision::open_link))
        .route(
            "/attempts/{attempt_id}/calls/{call_id}/settle",
            post(work::settle),
        )
        .route("/decisions", get(work::decisions))
        .route("/decisions/bulk", post(work::bulk_decisions))
        .route("/artifacts/{hash}", get(work::artifact))
        .route("/uncertain", get(work::uncertain))
        .route("/webhooks", get(admin::webhooks))
        .route("/audit", get(admin::audit))
        .route("/audit.csv", get(admin::audit_csv))
        .route("/audit.json", get(admin::audit_json))
        .route("/webhooks/{id}", get(admin::webhook))
        .route("/pools", get(capacity::pools))
        .route("/live/pools", get(live::pools))
        .route("/pools/{pool_id}", post(capacity::set_pool))
        .route("/quotas", get(capacity::quotas).post(capacity::set_quota))
        .route("/usage", get(capacity::usage))
        .route("/usage.csv", get(capacity::usage_csv))
        .route("/leases", get(capacity::leases))
        .route("/live/leases", get(live::leases))
        .route(
            "/releases",
            get(admin::releases)
                .post(admin::upload)
                .layer(axum::extract::DefaultBodyLimit::max(
                    // The bundle and the form around it.
                    state.config.releases.max_bundle_bytes as usize + 64 * 1024,
                )),
        )
        .route("/releases/{release_id}", get(admin::release))
        .route("/releases/{release_id}/retire", post(admin::retire))
        .route("/keys", get(admin::keys).post(admin::trust_key))
        .route("/keys/{key_id}/revoke", post(admin::revoke_key))
        .route("/tenants", get(admin::tenants).post(admin::put_tenant))
        .route("/tenants/{tenant_id}/projects", post(admin::put_project))
        .route("/users", get(admin::users).post(admin::create_user))
        .route("/users/email", post(admin::set_email))
        .route("/users/{username}/disable", post(admin::disable_user))
        .route("/users/{username}/enable", post(admin::enable_user))
        .route("/users/{username}/reset", post(admin::reset_password))
        .route("/clients", get(admin::clients).post(admin::create_client))
        .route("/clients/{client_id}/revoke", post(admin::revoke_client))
        .route("/system", get(admin::system))
        .route("/system/workers", post(admin::run_worker))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            framed_errors,
        ))
}

/// What an error page said, for [`framed_errors`].
#[derive(Clone, Debug)]
struct ErrorShown(String);

#[derive(Template)]
#[template(path = "console/error_framed.html")]
struct FramedErrorPage<'a> {
    l: Layout,
    status: u16,
    reason: &'a str,
    message: &'a str,
}

/// A signed-in user's error page (403, 404, 400, ...) keeps the navigation
/// of the pages it may read: the page is rendered again in the frame.
async fn framed_errors(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let cookie = cookie_in(req.headers());
    let response = next.run(req).await;
    let Some(ErrorShown(message)) = response.extensions().get::<ErrorShown>().cloned() else {
        return response;
    };
    let Some((cookie, session)) = cookie.and_then(|c| state.sessions.get(&c).map(|s| (c, s)))
    else {
        return response;
    };
    let status = response.status();
    let reason = status.canonical_reason().unwrap_or("Error");
    let console = Console {
        state,
        session,
        cookie,
        foreign: None,
    };
    let page = FramedErrorPage {
        l: console.layout(format!("{} {reason}", status.as_u16()), ""),
        status: status.as_u16(),
        reason,
        message: &message,
    };
    match page.render() {
        Ok(body) => {
            let (mut parts, _) = response.into_parts();
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, axum::body::Body::from(body))
        }
        Err(_) => response,
    }
}

/// What every page shows around its content.
pub struct Layout {
    /// Page title.
    pub title: String,
    /// The signed-in user, its roles and tenant.
    pub user: Option<UserBar>,
    /// The tenant the pages show.
    pub viewing: String,
    /// Tenants a PlatformAdmin can switch to.
    pub tenants: Vec<String>,
    /// Navigation, filtered by what the user may read.
    pub nav: Vec<NavItem>,
    /// The token every form echoes.
    pub csrf: String,
    /// What the last action did.
    pub flash: Option<Flash>,
    /// Appliance version.
    pub version: &'static str,
    /// SHA-256 fingerprint of the served certificate.
    pub fingerprint: String,
}

/// The signed-in user, as the header shows it.
pub struct UserBar {
    /// User name.
    pub name: String,
    /// Roles, comma-separated.
    pub roles: String,
    /// The user's tenant.
    pub tenant: String,
}

/// One navigation link.
pub struct NavItem {
    /// Target.
    pub href: &'static str,
    /// Label.
    pub label: &'static str,
    /// Whether it is the current page.
    pub active: bool,
}

/// Pages of the navigation and the scope each needs.
const NAV: &[(&str, &str, Scope)] = &[
    ("/", "Overview", Scope::RunsRead),
    ("/runs", "Runs", Scope::RunsRead),
    ("/attempts", "Attempts", Scope::RunsRead),
    ("/decisions", "Decisions", Scope::RunsRead),
    ("/uncertain", "Uncertain", Scope::RunsRead),
    ("/usage", "Usage", Scope::RunsRead),
    ("/pools", "Pools", Scope::CapacityRead),
    ("/quotas", "Quotas", Scope::CapacityRead),
    ("/leases", "Leases", Scope::CapacityRead),
    ("/releases", "Releases", Scope::AssetsRead),
    ("/keys", "Publisher keys", Scope::Platform),
    ("/tenants", "Tenants", Scope::Admin),
    ("/users", "Users", Scope::Admin),
    ("/clients", "Clients", Scope::Admin),
    ("/webhooks", "Webhooks", Scope::Admin),
    ("/audit", "Audit", Scope::Admin),
    ("/system", "System", Scope::Platform),
];

/// A signed-in user's request.
pub struct Console {
    /// The appliance.
    pub state: AppState,
    /// The session.
    pub session: Session,
    cookie: String,
    /// Why the request does not come from the appliance's own pages, when
    /// it does not: a form from there is refused whatever its token.
    foreign: Option<String>,
}

/// Why a request does not come from this appliance's own pages, if it does
/// not: the browser says so (`Sec-Fetch-Site`), or its `Origin` is another
/// site's (or `null`). A request with neither header (a browser of old, a
/// script) is judged by the rest: the session's CSRF token.
pub fn foreign_origin(parts: &Parts) -> Option<String> {
    let headers = &parts.headers;
    // A browser that says where the request comes from is believed: no
    // page can forge the header, and a proxy in front may change Host.
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = String::from_utf8_lossy(site.as_bytes());
        return (!matches!(&*site, "same-origin" | "none"))
            .then(|| format!("Sec-Fetch-Site: {site}"));
    }
    let origin = headers.get(header::ORIGIN)?;
    let here = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.authority().map(|a| a.as_str()))?;
    let same = origin
        .to_str()
        .ok()
        .and_then(|o| o.strip_prefix("https://"))
        .is_some_and(|o| o.eq_ignore_ascii_case(here));
    (!same).then(|| format!("Origin: {}", String::from_utf8_lossy(origin.as_bytes())))
}

fn cookie_of(parts: &Parts) -> Option<String> {
    cookie_in(&parts.headers)
}

fn cookie_in(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

impl FromRequestParts<AppState> for Console {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let session = cookie_of(parts).and_then(|c| state.sessions.get(&c).map(|s| (c, s)));
        match session {
            Some((cookie, session)) => {
                crate::acting::set_actor(&format!("user {}", session.username));
                Ok(Console {
                    state: state.clone(),
                    session,
                    cookie,
                    foreign: foreign_origin(parts),
                })
            }
            None => {
                let next = parts
                    .uri
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or("/");
                // Only GET pages come back after sign-in; a form posted
                // without a session is not replayed.
                let target = if parts.method == axum::http::Method::GET && next != "/" {
                    format!("/signin?next={}", urlencode(next))
                } else {
                    "/signin".to_string()
                };
                Err(Redirect::to(&target).into_response())
            }
        }
    }
}

/// `target` when it is a path of this appliance that is safe to send a
/// browser to (a redirect's `Location`): it starts with a single `/`, holds
/// no control character, whitespace or backslash (browsers drop or rewrite
/// those, so `/\t/evil.example` becomes `//evil.example`), and resolves to
/// the appliance's own origin.
pub fn local_path(target: &str) -> Option<&str> {
    const HERE: &str = "https://appliance.invalid/";
    let shaped = target.starts_with('/')
        && !target.starts_with("//")
        && !target
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '\\');
    let base = url::Url::parse(HERE).expect("a valid base");
    let stays = base.join(target).is_ok_and(|u| u.origin() == base.origin());
    (shaped && stays).then_some(target)
}

/// Percent-encodes a query value.
pub fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("", s)])
        .map(|v| v.trim_start_matches('=').to_string())
        .unwrap_or_default()
}

/// Roles that hold `scope`, for refusals that say who could.
fn roles_with(scope: Scope) -> String {
    Role::ALL
        .iter()
        .filter(|r| r.scopes().contains(&scope))
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Console {
    /// The principal the services see.
    pub fn principal(&self) -> Principal {
        self.session.principal()
    }

    /// Who acts, as records and events name it.
    pub fn by(&self) -> String {
        format!("user {}", self.session.username)
    }

    /// Whether the session is still live (not signed out, disabled or
    /// expired): live updates stop when it is not.
    pub fn signed_in(&self) -> bool {
        self.state.sessions.is_live(&self.cookie)
    }

    /// Whether the user holds `scope`.
    pub fn can(&self, scope: Scope) -> bool {
        self.session.scopes.contains(&scope)
    }

    /// Refuses unless the user holds `scope`, naming the roles that do.
    pub fn require(&self, scope: Scope) -> Result<(), PageError> {
        if self.can(scope) {
            Ok(())
        } else {
            Err(PageError::forbidden(format!(
                "your roles ({}) do not allow this: it needs {} ({}), held by {}",
                self.roles(),
                scope,
                scope_words(scope),
                roles_with(scope)
            )))
        }
    }

    fn roles(&self) -> String {
        self.session
            .roles
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether the user is a PlatformAdmin of the platform tenant.
    pub fn platform_admin(&self) -> bool {
        self.principal().is_platform_admin()
    }

    /// The store scope of the tenant the pages show.
    pub fn scope(&self) -> Result<TenantScope, PageError> {
        Ok(self.principal().scope_for(&self.session.viewing)?)
    }

    /// The tenant the pages show.
    pub fn viewing(&self) -> &TenantId {
        &self.session.viewing
    }

    /// The frame of a page; takes the waiting message.
    pub fn layout(&self, title: impl Into<String>, active: &str) -> Layout {
        let scopes: &BTreeSet<Scope> = &self.session.scopes;
        let tenants = if self.platform_admin() {
            self.state
                .capacity
                .tenants()
                .into_iter()
                .map(|t| t.tenant_id.to_string())
                .collect()
        } else {
            Vec::new()
        };
        Layout {
            title: title.into(),
            user: Some(UserBar {
                name: self.session.display_name.clone(),
                roles: self.roles(),
                tenant: self.session.tenant.to_string(),
            }),
            viewing: self.session.viewing.to_string(),
            tenants,
            nav: NAV
                .iter()
                .filter(|(_, _, scope)| scopes.contains(scope))
                .map(|(href, label, _)| NavItem {
                    href,
                    label,
                    active: *href == active,
                })
                .collect(),
            csrf: self.session.csrf.clone(),
            flash: self.state.sessions.take_flash(&self.cookie),
            version: env!("CARGO_PKG_VERSION"),
            fingerprint: self.state.tls.fingerprint.clone(),
        }
    }

    /// Parses a posted form after checking its CSRF token.
    pub fn form(&self, raw: RawForm) -> Result<Fields, PageError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(&raw.0)
            .map_err(|e| PageError::bad(format!("the form is malformed: {e}")))?;
        let fields = Fields(pairs);
        self.check_csrf(fields.get("csrf").unwrap_or_default())?;
        Ok(fields)
    }

    /// Refuses a form from elsewhere, or whose CSRF token is not this
    /// session's (a multipart upload reads its fields itself).
    pub fn check_csrf(&self, sent: &str) -> Result<(), PageError> {
        if let Some(why) = &self.foreign {
            return Err(PageError::forbidden(format!(
                "forms are accepted from this appliance's own pages only ({why})"
            )));
        }
        if !constant_time_eq(sent.as_bytes(), self.session.csrf.as_bytes()) {
            return Err(PageError::forbidden(
                "the form's CSRF token is missing or stale; reload the page and submit it again",
            ));
        }
        Ok(())
    }

    /// Answers an action: back to `to` with a message saying what happened
    /// or, for an error, what was wrong (field and reason).
    pub fn done<E: Into<ApiError>>(&self, to: &str, result: Result<String, E>) -> Response {
        let flash = match result {
            Ok(text) => Flash {
                ok: true,
                text,
                field: None,
            },
            Err(e) => {
                let e = e.into().finish();
                Flash {
                    ok: false,
                    text: describe(&e),
                    field: e.field.clone(),
                }
            }
        };
        self.state.sessions.flash(&self.cookie, flash);
        Redirect::to(local_path(to).unwrap_or("/")).into_response()
    }
}

/// What an API error says, with the field it names.
pub fn describe(e: &ApiError) -> String {
    match &e.field {
        Some(field) if !e.detail.starts_with(field.as_str()) => format!("{field}: {}", e.detail),
        _ => e.detail.clone(),
    }
}

fn scope_words(scope: Scope) -> &'static str {
    match scope {
        Scope::CapacityRead => "read pools, quotas and leases",
        Scope::CapacityAdmin => "change quotas and pools",
        Scope::CapacityLease => "hold capacity leases",
        Scope::RunsRead => "read runs and timelines",
        Scope::RunsWrite => "submit and cancel runs",
        Scope::RunsDecide => "answer decisions",
        Scope::RunsOperate => "interrupt attempts, settle calls and re-run from checkpoints",
        Scope::RunsExecute => "act as an execution adapter",
        Scope::AssetsRead => "read releases",
        Scope::AssetsAdmin => "deprecate and revoke releases",
        Scope::EventsRead => "read events",
        Scope::MetricsRead => "read metrics",
        Scope::Admin => "manage users and clients",
        Scope::Platform => "act across tenants",
    }
}

/// A duration in seconds, in the largest unit that fits ("3 min", "2 h").
pub fn ago(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s} s"),
        s if s < 7_200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3_600),
        s => format!("{} days", s / 86_400),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The fields of a posted form, in order (a field may repeat).
pub struct Fields(Vec<(String, String)>);

impl Fields {
    /// The first value of `key`, trimmed; `None` when absent or blank.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// Whether the form has `key` at all (blank or not).
    pub fn has(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    /// The value of a required field, or an error naming it.
    pub fn need(&self, key: &str) -> Result<&str, ApiError> {
        self.get(key)
            .ok_or_else(|| ApiError::invalid(key, "is required"))
    }

    /// Every key the form sent.
    pub fn all_keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    /// Every value of `key`.
    pub fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// A page that cannot be shown, as an HTML page with its status.
#[derive(Debug)]
pub struct PageError {
    status: StatusCode,
    message: String,
}

impl PageError {
    /// 403 with the reason.
    pub fn forbidden(message: impl Into<String>) -> Self {
        PageError {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
        }
    }

    /// 400 with the reason.
    pub fn bad(message: impl Into<String>) -> Self {
        PageError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

impl<E: Into<ApiError>> From<E> for PageError {
    fn from(e: E) -> Self {
        let e: ApiError = e.into().finish();
        PageError {
            status: e.code.spec().status,
            message: describe(&e),
        }
    }
}

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage<'a> {
    status: u16,
    reason: &'a str,
    message: &'a str,
    version: &'static str,
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let page = ErrorPage {
            status: self.status.as_u16(),
            reason: self.status.canonical_reason().unwrap_or("Error"),
            message: &self.message,
            version: env!("CARGO_PKG_VERSION"),
        };
        let body = page.render().unwrap_or_else(|_| self.message.clone());
        let mut response = (self.status, Html(body)).into_response();
        response
            .extensions_mut()
            .insert(ErrorShown(self.message.clone()));
        response
    }
}

/// A page that is one table with a sentence above it.
#[derive(Template)]
#[template(path = "console/list.html")]
pub(crate) struct ListPage {
    /// The frame.
    pub l: Layout,
    /// What the table is.
    pub intro: String,
    /// The table.
    pub t: table::Table,
}

/// Renders a page (kept out of caches, as every answer, by the router).
pub fn render<T: Template>(page: &T) -> Result<Response, PageError> {
    let body = page.render().map_err(ApiError::internal)?;
    Ok(Html(body).into_response())
}

/// A count with thousands separated: `43,210`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Short form of a long id or hash for tables: the full text stays in the
/// title attribute.
pub fn short(s: &str) -> String {
    // A UUIDv7 starts with its timestamp, alike for ids made in the same
    // second; its end is random.
    if let Ok(id) = uuid::Uuid::parse_str(s) {
        let hex = id.simple().to_string();
        return format!("…{}", &hex[hex.len() - 8..]);
    }
    let s = s.strip_prefix("sha256:").unwrap_or(s);
    if s.chars().count() > 12 {
        format!("{}…", s.chars().take(12).collect::<String>())
    } else {
        s.to_string()
    }
}

/// A time as the console shows it (seconds, with its zone).
pub fn when(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A time if there is one.
pub fn when_opt(t: &Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.as_ref().map(when).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::local_path;

    #[test]
    fn only_paths_of_the_appliance_are_redirect_targets() {
        for good in [
            "/",
            "/attempts?state=Failed",
            "/runs/abc#top",
            "/%09/x",
            "/a/../b",
        ] {
            assert_eq!(local_path(good), Some(good), "{good:?}");
        }
        for bad in [
            "",
            "x",
            "//evil.example/x",
            "/\t/evil.example/x",
            "/\n/evil.example",
            "/\r\nSet-Cookie: a=b",
            "/\\evil.example",
            "/\\\\evil.example",
            "/ /evil.example",
            "/\u{0}x",
            "/\u{85}x",
            "/\u{2028}x",
            "https://evil.example/",
            "javascript:alert(1)",
            "\t//evil.example",
        ] {
            assert_eq!(local_path(bad), None, "{bad:?}");
        }
    }
}
