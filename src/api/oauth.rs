//! `POST /oauth/token`: the client credentials grant (RFC 6749 §4.4).
//!
//! The client authenticates with HTTP Basic (`client_id:client_secret`,
//! form-encoded then base64, RFC 6749 §2.3.1) or with `client_id` and
//! `client_secret` in the form body, never both. It may ask for a subset of
//! its scopes with `scope`. Errors are problem+json documents that also
//! carry the RFC's `error` and `error_description` members, so OAuth client
//! libraries and people both read them.

use std::collections::BTreeSet;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, PRAGMA, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorCode};
use crate::api::AppState;
use crate::auth::{AuthError, clients};
use crate::domain::access::Scope;
use crate::telemetry::names;

/// The only grant: a client's own credentials.
#[derive(ToSchema)]
#[allow(dead_code)]
enum GrantType {
    /// `client_credentials`.
    #[schema(rename = "client_credentials")]
    ClientCredentials,
}

/// The form fields of a token request.
#[derive(Deserialize, Default, ToSchema)]
pub struct TokenRequest {
    /// Must be `client_credentials`.
    #[schema(required = true, value_type = GrantType)]
    pub grant_type: Option<String>,
    /// The client id, unless sent with HTTP Basic.
    pub client_id: Option<String>,
    /// The client secret, unless sent with HTTP Basic.
    pub client_secret: Option<String>,
    /// Space-separated scopes to narrow the token to; all of the client's
    /// when absent.
    pub scope: Option<String>,
}

/// A successful token response.
#[derive(Serialize, ToSchema)]
pub struct TokenResponse {
    /// The bearer token.
    pub access_token: String,
    /// Always `Bearer`.
    pub token_type: &'static str,
    /// Seconds until the token expires.
    pub expires_in: u64,
    /// Space-separated scopes the token carries.
    pub scope: String,
}

fn oauth_error(code: ErrorCode, error: &str, description: impl Into<String>) -> ApiError {
    let description = description.into();
    ApiError::new(code, description.clone())
        .with("error", error)
        .with("error_description", description)
}

fn decode_component(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

fn basic_credentials(headers: &HeaderMap) -> Result<Option<(String, String)>, ApiError> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let invalid = || {
        oauth_error(
            ErrorCode::Unauthenticated,
            "invalid_client",
            "the Authorization header must be `Basic base64(client_id:client_secret)`",
        )
        .with_header(WWW_AUTHENTICATE, "Basic realm=\"agentbay\"")
    };
    let text = value.to_str().map_err(|_| invalid())?;
    let encoded = text
        .strip_prefix("Basic ")
        .or_else(|| text.strip_prefix("basic "))
        .ok_or_else(invalid)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| invalid())?;
    let decoded = String::from_utf8(decoded).map_err(|_| invalid())?;
    let (id, secret) = decoded.split_once(':').ok_or_else(invalid)?;
    Ok(Some((decode_component(id), decode_component(secret))))
}

/// Issues an access token for a client credential.
#[utoipa::path(
    post,
    path = "/oauth/token",
    tag = "auth",
    request_body(content = TokenRequest, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "A bearer token", body = TokenResponse),
        (status = 400, description = "Malformed request, unsupported grant or unknown scope", content_type = "application/problem+json"),
        (status = 401, description = "Unknown client or wrong secret", content_type = "application/problem+json"),
        (status = 429, description = "Too many failed attempts for this client from this address, or too many checks at once; Retry-After says when to try again", content_type = "application/problem+json"),
    )
)]
pub async fn token(
    State(state): State<AppState>,
    super::conn::Peer(source): super::conn::Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(super::json::body_error)?;
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/x-www-form-urlencoded") {
        return Err(oauth_error(
            ErrorCode::UnsupportedMediaType,
            "invalid_request",
            "send the token request as application/x-www-form-urlencoded",
        ));
    }
    let form: TokenRequest = serde_urlencoded::from_bytes(&body).map_err(|e| {
        oauth_error(
            ErrorCode::InvalidArgument,
            "invalid_request",
            format!("the form is malformed: {e}"),
        )
    })?;
    match form.grant_type.as_deref() {
        Some("client_credentials") => {}
        Some(other) => {
            return Err(oauth_error(
                ErrorCode::InvalidArgument,
                "unsupported_grant_type",
                format!("grant_type {other:?} is not supported; use client_credentials"),
            )
            .with("field", "grant_type"));
        }
        None => {
            return Err(oauth_error(
                ErrorCode::InvalidArgument,
                "invalid_request",
                "grant_type is missing",
            )
            .with("field", "grant_type"));
        }
    }
    let basic = basic_credentials(&headers)?;
    let (client_id, secret) = match (basic, form.client_id, form.client_secret) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(oauth_error(
                ErrorCode::InvalidArgument,
                "invalid_request",
                "send the client credentials either with HTTP Basic or in the form, not both",
            ));
        }
        (Some(pair), None, None) => pair,
        (None, Some(id), Some(secret)) => (id, secret),
        (None, None, _) => {
            return Err(oauth_error(
                ErrorCode::Unauthenticated,
                "invalid_client",
                "no client credentials: send HTTP Basic or client_id and client_secret",
            )
            .with_header(WWW_AUTHENTICATE, "Basic realm=\"agentbay\""));
        }
        (None, Some(_), None) => {
            return Err(oauth_error(
                ErrorCode::InvalidArgument,
                "invalid_request",
                "client_secret is missing",
            )
            .with("field", "client_secret"));
        }
    };

    let credential =
        match clients::authenticate(&state.store, &state.auth, &client_id, &secret, source).await {
            Ok(c) => c,
            Err(AuthError::RateLimited {
                message,
                retry_after,
            }) => {
                metrics::counter!(names::AUTH_FAILURES, "reason" => "rate_limited").increment(1);
                return Err(
                    oauth_error(ErrorCode::RateLimited, "invalid_client", message)
                        .with_header(RETRY_AFTER, &retry_after.to_string()),
                );
            }
            Err(e) => {
                metrics::counter!(names::AUTH_FAILURES, "reason" => "invalid_client").increment(1);
                return Err(oauth_error(
                    ErrorCode::Unauthenticated,
                    "invalid_client",
                    e.to_string(),
                )
                .with_header(WWW_AUTHENTICATE, "Basic realm=\"agentbay\""));
            }
        };

    let scopes: BTreeSet<Scope> = match form
        .scope
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => credential.scopes.clone(),
        Some(requested) => {
            let mut set = BTreeSet::new();
            for name in requested.split_whitespace() {
                let scope: Scope = name.parse().map_err(|e: crate::domain::FieldError| {
                    oauth_error(ErrorCode::InvalidArgument, "invalid_scope", e.reason)
                })?;
                if !credential.scopes.contains(&scope) {
                    return Err(oauth_error(
                        ErrorCode::InvalidArgument,
                        "invalid_scope",
                        format!("client {} is not granted {scope}", credential.client_id),
                    )
                    .with("field", "scope"));
                }
                set.insert(scope);
            }
            set
        }
    };
    let issued = state.auth.issue(&credential, scopes);
    metrics::counter!(names::TOKENS_ISSUED).increment(1);
    tracing::info!(client = %credential.client_id, tenant = %credential.tenant_id, "issued an access token");
    let mut response = Json(TokenResponse {
        access_token: issued.access_token,
        token_type: "Bearer",
        expires_in: issued.expires_in,
        scope: issued.scope,
    })
    .into_response();
    // Cache-Control: no-store comes with every answer (the router); RFC
    // 6749 asks for Pragma as well.
    response
        .headers_mut()
        .insert(PRAGMA, HeaderValue::from_static("no-cache"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_form_decoded() {
        let mut headers = HeaderMap::new();
        let encoded = base64::engine::general_purpose::STANDARD.encode("acme.123:s%3Acret+x");
        headers.insert(AUTHORIZATION, format!("Basic {encoded}").parse().unwrap());
        let (id, secret) = basic_credentials(&headers).unwrap().unwrap();
        assert_eq!(id, "acme.123");
        assert_eq!(secret, "s:cret x");
        headers.insert(AUTHORIZATION, "Bearer x".parse().unwrap());
        assert!(basic_credentials(&headers).is_err());
    }
}
