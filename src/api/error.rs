//! One error shape for REST and RPC.
//!
//! Every error the API returns has a stable code from [`ErrorCode`]; the one
//! table in [`ErrorCode::spec`] gives each code its HTTP status, its Connect
//! code and its title. REST answers `application/problem+json` (RFC 9457)
//! with the code, the detail and, when one input was wrong, the field. RPC
//! answers a Connect error with the same code's Connect equivalent and the
//! same detail. Internal errors are logged in full and shown only as a
//! reference, never with their internals.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use connectrpc::ConnectError;
use serde_json::{Map, Value, json};

use crate::auth::AuthError;
use crate::auth::clients::ClientError;
use crate::domain::{DomainError, FieldError};

/// Stable error codes of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// An input field was wrong.
    InvalidArgument,
    /// The body is not valid JSON.
    MalformedJson,
    /// The body is not of a supported content type.
    UnsupportedMediaType,
    /// The body is larger than accepted.
    PayloadTooLarge,
    /// No valid credential.
    Unauthenticated,
    /// A valid credential without the needed scope or tenant.
    PermissionDenied,
    /// Too many attempts.
    RateLimited,
    /// Nothing at that id, or no such route.
    NotFound,
    /// The route exists, but not for this HTTP method.
    MethodNotAllowed,
    /// The thing exists already.
    AlreadyExists,
    /// Well-formed, but refused on its content (a rejected release).
    Unprocessable,
    /// A document does not satisfy the schema it must (a run's input):
    /// every field at fault is listed.
    DoesNotMatch,
    /// Wrong state for the operation.
    FailedPrecondition,
    /// A quota, pool bound or budget stops the operation.
    ResourceExhausted,
    /// A stale fencing token or a concurrent change.
    Aborted,
    /// The appliance cannot serve this now (store failing, shutting down).
    Unavailable,
    /// A bug or an unexpected failure.
    Internal,
}

/// What a code means on each protocol.
pub struct CodeSpec {
    /// Kebab-case slug, used in the problem `type` and `code`.
    pub slug: &'static str,
    /// Short title.
    pub title: &'static str,
    /// HTTP status.
    pub status: StatusCode,
    /// Connect / gRPC code.
    pub connect: connectrpc::ErrorCode,
}

impl ErrorCode {
    /// The table.
    #[rustfmt::skip]
    pub fn spec(self) -> CodeSpec {
        use connectrpc::ErrorCode as C;
        use StatusCode as S;
        let (slug, title, status, connect) = match self {
            ErrorCode::InvalidArgument => ("invalid-argument", "Invalid argument", S::BAD_REQUEST, C::InvalidArgument),
            ErrorCode::MalformedJson => ("malformed-json", "Malformed JSON", S::BAD_REQUEST, C::InvalidArgument),
            ErrorCode::UnsupportedMediaType => ("unsupported-media-type", "Unsupported media type", S::UNSUPPORTED_MEDIA_TYPE, C::InvalidArgument),
            ErrorCode::PayloadTooLarge => ("payload-too-large", "Payload too large", S::PAYLOAD_TOO_LARGE, C::ResourceExhausted),
            ErrorCode::Unauthenticated => ("unauthenticated", "Unauthenticated", S::UNAUTHORIZED, C::Unauthenticated),
            ErrorCode::PermissionDenied => ("permission-denied", "Permission denied", S::FORBIDDEN, C::PermissionDenied),
            ErrorCode::RateLimited => ("rate-limited", "Too many requests", S::TOO_MANY_REQUESTS, C::ResourceExhausted),
            ErrorCode::NotFound => ("not-found", "Not found", S::NOT_FOUND, C::NotFound),
            ErrorCode::MethodNotAllowed => ("method-not-allowed", "Method not allowed", S::METHOD_NOT_ALLOWED, C::Unimplemented),
            ErrorCode::AlreadyExists => ("already-exists", "Already exists", S::CONFLICT, C::AlreadyExists),
            ErrorCode::Unprocessable => ("unprocessable", "Unprocessable content", S::UNPROCESSABLE_ENTITY, C::FailedPrecondition),
            ErrorCode::DoesNotMatch => ("does-not-match", "Does not match its schema", S::UNPROCESSABLE_ENTITY, C::InvalidArgument),
            ErrorCode::FailedPrecondition => ("failed-precondition", "Failed precondition", S::CONFLICT, C::FailedPrecondition),
            ErrorCode::ResourceExhausted => ("resource-exhausted", "Resource exhausted", S::TOO_MANY_REQUESTS, C::ResourceExhausted),
            ErrorCode::Aborted => ("aborted", "Aborted", S::CONFLICT, C::Aborted),
            ErrorCode::Unavailable => ("unavailable", "Unavailable", S::SERVICE_UNAVAILABLE, C::Unavailable),
            ErrorCode::Internal => ("internal", "Internal error", S::INTERNAL_SERVER_ERROR, C::Internal),
        };
        CodeSpec {
            slug,
            title,
            status,
            connect,
        }
    }
}

/// An error on its way to a client. Boxed: it travels in every `Result` of
/// the API layer, and the happy path should not pay for its size.
#[derive(Debug)]
pub struct ApiError(Box<Problem>);

/// The content of an [`ApiError`].
#[derive(Debug)]
pub struct Problem {
    /// The code.
    pub code: ErrorCode,
    /// What the caller should know, in words that name the problem.
    pub detail: String,
    /// The input field at fault, camelCase and dotted.
    pub field: Option<String>,
    /// Extra problem members (a limit, a queue position, an OAuth error).
    pub extensions: Map<String, Value>,
    /// What only the log sees.
    pub internal: Option<String>,
    /// Extra response headers (`WWW-Authenticate`, `Retry-After`).
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl std::ops::Deref for ApiError {
    type Target = Problem;
    fn deref(&self) -> &Problem {
        &self.0
    }
}

impl std::ops::DerefMut for ApiError {
    fn deref_mut(&mut self) -> &mut Problem {
        &mut self.0
    }
}

impl ApiError {
    /// An error with a code and a detail.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        ApiError(Box::new(Problem {
            code,
            detail: detail.into(),
            field: None,
            extensions: Map::new(),
            internal: None,
            headers: Vec::new(),
        }))
    }

    /// An input field was wrong.
    pub fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        let field = field.into();
        let mut e = ApiError::new(ErrorCode::InvalidArgument, format!("{field}: {reason}"));
        e.field = Some(field);
        e
    }

    /// An unexpected failure: logged in full, shown as a reference.
    pub fn internal(what: impl std::fmt::Display) -> Self {
        let mut e = ApiError::new(ErrorCode::Internal, "");
        e.internal = Some(what.to_string());
        e
    }

    /// Adds a problem member.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(key.to_string(), value.into());
        self
    }

    /// Adds a response header.
    pub fn with_header(mut self, name: header::HeaderName, value: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((name, v));
        }
        self
    }

    /// Whether this answer tells the caller to come back later
    /// (`Retry-After`): a wait it was told of, not a failure.
    pub fn is_wait(&self) -> bool {
        self.headers.iter().any(|(n, _)| n == header::RETRY_AFTER)
    }

    /// Logs internals and fills a reference into the detail of an internal
    /// error. Called once, by whichever protocol renders the error.
    pub fn finish(mut self) -> Self {
        if let Some(internal) = &self.internal {
            let reference = crate::domain::ids::new_id().simple().to_string();
            let reference = &reference[reference.len() - 12..];
            tracing::error!(reference, error = %internal, code = self.code.spec().slug, "request failed");
            if self.detail.is_empty() {
                self.detail = format!(
                    "an internal error occurred; reference {reference} in the appliance log"
                );
            }
        } else if self.code == ErrorCode::Unavailable && !self.is_wait() {
            tracing::warn!(detail = %self.detail, "request refused: unavailable");
        }
        // A refusal quotes what it refuses; a 40 KB id is not echoed whole.
        const MAX_DETAIL: usize = 1000;
        if self.detail.len() > MAX_DETAIL {
            let mut end = MAX_DETAIL;
            while !self.detail.is_char_boundary(end) {
                end -= 1;
            }
            self.detail.truncate(end);
            self.detail.push_str(" … (cut)");
        }
        self
    }

    /// The problem document (RFC 9457).
    pub fn problem(&self) -> Value {
        let spec = self.code.spec();
        let mut body = json!({
            "type": format!("urn:agentbay:problem:{}", spec.slug),
            "title": spec.title,
            "status": spec.status.as_u16(),
            "code": spec.slug,
            "detail": self.detail,
        });
        let object = body.as_object_mut().expect("literal object");
        if let Some(field) = &self.field {
            object.insert("field".into(), Value::String(field.clone()));
        }
        for (k, v) in &self.extensions {
            object.insert(k.clone(), v.clone());
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let this = self.finish();
        let status = this.code.spec().status;
        let mut response = (
            status,
            serde_json::to_string(&this.problem()).expect("problem serialises"),
        )
            .into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        for (name, value) in this.0.headers {
            headers.insert(name, value);
        }
        response
    }
}

impl From<ApiError> for ConnectError {
    /// The same error a REST caller gets as problem+json: the detail as the
    /// message, the problem's extra members (a denied lease's `leaseId`,
    /// the `limitingQuota`, a queue `position`, ...) as a
    /// `google.rpc.ErrorInfo` detail (its `debug` holds them as JSON for
    /// Connect JSON clients), and a wrong input field as a
    /// `google.rpc.BadRequest` detail.
    fn from(e: ApiError) -> Self {
        use crate::proto::google::rpc::{BadRequest, ErrorInfo, bad_request::FieldViolation};
        let e = e.finish();
        let spec = e.code.spec();
        let mut error = ConnectError::new(spec.connect, e.detail.clone());
        if !e.headers.is_empty() {
            error = error.with_headers(e.headers.iter().cloned().collect());
        }
        let mut facts = e.extensions.clone();
        if let Some(field) = &e.field {
            facts.insert("field".into(), Value::String(field.clone()));
        }
        if !facts.is_empty() {
            let info = ErrorInfo {
                reason: spec.slug.replace('-', "_").to_uppercase(),
                domain: "agentbay".into(),
                metadata: facts
                    .iter()
                    .map(|(k, v)| {
                        let text = match v {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        (k.clone(), text)
                    })
                    .collect(),
                ..Default::default()
            };
            let mut detail = connectrpc::ErrorDetail::from_message("google.rpc.ErrorInfo", &info);
            detail.debug = Some(Value::Object(facts));
            error = error.with_detail(detail);
        }
        if let Some(field) = &e.field {
            // Every field at fault, when the problem lists them; else the one.
            let listed: Vec<FieldViolation> = e
                .extensions
                .get("violations")
                .and_then(Value::as_array)
                .map(|all| {
                    all.iter()
                        .map(|v| FieldViolation {
                            field: v["field"].as_str().unwrap_or_default().to_string(),
                            description: v["reason"].as_str().unwrap_or_default().to_string(),
                            ..Default::default()
                        })
                        .collect()
                })
                .unwrap_or_default();
            let bad = BadRequest {
                field_violations: if listed.is_empty() {
                    vec![FieldViolation {
                        field: field.clone(),
                        description: e.detail.clone(),
                        ..Default::default()
                    }]
                } else {
                    listed
                },
                ..Default::default()
            };
            error = error.with_detail(connectrpc::ErrorDetail::from_message(
                "google.rpc.BadRequest",
                &bad,
            ));
        }
        error
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::invalid(e.field, e.reason)
    }
}

impl From<DomainError> for ApiError {
    fn from(e: DomainError) -> Self {
        match e {
            DomainError::Invalid(f) => f.into(),
            DomainError::NotFound { .. } => ApiError::new(ErrorCode::NotFound, e.to_string()),
            DomainError::AlreadyExists { .. } => {
                ApiError::new(ErrorCode::AlreadyExists, e.to_string())
            }
            DomainError::FailedPrecondition(m) => ApiError::new(ErrorCode::FailedPrecondition, m),
            DomainError::Exhausted(m) => ApiError::new(ErrorCode::ResourceExhausted, m),
            DomainError::Aborted(m) => ApiError::new(ErrorCode::Aborted, m),
            DomainError::Refused(m) => ApiError::new(ErrorCode::PermissionDenied, m),
            DomainError::Unavailable(m) => ApiError::new(ErrorCode::Unavailable, m),
            DomainError::Waiting(m) => ApiError::new(ErrorCode::Unavailable, m)
                .with_header(header::RETRY_AFTER, &DomainError::WAIT_SECONDS.to_string()),
            DomainError::TooLarge(m) => ApiError::new(ErrorCode::PayloadTooLarge, m),
            DomainError::Unfit {
                ref what,
                ref violations,
                ..
            } => {
                let facts: Vec<Value> = violations
                    .iter()
                    .map(|v| json!({"field": v.field, "reason": v.reason}))
                    .collect();
                let mut problem =
                    ApiError::new(ErrorCode::DoesNotMatch, e.to_string()).with("violations", facts);
                problem.field = Some(what.clone());
                problem
            }
            DomainError::Broken(m) => ApiError::internal(m),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated(m) => ApiError::new(ErrorCode::Unauthenticated, m)
                .with_header(header::WWW_AUTHENTICATE, "Bearer realm=\"agentbay\""),
            AuthError::Forbidden(m) => ApiError::new(ErrorCode::PermissionDenied, m),
            AuthError::RateLimited {
                message,
                retry_after,
            } => ApiError::new(ErrorCode::RateLimited, message)
                .with("retryAfterSeconds", retry_after)
                .with_header(axum::http::header::RETRY_AFTER, &retry_after.to_string()),
        }
    }
}

impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Domain(d) => d.into(),
            ClientError::Store(s) => DomainError::from(s).into(),
        }
    }
}

impl From<crate::auth::users::UserError> for ApiError {
    fn from(e: crate::auth::users::UserError) -> Self {
        match e {
            crate::auth::users::UserError::Domain(d) => d.into(),
            crate::auth::users::UserError::Store(s) => DomainError::from(s).into(),
        }
    }
}

/// Maps any error the API layer knows to a Connect error.
pub fn rpc<E: Into<ApiError>>(e: E) -> ConnectError {
    e.into().into()
}

impl From<crate::webhooks::WebhookError> for ApiError {
    fn from(e: crate::webhooks::WebhookError) -> Self {
        match e {
            crate::webhooks::WebhookError::Domain(d) => d.into(),
            crate::webhooks::WebhookError::Store(s) => DomainError::from(s).into(),
            crate::webhooks::WebhookError::NotFound(m) => ApiError::new(ErrorCode::NotFound, m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_slug() {
        let codes = [
            ErrorCode::InvalidArgument,
            ErrorCode::MalformedJson,
            ErrorCode::UnsupportedMediaType,
            ErrorCode::PayloadTooLarge,
            ErrorCode::Unauthenticated,
            ErrorCode::PermissionDenied,
            ErrorCode::RateLimited,
            ErrorCode::NotFound,
            ErrorCode::MethodNotAllowed,
            ErrorCode::AlreadyExists,
            ErrorCode::Unprocessable,
            ErrorCode::FailedPrecondition,
            ErrorCode::ResourceExhausted,
            ErrorCode::Aborted,
            ErrorCode::Unavailable,
            ErrorCode::Internal,
        ];
        let slugs: std::collections::HashSet<_> = codes.iter().map(|c| c.spec().slug).collect();
        assert_eq!(slugs.len(), codes.len());
    }

    #[test]
    fn a_field_error_names_the_field_on_both_protocols() {
        let e: ApiError = FieldError::new("scopes", "unknown scope \"x\"").into();
        let problem = e.problem();
        assert_eq!(problem["field"], "scopes");
        assert_eq!(problem["status"], 400);
        let connect: ConnectError = ApiError::from(FieldError::new("scopes", "unknown")).into();
        assert_eq!(connect.code, connectrpc::ErrorCode::InvalidArgument);
        assert!(connect.message.as_deref().unwrap_or("").contains("scopes"));
    }

    #[test]
    fn problem_members_travel_as_error_details() {
        use buffa::Message as _;
        let e = ApiError::new(ErrorCode::ResourceExhausted, "quota concurrentSandboxes")
            .with("leaseId", "0190")
            .with("limitingQuota", "concurrentSandboxes")
            .with("position", 3);
        let connect: ConnectError = e.into();
        let detail = connect
            .details
            .iter()
            .find(|d| d.type_url == "google.rpc.ErrorInfo")
            .expect("an ErrorInfo detail");
        assert_eq!(detail.debug.as_ref().unwrap()["leaseId"], "0190");
        assert_eq!(detail.debug.as_ref().unwrap()["position"], 3);
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(detail.value.as_deref().unwrap())
            .unwrap();
        let info = crate::proto::google::rpc::ErrorInfo::decode_from_slice(&bytes).unwrap();
        assert_eq!(info.reason, "RESOURCE_EXHAUSTED");
        assert_eq!(info.domain, "agentbay");
        assert_eq!(info.metadata["limitingQuota"], "concurrentSandboxes");
        assert_eq!(info.metadata["position"], "3");
        let field: ConnectError = ApiError::invalid("cpu", "must be above 0").into();
        assert!(
            field
                .details
                .iter()
                .any(|d| d.type_url == "google.rpc.BadRequest")
        );
    }

    #[test]
    fn internal_errors_hide_their_internals() {
        let connect: ConnectError = ApiError::internal("sled exploded at /var/lib/x").into();
        let message = connect.message.unwrap_or_default();
        assert!(!message.contains("sled"), "{message}");
        assert!(message.contains("reference"), "{message}");
    }
}
