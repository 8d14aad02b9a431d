//! HTTP: the REST routes of the specifications, the RPC services, the event
//! stream, probes and the console, on one HTTPS listener.
//!
//! [`router`] builds everything from an [`AppState`] and is served by
//! `app`; tests can drive it in-process too. Paths that look like RPC
//! (`/agentbay.<package>.<Service>/<Method>`) go to the Connect service;
//! anything else unmatched gets a problem+json 404.

pub mod assets;
pub mod audit;
pub mod capacity;
pub mod conn;
pub mod error;
pub mod events;
pub mod export;
pub mod extract;
pub mod health;
pub mod json;
pub mod oauth;
pub mod openapi;
pub mod releases;
pub mod rpc;
pub mod runtime;
pub mod state;
pub mod tenants;
pub mod webhooks;

use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower::ServiceExt;
use tower_http::set_header::SetResponseHeaderLayer;

use self::error::{ApiError, ErrorCode};
pub use self::state::AppState;
use crate::telemetry::names;

/// Content-Security-Policy of every response: nothing from outside the
/// appliance, no inline script, no framing.
pub const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The whole HTTP surface: the API's routes, `pages` (the console's), the
/// Connect services behind the fallback, and the headers every answer
/// carries.
pub fn router(state: AppState, pages: Router<AppState>) -> Router {
    let connect = rpc::service(&state);
    let auth = state.auth.clone();
    let max_body_bytes = state.config.http.max_body_bytes;
    let api = Router::new()
        .route("/oauth/token", post(oauth::token))
        .route("/events", get(events::sse))
        .route("/events/head", get(events::head))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/proto/", get(assets::proto_index))
        .route("/proto/{*path}", get(assets::proto))
        .route("/static/{*path}", get(assets::static_file))
        .route("/factory/capacity/pools", get(capacity::list_pools))
        .route(
            "/factory/capacity/pools/{pool_id}",
            axum::routing::put(capacity::set_pool),
        )
        .route(
            "/factory/capacity/pools/{pool_id}/queue",
            get(capacity::pool_queue),
        )
        .route("/factory/capacity/quotas", get(capacity::get_quotas))
        .route(
            "/factory/capacity/quotas/{scope}",
            axum::routing::put(capacity::set_quota),
        )
        .route("/factory/capacity/leases", get(capacity::list_leases))
        .route(
            "/factory/capacity/leases/{lease_id}",
            get(capacity::get_lease),
        )
        .route("/factory/capacity/queue", get(capacity::my_queue))
        .route("/factory/capacity/accounting", get(capacity::accounting))
        .route("/factory/usage", get(capacity::usage))
        .route(
            "/runtime/releases",
            get(releases::list)
                .post(releases::import)
                .layer(DefaultBodyLimit::max(
                    state.config.releases.max_bundle_bytes as usize,
                )),
        )
        .route("/runtime/releases/{release_id}", get(releases::get))
        .route(
            "/runtime/releases/{release_id}/deprecate",
            post(releases::deprecate),
        )
        .route(
            "/runtime/releases/{release_id}/revoke",
            post(releases::revoke),
        )
        .route("/runtime/attempts/{attempt_id}", get(runtime::get_attempt))
        .route(
            "/runtime/attempts/{attempt_id}/checkpoints",
            get(runtime::list_checkpoints),
        )
        .route(
            "/runtime/attempts/{attempt_id}/calls/{call_id}",
            get(runtime::get_call),
        )
        .route("/runtime/artifacts/{hash}", get(runtime::get_artifact))
        .route("/runtime/runs/{run_id}/export", get(export::export_run))
        .route("/factory/audit", get(audit::list))
        .route("/factory/audit/verify", get(audit::verify))
        .route(
            "/runtime/attempts/{attempt_id}/watch",
            get(runtime::watch_attempt),
        )
        .route(
            "/runtime/attempts/{attempt_id}/text",
            get(runtime::model_text),
        )
        .route(
            "/factory/webhooks",
            get(webhooks::list).post(webhooks::create),
        )
        .route(
            "/factory/webhooks/{endpoint_id}",
            get(webhooks::get)
                .put(webhooks::put)
                .delete(webhooks::delete),
        )
        .route(
            "/factory/webhooks/{endpoint_id}/rotate-secret",
            post(webhooks::rotate),
        )
        .route(
            "/factory/webhooks/{endpoint_id}/deliveries",
            get(webhooks::deliveries),
        )
        .route(
            "/factory/webhooks/{endpoint_id}/deliveries/{message_id}/redeliver",
            post(webhooks::redeliver),
        )
        .route("/platform/tenants", get(tenants::list))
        .route(
            "/platform/tenants/{tenant_id}",
            get(tenants::get).put(tenants::put),
        )
        .route(
            "/platform/tenants/{tenant_id}/projects/{project_id}",
            axum::routing::put(tenants::put_project),
        )
        .merge(pages)
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(move |req: Request| {
            let connect = connect.clone();
            let auth = auth.clone();
            async move {
                if is_rpc_path(req.uri().path()) {
                    let req = match rpc::precheck(&auth, max_body_bytes, req).await {
                        Ok(req) => req,
                        Err(refusal) => return refusal,
                    };
                    match connect.oneshot(req).await {
                        Ok(response) => response.into_response(),
                        Err(never) => match never {},
                    }
                } else {
                    ApiError::new(
                        ErrorCode::NotFound,
                        format!("no route for {} {}", req.method(), req.uri().path()),
                    )
                    .into_response()
                }
            }
        });
    api.layer(middleware::map_response(problem_for_plain_rejections))
        .layer(DefaultBodyLimit::max(state.config.http.max_body_bytes))
        .layer(middleware::map_request(conn::drain_unread_bodies))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            come_back_while_the_store_waits,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(header_layer(
            header::STRICT_TRANSPORT_SECURITY,
            "max-age=31536000",
        ))
        .layer(header_layer(header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .layer(header_layer(header::X_FRAME_OPTIONS, "DENY"))
        .layer(header_layer(header::REFERRER_POLICY, "no-referrer"))
        .layer(header_layer(header::CONTENT_SECURITY_POLICY, CSP))
        // Every answer is a tenant's data or a secret (a client's secret, a
        // reset password) unless it says otherwise, as static assets do.
        .layer(header_layer(header::CACHE_CONTROL, "no-store"))
        .with_state(state)
}

/// The framework's own refusals (a path segment that is not UTF-8, a body
/// over the limit before a handler reads it) answer in plain text: they
/// answer problem+json, as every other refusal does.
async fn problem_for_plain_rejections(response: Response) -> Response {
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    let status = response.status();
    if !plain || !status.is_client_error() {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let code = match status.as_u16() {
        404 => ErrorCode::NotFound,
        405 => ErrorCode::MethodNotAllowed,
        413 => ErrorCode::PayloadTooLarge,
        415 => ErrorCode::UnsupportedMediaType,
        422 => ErrorCode::Unprocessable,
        _ => ErrorCode::InvalidArgument,
    };
    ApiError::new(code, String::from_utf8_lossy(&text).trim().to_string()).into_response()
}

fn header_layer(name: HeaderName, value: &'static str) -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::if_not_present(name, HeaderValue::from_static(value))
}

/// `/package.Service/Method` with a dotted package.
fn is_rpc_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    match rest.split_once('/') {
        Some((service, method)) => {
            service.contains('.') && !method.is_empty() && !method.contains('/')
        }
        None => false,
    }
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// Where a request comes from, for the audit trail: the client's address
/// ([`conn::Peer`]'s rule: the TCP peer, or the client a standby of the
/// pair proved it forwarded for) and the door (RPC by its path, the API
/// by its bearer token, else the console). Authentication names the actor
/// later.
fn request_origin(request: &Request) -> crate::domain::audit::Origin {
    use crate::domain::audit::Via;
    let address = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip().to_canonical().to_string())
        .unwrap_or_else(|| "in-process".to_string());
    let via = if rpc::method_of(request.uri().path()).is_some() {
        Via::Rpc
    } else if request.headers().contains_key(header::AUTHORIZATION) {
        Via::Api
    } else {
        Via::Console
    };
    crate::domain::audit::Origin {
        actor: String::new(),
        address,
        via,
    }
}

/// While the store's database does not answer (a PostgreSQL restart or
/// failover this appliance rides out, see `store/postgres.rs`), a request
/// that needs the store is told at once to come back (503, Retry-After),
/// in its own protocol, instead of waiting with what is already in
/// flight; what needs no store (health, readiness, metrics, the contract
/// and static files) is served.
async fn come_back_while_the_store_waits(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    const WITHOUT_THE_STORE: [&str; 6] = [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/proto/",
        "/static/",
    ];
    let path = request.uri().path();
    let needs_store = !WITHOUT_THE_STORE
        .iter()
        .any(|p| path == *p || (p.ends_with('/') && path.starts_with(p)));
    let Some(words) = needs_store
        .then(|| state.store.reach().unreachable())
        .flatten()
    else {
        return next.run(request).await;
    };
    let message = format!("{words}; retry");
    if is_rpc_path(path) {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        return rpc::come_back(content_type, &message, STORE_RETRY_AFTER_SECONDS);
    }
    ApiError::new(ErrorCode::Unavailable, message)
        .with_header(header::RETRY_AFTER, &STORE_RETRY_AFTER_SECONDS.to_string())
        .into_response()
}

/// When a caller told to come back while the store's database does not
/// answer is told to: a restart takes a few seconds.
const STORE_RETRY_AFTER_SECONDS: u32 = 1;

/// Counts and times every request by route, and logs failures.
async fn observe(State(_state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    // Label values come from fixed sets only, whatever the request: the
    // template of a matched route, a method of the contract, or
    // `unmatched`. A path chosen by a caller never becomes a label.
    let route = match request.extensions().get::<MatchedPath>() {
        Some(p) => p.as_str().to_string(),
        None => rpc::method_of(request.uri().path())
            .unwrap_or("unmatched")
            .to_string(),
    };
    let method = request.method().clone();
    let origin = request_origin(&request);
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    let response = crate::acting::scope(
        origin,
        tracing::Instrument::instrument(next.run(request), span.clone()),
    )
    .await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    let elapsed = started.elapsed().as_secs_f64();
    metrics::counter!(names::HTTP_REQUESTS, "route" => route.clone(), "status" => status.as_u16().to_string())
        .increment(1);
    metrics::histogram!(names::HTTP_LATENCY, "route" => route.clone()).record(elapsed);
    // A 503 with Retry-After told the caller when to come back (a wait
    // for capacity, a rate limit): a documented wait, not a failure.
    let told_to_wait = response.headers().contains_key(header::RETRY_AFTER);
    if status.is_server_error() && !told_to_wait {
        tracing::warn!(%method, %route, status = status.as_u16(), elapsed, "request failed");
    } else if told_to_wait {
        tracing::info!(%method, %route, status = status.as_u16(), elapsed, "request deferred: the caller was told to come back");
    } else {
        tracing::debug!(%method, %route, status = status.as_u16(), elapsed, "request");
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_paths_are_recognised() {
        assert!(is_rpc_path("/agentbay.admin.v1.Admin/GetVersion"));
        assert!(!is_rpc_path("/events"));
        assert!(!is_rpc_path("/runtime/attempts/123"));
        assert!(!is_rpc_path("/agentbay.admin.v1.Admin/"));
    }
}
