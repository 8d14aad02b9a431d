//! The web console: server-rendered pages over the same services the API
//! uses. Every page works without JavaScript; assets come from the binary.

use askama::Template;
use axum::Router;
use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use crate::api::error::ApiError;
use crate::app::AppState;

/// Routes of the console.
pub fn router() -> Router<AppState> {
    Router::new().route("/", get(index))
}

#[derive(Template)]
#[template(path = "index.html")]
struct IndexPage<'a> {
    version: &'a str,
    fingerprint: &'a str,
    ca_fingerprint: Option<&'a str>,
    schema_version: u32,
}

async fn index(State(state): State<AppState>) -> Result<Response, ApiError> {
    let page = IndexPage {
        version: env!("CARGO_PKG_VERSION"),
        fingerprint: &state.tls.fingerprint,
        ca_fingerprint: state.tls.ca_fingerprint.as_deref(),
        schema_version: state.store.schema_version(),
    };
    Ok(Html(page.render().map_err(ApiError::internal)?).into_response())
}
