//! `GET /events`: the outbox as a resumable server-sent event stream.
//!
//! Each SSE event carries the outbox sequence as its `id`, the topic as its
//! `event` and the stored event as JSON `data`. A client that reconnects with
//! `Last-Event-ID` (or `?after=`) gets everything after that sequence, then
//! live events as they become durable. `?topic=` (repeatable) keeps only
//! topics starting with one of the given prefixes. A caller sees its own
//! tenant's events; a PlatformAdmin sees every tenant's, or one with
//! `?tenant=`. The same stream backs the `Admin/WatchEvents` RPC.
//!
//! To know when it has caught up, a reader asks for the head: the sequence
//! of the last durable event (`GET /events/head`, also sent as the
//! `Agentbay-Events-Head` header of every stream), and reads with
//! `?until=<head>`: the stream then ends once it has delivered every event
//! the reader may see up to that sequence.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use utoipa::IntoParams;

use super::error::{ApiError, ErrorCode};
use crate::api::AppState;
use crate::api::extract::{Authorized, need};
use crate::auth::Principal;
use crate::domain::TenantId;
use crate::domain::events::EventFilter;

/// Query of `GET /events`.
#[derive(Deserialize, IntoParams, Default, Debug)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Deliver events after this sequence (overridden by `Last-Event-ID`).
    pub after: Option<u64>,
    /// Topic prefixes (repeatable).
    #[serde(default)]
    pub topic: Vec<String>,
    /// PlatformAdmins only: one tenant's events.
    pub tenant: Option<String>,
    /// End the stream once every event up to this sequence (at most the
    /// head) is delivered, instead of following live events.
    pub until: Option<u64>,
}

impl EventsQuery {
    /// Parses the query string of `route`, which takes the parameters
    /// `allowed`; `topic` may repeat, any other key is refused.
    pub fn parse(
        raw: Option<&str>,
        route: &str,
        allowed: &[&str],
    ) -> Result<EventsQuery, ApiError> {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(raw.unwrap_or("")).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("the query string is malformed: {e}"),
                )
            })?;
        let mut query = EventsQuery::default();
        for (key, value) in pairs {
            if !allowed.contains(&key.as_str()) {
                return Err(ApiError::invalid(
                    key,
                    format!("is not a parameter of {route} ({})", allowed.join(", ")),
                ));
            }
            match key.as_str() {
                "after" => {
                    query.after = Some(value.parse().map_err(|_| {
                        ApiError::invalid(
                            "after",
                            format!("{value:?} is not an event sequence number"),
                        )
                    })?)
                }
                "topic" => query.topic.push(value),
                "tenant" => query.tenant = Some(value),
                "until" => {
                    query.until = Some(value.parse().map_err(|_| {
                        ApiError::invalid(
                            "until",
                            format!("{value:?} is not an event sequence number"),
                        )
                    })?)
                }
                other => {
                    return Err(ApiError::invalid(
                        other,
                        format!("is not a parameter of {route}"),
                    ));
                }
            }
        }
        Ok(query)
    }
}

/// Builds the filter a principal may use.
pub fn filter_for(
    principal: &Principal,
    tenant: Option<&str>,
    topics: Vec<String>,
) -> Result<EventFilter, ApiError> {
    let tenant = match tenant {
        Some(t) => {
            let t = TenantId::parse_field("tenant", t)?;
            principal.scope_for(&t)?;
            Some(t)
        }
        None if principal.is_platform_admin() => None,
        None => Some(principal.tenant.clone()),
    };
    Ok(EventFilter { tenant, topics })
}

/// Checks an `until` sequence: it may not lie beyond the head, whose
/// events are all durable and readable.
pub fn check_until(head: u64, field: &str, until: Option<u64>) -> Result<(), ApiError> {
    match until {
        // The request is well formed; the outbox is not there yet.
        Some(u) if u > head => {
            let mut e = ApiError::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "{field}: {u} is beyond the last event, {head}; read the head first (GET /events/head)"
                ),
            );
            e.field = Some(field.to_string());
            Err(e)
        }
        _ => Ok(()),
    }
}

/// One event of a `text/event-stream` answer, as a client reads it: its
/// name, its id (where a reader resumes from, as `Last-Event-ID`) and its
/// data, a JSON document whose form the route names.
#[derive(utoipa::ToSchema)]
pub struct ServerSentEvent {
    /// The event's name.
    pub event: String,
    /// Its id.
    pub id: String,
    /// Its data: a JSON document.
    pub data: String,
}

/// The last durable event.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct EventsHead {
    /// Its outbox sequence; 0 when there is none yet.
    pub sequence: u64,
}

/// The sequence of the last durable event: read up to it to catch up.
#[utoipa::path(
    get,
    path = "/events/head",
    tag = "events",
    responses(
        (status = 200, description = "The last durable event's sequence (0: none yet)", body = EventsHead),
        (status = 401, description = "No valid token", content_type = "application/problem+json"),
        (status = 403, description = "Missing agentbay.events.read, or another tenant", content_type = "application/problem+json"),
    ),
    params(("tenant" = Option<String>, Query, description = "PlatformAdmins: one tenant's stream")),
    security(("bearer" = []))
)]
pub async fn head(
    State(state): State<AppState>,
    auth: Authorized<need::EventsRead>,
    RawQuery(raw): RawQuery,
) -> Result<axum::Json<EventsHead>, ApiError> {
    // The same parameters and the same tenant rule as the stream itself:
    // the head is where a reader of that stream would catch up to.
    let query = EventsQuery::parse(raw.as_deref(), "/events/head", &["tenant"])?;
    filter_for(&auth.principal, query.tenant.as_deref(), Vec::new())?;
    Ok(axum::Json(EventsHead {
        sequence: state.store.events_head(),
    }))
}

/// The header that tells a stream's reader where the head was when it
/// opened.
pub const HEAD_HEADER: &str = "agentbay-events-head";

/// Streams events as server-sent events.
#[utoipa::path(
    get,
    path = "/events",
    tag = "events",
    params(EventsQuery, ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this sequence")),
    responses(
        (status = 200, description = "text/event-stream of outbox events (each event's name is its topic, its id its sequence, its data the event as JSON: sequence, topic, tenantId, occurredAt, payload); header Agentbay-Events-Head: the last durable event's sequence when it opened", content_type = "text/event-stream", body = ServerSentEvent),
        (status = 409, description = "`until` is beyond the last event: read the head first", content_type = "application/problem+json"),
        (status = 401, description = "No valid token", content_type = "application/problem+json"),
        (status = 403, description = "Missing agentbay.events.read, or another tenant", content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn sse(
    State(state): State<AppState>,
    auth: Authorized<need::EventsRead>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<
    (
        [(&'static str, String); 1],
        Sse<impl Stream<Item = Result<Event, Infallible>>>,
    ),
    ApiError,
> {
    let query = EventsQuery::parse(
        raw.as_deref(),
        "/events",
        &["after", "topic", "tenant", "until"],
    )?;
    let filter = filter_for(&auth.principal, query.tenant.as_deref(), query.topic)?;
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| {
                ApiError::invalid(
                    "Last-Event-ID",
                    format!("{v:?} is not an event sequence number"),
                )
            })
        })
        .transpose()?;
    let after = last_event_id.or(query.after).unwrap_or(0);
    let head = state.store.events_head();
    check_until(head, "until", query.until)?;
    let stream = state
        .store
        .event_stream(filter, after, query.until, state.shutdown.clone());
    let events = futures::StreamExt::map(stream, |event| {
        Ok(Event::default()
            .id(event.sequence.to_string())
            .event(event.topic.clone())
            .data(serde_json::to_string(&*event).expect("events serialise")))
    });
    Ok((
        [(HEAD_HEADER, head.to_string())],
        Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))),
    ))
}
