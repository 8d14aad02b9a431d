//! Live updates: server-sent events whose data is the server-rendered HTML
//! of a page's live part. `static/console.js` swaps it in; without
//! JavaScript the pages are complete as served and a reload shows the same.
//! A stream ends when its session does (sign-out, disabled user, expiry);
//! it never counts as activity that would keep the session alive.

use std::convert::Infallible;
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, RawQuery};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use uuid::Uuid;

use super::table::ListQuery;
use super::{Console, PageError, capacity, work};
use crate::domain::access::Scope;
use crate::runtime::follow::async_stream;

/// How often the overview, pools and leases are re-rendered while watched.
const PERIOD: Duration = Duration::from_secs(2);

type Events = Sse<
    axum::response::sse::KeepAliveStream<
        std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>>,
    >,
>;

fn html(fragment: Result<String, askama::Error>) -> Event {
    match fragment {
        Ok(body) => Event::default().event("html").data(body),
        Err(e) => Event::default().event("error").data(e.to_string()),
    }
}

fn sse(stream: impl Stream<Item = Event> + Send + 'static) -> Events {
    let stream = futures::StreamExt::map(stream, Ok::<_, Infallible>);
    let stream: std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> =
        Box::pin(stream);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// Re-renders a page part every [`PERIOD`] until the client goes or the
/// appliance stops.
fn every<F, Fut>(console: Console, render: F) -> Events
where
    F: Fn(std::sync::Arc<Console>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<String, askama::Error>> + Send,
{
    let console = std::sync::Arc::new(console);
    let mut shutdown = console.state.shutdown.clone();
    sse(async_stream(move |tx| async move {
        let mut last = String::new();
        while console.signed_in() {
            let body = render(console.clone()).await;
            let changed = body.as_ref().map(|b| *b != last).unwrap_or(true);
            if changed {
                if let Ok(b) = &body {
                    last = b.clone();
                }
                if tx.send(html(body)).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(PERIOD) => {}
                _ = shutdown.changed() => return,
                _ = tx.closed() => return,
            }
        }
    }))
}

fn fragment<T: Template>(part: Result<T, PageError>) -> Result<String, askama::Error> {
    match part {
        Ok(t) => t.render(),
        Err(e) => Err(askama::Error::Custom(format!("{e:?}").into())),
    }
}

/// `GET /live/overview`.
pub async fn overview(console: Console) -> Result<Events, PageError> {
    console.require(Scope::RunsRead)?;
    Ok(every(console, |c| async move {
        fragment(work::overview_live(&c).await)
    }))
}

/// `GET /live/pools`.
pub async fn pools(console: Console) -> Result<Events, PageError> {
    console.require(Scope::CapacityRead)?;
    Ok(every(console, |c| async move {
        fragment(capacity::pools_live(&c).await)
    }))
}

/// `GET /live/leases`: with the page's query (filters, sort, page).
pub async fn leases(console: Console, raw: RawQuery) -> Result<Events, PageError> {
    console.require(Scope::CapacityRead)?;
    let raw = std::sync::Arc::new(raw);
    Ok(every(console, move |c| {
        let raw = raw.clone();
        async move { fragment(capacity::leases_live(&c, &ListQuery::parse(&raw)).await) }
    }))
}

/// `GET /attempts/{id}/live`: the timeline's live part at every change of
/// the attempt (state, phase, queue position, calls, decisions); ends with
/// an `end` event once the attempt is terminal.
pub async fn timeline(
    console: Console,
    Path(attempt_id): Path<String>,
) -> Result<Events, PageError> {
    console.require(Scope::RunsRead)?;
    let id = Uuid::parse_str(&attempt_id)
        .map_err(|_| PageError::bad(format!("attemptId: {attempt_id:?} is not a UUID")))?;
    let scope = console.scope()?;
    let mut rx = console.state.runtime.watch(&scope, id)?;
    let mut shutdown = console.state.shutdown.clone();
    Ok(sse(async_stream(move |tx| async move {
        while console.signed_in() {
            let view = rx.borrow_and_update().clone();
            let done = view.attempt.state.is_terminal();
            let part = work::timeline_of(&console, &scope, &view);
            if tx.send(html(fragment(part))).await.is_err() {
                return;
            }
            if done {
                let _ = tx
                    .send(Event::default().event("end").data("terminal"))
                    .await;
                return;
            }
            // Wait for the next change, looking at the session meanwhile.
            loop {
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            // The grain ended: the stored attempt is the last word.
                            let part = work::timeline_live(&console, id);
                            let _ = tx.send(html(fragment(part))).await;
                            let _ = tx.send(Event::default().event("end").data("terminal")).await;
                            return;
                        }
                        break;
                    }
                    _ = tokio::time::sleep(PERIOD) => if !console.signed_in() { return },
                    _ = shutdown.changed() => return,
                    _ = tx.closed() => return,
                }
            }
        }
    })))
}

/// `GET /attempts/{id}/text`: the attempt's model text as it is written,
/// the API's events (`text`, `superseded`, `ended`, `gap`) from `?from=`
/// or `Last-Event-ID`, while the session lasts.
pub async fn model_text(
    console: Console,
    Path(attempt_id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: axum::http::HeaderMap,
) -> Result<Events, PageError> {
    console.require(Scope::RunsRead)?;
    let id = Uuid::parse_str(&attempt_id)
        .map_err(|_| PageError::bad(format!("attemptId: {attempt_id:?} is not a UUID")))?;
    let pairs = crate::api::capacity::query_pairs(raw.as_deref(), &["from"])
        .map_err(|e| PageError::bad(e.detail.clone()))?;
    let from = crate::api::runtime::text_from(&headers, pairs.first().map(|(_, v)| v.as_str()))
        .map_err(|e| PageError::bad(e.detail.clone()))?;
    let scope = console.scope()?;
    let pieces =
        console
            .state
            .runtime
            .model_text(&scope, id, from, console.state.shutdown.clone())?;
    Ok(sse(async_stream(move |tx| async move {
        let mut pieces = std::pin::pin!(pieces);
        while let Some(piece) = futures::StreamExt::next(&mut pieces).await {
            if !console.signed_in()
                || tx
                    .send(crate::api::runtime::text_event(&piece))
                    .await
                    .is_err()
            {
                return;
            }
        }
        let _ = tx
            .send(Event::default().event("end").data("terminal"))
            .await;
    })))
}
