//! Files embedded in the binary: the `.proto` contract under `/proto/` and
//! the console's CSS and JS under `/static/`. Nothing is read from disk at
//! run time, so an installed appliance serves exactly what it was built with.

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ErrorCode};

#[derive(rust_embed::Embed)]
#[folder = "static/"]
struct Static;

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("proto") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn serve(path: &str) -> Result<Response, ApiError> {
    let file = Static::get(path)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no file /{path}")))?;
    let mut response = file.data.into_owned().into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(path)),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    Ok(response)
}

/// `GET /proto/{*path}`: the contract's `.proto` files.
pub async fn proto(Path(path): Path<String>) -> Result<Response, ApiError> {
    serve(&format!("proto/{path}"))
}

/// `GET /proto/`: the list of `.proto` files.
pub async fn proto_index() -> impl IntoResponse {
    let files: Vec<String> = Static::iter()
        .filter(|p| p.starts_with("proto/") && p.ends_with(".proto"))
        .map(|p| format!("/{p}"))
        .collect();
    axum::Json(files)
}

/// `GET /static/{*path}`: console assets.
pub async fn static_file(Path(path): Path<String>) -> Result<Response, ApiError> {
    if path.starts_with("proto/") {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no file /static/{path}"),
        ));
    }
    serve(&path)
}
