//! RPC: the `.proto` services over Connect, gRPC and gRPC-Web, on the same
//! HTTPS port as the REST routes.
//!
//! The `connectrpc` crate does the protocols and both codecs (JSON and
//! binary protobuf); this module registers the services and authorises
//! every call in one [`AuthInterceptor`]: the caller's bearer token is
//! checked, the method's required scope ([`METHOD_ACCESS`]) enforced, and
//! the [`Principal`] put into the request context where handlers find it
//! with [`principal`]. A method missing from the table is refused, so a new
//! method cannot ship unprotected.

pub mod adapter;
pub mod admin;
pub mod capacity;
pub mod runs;
pub mod runtime;
mod shape;

use std::sync::Arc;

use connectrpc::interceptor::{StreamRequest, StreamResponse, UnaryRequest, UnaryResponse};
use connectrpc::{
    ConnectError, ConnectRpcService, Interceptor, Limits, Next, NextStream, PayloadStream,
    RequestContext,
};

use super::error::{ApiError, ErrorCode, rpc};
use crate::api::AppState;
use crate::auth::{Auth, Principal};
use crate::domain::access::Scope;
use crate::proto::agentbay::adapter::v1::AdapterExt;
use crate::proto::agentbay::admin::v1::AdminExt;
use crate::proto::agentbay::capacity::v1::CapacityExt;
use crate::proto::agentbay::runs::v1::RunsExt;
use crate::proto::agentbay::runtime::v1::RuntimeExt;

/// What a method requires of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Any authenticated caller.
    Authenticated,
    /// A caller holding the scope.
    Scope(Scope),
}

/// Required access per method (`package.Service/Method`).
pub const METHOD_ACCESS: &[(&str, Access)] = {
    use Access::{Authenticated, Scope as Needs};
    &[
        ("agentbay.admin.v1.Admin/GetVersion", Authenticated),
        ("agentbay.admin.v1.Admin/CreateClient", Needs(Scope::Admin)),
        ("agentbay.admin.v1.Admin/ListClients", Needs(Scope::Admin)),
        ("agentbay.admin.v1.Admin/RevokeClient", Needs(Scope::Admin)),
        ("agentbay.admin.v1.Admin/CreateUser", Needs(Scope::Admin)),
        ("agentbay.admin.v1.Admin/ListUsers", Needs(Scope::Admin)),
        ("agentbay.admin.v1.Admin/DisableUser", Needs(Scope::Admin)),
        ("agentbay.admin.v1.Admin/EnableUser", Needs(Scope::Admin)),
        (
            "agentbay.admin.v1.Admin/ResetUserPassword",
            Needs(Scope::Admin),
        ),
        ("agentbay.admin.v1.Admin/SetUserEmail", Needs(Scope::Admin)),
        ("agentbay.admin.v1.Admin/Backup", Needs(Scope::Platform)),
        (
            "agentbay.admin.v1.Admin/WatchEvents",
            Needs(Scope::EventsRead),
        ),
        (
            "agentbay.admin.v1.Admin/GetEventsHead",
            Needs(Scope::EventsRead),
        ),
        ("agentbay.admin.v1.Admin/PutTenant", Needs(Scope::Platform)),
        (
            "agentbay.admin.v1.Admin/TrustPublisherKey",
            Needs(Scope::Platform),
        ),
        (
            "agentbay.admin.v1.Admin/ListPublisherKeys",
            Needs(Scope::Platform),
        ),
        (
            "agentbay.admin.v1.Admin/RevokePublisherKey",
            Needs(Scope::Platform),
        ),
        (
            "agentbay.admin.v1.Admin/PutModelProfile",
            Needs(Scope::Platform),
        ),
        (
            "agentbay.admin.v1.Admin/ListModelProfiles",
            Needs(Scope::Platform),
        ),
        (
            "agentbay.admin.v1.Admin/DeleteModelProfile",
            Needs(Scope::Platform),
        ),
        (
            "agentbay.admin.v1.Admin/ReloadConfiguration",
            Needs(Scope::Platform),
        ),
        (
            "agentbay.admin.v1.Admin/ListTenants",
            Needs(Scope::Platform),
        ),
        ("agentbay.admin.v1.Admin/PutProject", Needs(Scope::Admin)),
        ("agentbay.admin.v1.Admin/RunWorker", Needs(Scope::Platform)),
        (
            "agentbay.admin.v1.Admin/AdvanceClock",
            Needs(Scope::Platform),
        ),
        (
            "agentbay.capacity.v1.Capacity/AcquireLease",
            Needs(Scope::CapacityLease),
        ),
        (
            "agentbay.capacity.v1.Capacity/RenewLease",
            Needs(Scope::CapacityLease),
        ),
        (
            "agentbay.capacity.v1.Capacity/ReleaseLease",
            Needs(Scope::CapacityLease),
        ),
        ("agentbay.runs.v1.Runs/SubmitRun", Needs(Scope::RunsWrite)),
        ("agentbay.runs.v1.Runs/GetRun", Needs(Scope::RunsRead)),
        ("agentbay.runs.v1.Runs/ListRuns", Needs(Scope::RunsRead)),
        ("agentbay.runs.v1.Runs/GetUsage", Needs(Scope::RunsRead)),
        ("agentbay.runs.v1.Runs/CancelRun", Needs(Scope::RunsWrite)),
        ("agentbay.runs.v1.Runs/HoldRun", Needs(Scope::RunsOperate)),
        (
            "agentbay.runs.v1.Runs/RerunFromCheckpoint",
            Needs(Scope::RunsOperate),
        ),
        (
            "agentbay.runs.v1.Runs/DecideApproval",
            Needs(Scope::RunsDecide),
        ),
        (
            "agentbay.runs.v1.Runs/SettleCall",
            Needs(Scope::RunsOperate),
        ),
        (
            "agentbay.runtime.v1.Runtime/Interrupt",
            Needs(Scope::RunsOperate),
        ),
        (
            "agentbay.runtime.v1.Runtime/AnswerDecision",
            Needs(Scope::RunsDecide),
        ),
        (
            "agentbay.runtime.v1.Runtime/WatchAttempt",
            Needs(Scope::RunsRead),
        ),
        (
            "agentbay.adapter.v1.Adapter/ClaimAttempt",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/StartAttempt",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/Heartbeat",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/BeginCall",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/CompleteCall",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/CallModel",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/StreamModel",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/AwaitCall",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/Checkpoint",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/RequestDecision",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/AwaitDecision",
            Needs(Scope::RunsExecute),
        ),
        (
            "agentbay.adapter.v1.Adapter/ReportOutcome",
            Needs(Scope::RunsExecute),
        ),
    ]
};

/// One method of the contract, from the descriptors (see `build.rs`).
#[derive(Clone, Copy, Debug)]
pub struct RpcMethod {
    /// `package.Service`.
    pub service: &'static str,
    /// Method name.
    pub method: &'static str,
    /// Fully qualified request message.
    pub input: &'static str,
    /// Fully qualified response message.
    pub output: &'static str,
    /// Whether the server streams responses.
    pub server_streaming: bool,
    /// Whether the client streams requests.
    pub client_streaming: bool,
    /// The method's comment in the `.proto`.
    pub doc: &'static str,
}

impl RpcMethod {
    /// `package.Service/Method`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.service, self.method)
    }
}

/// Every RPC method of the contract.
pub const RPC_METHODS: &[RpcMethod] = include!(concat!(env!("OUT_DIR"), "/rpc_methods.rs"));

/// The method of the contract a request path names (`package.Service/Method`),
/// as a static string: for labels, which must come from a fixed set.
pub fn method_of(path: &str) -> Option<&'static str> {
    let path = path.strip_prefix('/').unwrap_or(path);
    METHOD_ACCESS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(p, _)| *p)
}

/// Checks the shape of a call before the Connect service decodes it, and
/// answers what it would get wrong:
///
/// - a server-streaming method called with a unary content type
///   (`application/json`, `application/proto`) is 415 naming what to send
///   (the service would answer as if the method did not exist);
/// - a unary JSON call whose body is not an object is 400 (the decoder
///   would read `[]` as an empty message and an array positionally).
///
/// The caller is authenticated first, so that an anonymous call is
/// refused as unauthenticated whatever its shape. Every refusal is framed
/// as the call was made ([`refusal`]). Calls of other shapes pass through
/// untouched.
pub async fn precheck(
    auth: &Auth,
    max_body_bytes: usize,
    request: axum::extract::Request,
) -> Result<axum::extract::Request, axum::response::Response> {
    let name = request.uri().path().trim_start_matches('/');
    let Some((service, method_name)) = name.split_once('/') else {
        return Ok(request);
    };
    let Some(method) = RPC_METHODS
        .iter()
        .find(|m| m.service == service && m.method == method_name)
    else {
        return Ok(request);
    };
    let base = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    // Every RPC is a POST, as the contract documents it (Connect's GET
    // form of side-effect-free methods is not served). Another HTTP method
    // is no call of the protocol at all: plain HTTP 405, whatever its
    // content type.
    let verb = request.method();
    if verb != http::Method::POST {
        let mut refusal = unary_error(
            http::StatusCode::METHOD_NOT_ALLOWED,
            &ErrorCode::MethodNotAllowed,
            &format!("{verb} is not allowed on /{name}; RPC methods are called with POST"),
        );
        refusal
            .headers_mut()
            .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
        return Err(refusal);
    }
    let spoken = matches!(base.as_str(), "application/json" | "application/proto")
        || base.starts_with("application/connect+")
        || base.starts_with("application/grpc");
    if !spoken {
        return Err(unary_error(
            http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &ErrorCode::InvalidArgument,
            &format!(
                "/{name} needs a Content-Type: application/json or application/proto (Connect{}), \
                 application/connect+json or application/connect+proto (Connect streaming), \
                 or application/grpc and application/grpc-web; {}",
                if method.server_streaming || method.client_streaming {
                    ", unary methods only"
                } else {
                    ""
                },
                if base.is_empty() {
                    "none was sent".to_string()
                } else {
                    format!("{base} is not one of them")
                }
            ),
        ));
    }
    // A Connect call without a valid token, or whose token lacks what the
    // method requires, is refused with its HTTP status before anything
    // streams or its body is judged (gRPC keeps its in-protocol status).
    if !base.starts_with("application/grpc")
        && let Some(access) = access_of(&format!("/{name}"))
    {
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if let Err(e) = admit(auth, access, authorization) {
            let e = ApiError::from(e);
            return Err(refusal(&base, e.code.spec().status, &e.code, &e.detail));
        }
    }
    let codec = match base.as_str() {
        "application/json" => "json",
        "application/proto" if method.server_streaming => "proto",
        _ => return Ok(request),
    };
    if method.server_streaming {
        return Err(unary_error(
            http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &ErrorCode::InvalidArgument,
            &format!(
                "{name} streams its responses: send Content-Type application/connect+{codec} \
                 (a Connect streaming call, with an enveloped request), or use gRPC; \
                 {base} is for unary methods",
            ),
        ));
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, max_body_bytes)
        .await
        .map_err(|e| {
            let e = e.into_inner();
            if e.is::<http_body_util::LengthLimitError>() {
                unary_error(
                    http::StatusCode::PAYLOAD_TOO_LARGE,
                    &ErrorCode::PayloadTooLarge,
                    &format!(
                        "the request body is larger than this appliance accepts ({max_body_bytes} bytes, http.max_body_bytes)"
                    ),
                )
            } else {
                unary_error(
                    http::StatusCode::BAD_REQUEST,
                    &ErrorCode::InvalidArgument,
                    &format!("the request body could not be read: {e}"),
                )
            }
        })?;
    // The checks read the JSON as sent; a compressed body is read
    // uncompressed (within the same limit), and passed on as it came.
    let encoding = parts
        .headers
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let plain = match encoding.as_deref() {
        None | Some("identity") => bytes.clone(),
        Some("gzip") => {
            use std::io::Read as _;
            let mut out = Vec::new();
            let read = flate2::read::GzDecoder::new(&bytes[..])
                .take(max_body_bytes as u64 + 1)
                .read_to_end(&mut out);
            match read {
                Ok(n) if n <= max_body_bytes => out.into(),
                Ok(_) => {
                    return Err(unary_error(
                        http::StatusCode::PAYLOAD_TOO_LARGE,
                        &ErrorCode::PayloadTooLarge,
                        &format!(
                            "the request body is larger uncompressed than this appliance accepts ({max_body_bytes} bytes, http.max_body_bytes)"
                        ),
                    ));
                }
                Err(e) => {
                    return Err(unary_error(
                        http::StatusCode::BAD_REQUEST,
                        &ErrorCode::InvalidArgument,
                        &format!("the request body is not valid gzip: {e}"),
                    ));
                }
            }
        }
        // Connect answers an encoding it does not speak itself.
        Some(_) => return Ok(axum::extract::Request::from_parts(parts, bytes.into())),
    };
    let refuse = |e: ApiError| {
        use axum::response::IntoResponse;
        let e = ConnectError::from(e);
        (
            e.http_status(),
            [(http::header::CONTENT_TYPE, "application/json")],
            e.to_json(),
        )
            .into_response()
    };
    match plain.iter().find(|b| !b.is_ascii_whitespace()) {
        None => {}
        Some(b'{') => {
            let value: serde_json::Value = serde_json::from_slice(&plain).map_err(|e| {
                refuse(ApiError::new(
                    ErrorCode::MalformedJson,
                    format!("the request body is not valid JSON: {e}"),
                ))
            })?;
            shape::check(method.input, &value).map_err(|e| refuse(e.into()))?;
        }
        Some(_) => {
            return Err(unary_error(
                http::StatusCode::BAD_REQUEST,
                &ErrorCode::InvalidArgument,
                "the request body must be a JSON object ({...})",
            ));
        }
    }
    Ok(axum::extract::Request::from_parts(parts, bytes.into()))
}

/// A refusal before the Connect service sees the call, framed as the call
/// was made: a Connect streaming call (`application/connect+json` or
/// `+proto`) gets HTTP 200 and the error in its end-of-stream message, as
/// the Connect protocol puts every streaming error; anything else the
/// unary error with its HTTP status.
fn refusal(
    content_type: &str,
    status: http::StatusCode,
    code: &ErrorCode,
    message: &str,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if !content_type.starts_with("application/connect+") {
        return unary_error(status, code, message);
    }
    let end = serde_json::json!({
        "error": { "code": code.spec().connect.as_str(), "message": message }
    })
    .to_string();
    // The envelope: flags (0x02, end of stream), the length, the message.
    let mut body = Vec::with_capacity(5 + end.len());
    body.push(0x02);
    body.extend_from_slice(&(end.len() as u32).to_be_bytes());
    body.extend_from_slice(end.as_bytes());
    let content_type = http::HeaderValue::from_str(content_type)
        .unwrap_or(http::HeaderValue::from_static("application/connect+json"));
    (
        http::StatusCode::OK,
        [(http::header::CONTENT_TYPE, content_type)],
        body,
    )
        .into_response()
}

/// "Unavailable, come back in `retry_after` seconds" before the call is
/// read, in the caller's protocol: Connect unary (503 with Retry-After),
/// Connect streaming (the end-of-stream envelope), gRPC and gRPC-Web (a
/// trailers-only answer, status 14, with Retry-After).
pub fn come_back(content_type: &str, message: &str, retry_after: u32) -> axum::response::Response {
    let base = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let mut response = if base.starts_with("application/grpc") {
        let mut response = axum::response::Response::new(axum::body::Body::empty());
        let headers = response.headers_mut();
        let kind = http::HeaderValue::from_str(&base)
            .unwrap_or(http::HeaderValue::from_static("application/grpc"));
        headers.insert(http::header::CONTENT_TYPE, kind);
        headers.insert("grpc-status", http::HeaderValue::from_static("14"));
        let encoded: String = message
            .bytes()
            .map(|b| {
                if (0x20..0x7f).contains(&b) && b != b'%' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        if let Ok(v) = http::HeaderValue::from_str(&encoded) {
            headers.insert("grpc-message", v);
        }
        response
    } else {
        refusal(
            &base,
            http::StatusCode::SERVICE_UNAVAILABLE,
            &ErrorCode::Unavailable,
            message,
        )
    };
    response.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from(retry_after),
    );
    response
}

/// A Connect unary error: JSON `code` and `message` with an HTTP status.
fn unary_error(
    status: http::StatusCode,
    code: &ErrorCode,
    message: &str,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let code = code.spec().connect.as_str();
    (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "code": code, "message": message }).to_string(),
    )
        .into_response()
}

/// The access a method requires, if it is known.
pub fn access_of(path: &str) -> Option<Access> {
    let path = path.strip_prefix('/').unwrap_or(path);
    METHOD_ACCESS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, a)| *a)
}

/// The caller's tenant, or (PlatformAdmin) the one a request names.
pub fn tenant_scope(
    caller: &Principal,
    tenant: &str,
) -> Result<crate::domain::access::TenantScope, ConnectError> {
    if tenant.is_empty() {
        return Ok(caller.tenant_scope());
    }
    let id = crate::domain::TenantId::parse_field("tenantId", tenant).map_err(rpc)?;
    caller.scope_for(&id).map_err(rpc)
}

/// An optional time on the wire: RFC 3339, or empty.
pub fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.to_rfc3339()).unwrap_or_default()
}

/// The principal the interceptor put into the context.
pub fn principal(ctx: &RequestContext) -> Result<Principal, ConnectError> {
    ctx.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| ConnectError::internal("the call was not authenticated"))
}

/// Authenticates and authorises every RPC.
pub struct AuthInterceptor {
    auth: Arc<Auth>,
}

impl AuthInterceptor {
    fn authorize(&self, ctx: &mut RequestContext) -> Result<(), ConnectError> {
        let path = ctx.path().unwrap_or_default().to_string();
        let access = access_of(&path).ok_or_else(|| {
            ConnectError::from(ApiError::new(
                ErrorCode::PermissionDenied,
                format!("{path} has no declared access rule and is refused"),
            ))
        })?;
        let header = ctx
            .header(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let principal = admit(&self.auth, access, header).map_err(super::error::rpc)?;
        ctx.extensions_mut().insert(principal);
        Ok(())
    }
}

/// The caller of a method, if its token is valid and holds what the
/// method requires.
fn admit(
    auth: &Auth,
    access: Access,
    authorization: Option<&str>,
) -> Result<Principal, crate::auth::AuthError> {
    let principal = auth.authenticate(authorization)?;
    if let Access::Scope(scope) = access {
        principal.require(scope)?;
    }
    Ok(principal)
}

#[connectrpc::async_trait]
impl Interceptor for AuthInterceptor {
    async fn intercept_unary(
        &self,
        mut req: UnaryRequest,
        next: Next<'_>,
    ) -> Result<UnaryResponse, ConnectError> {
        self.authorize(&mut req.ctx)?;
        next.run(req).await
    }

    async fn intercept_streaming(
        &self,
        mut req: StreamRequest,
        inbound: PayloadStream,
        next: NextStream<'_>,
    ) -> Result<StreamResponse, ConnectError> {
        self.authorize(&mut req.ctx)?;
        next.run(req, inbound).await
    }
}

/// The Connect service with every RPC service registered.
pub fn service(state: &AppState) -> ConnectRpcService {
    let router = connectrpc::Router::new();
    let router = Arc::new(admin::AdminService::new(state.clone())).register(router);
    let router = Arc::new(capacity::CapacityService::new(state.clone())).register(router);
    let router = Arc::new(runs::RunsService::new(state.clone())).register(router);
    let router = Arc::new(runtime::RuntimeService::new(state.clone())).register(router);
    let router = Arc::new(adapter::AdapterService::new(state.clone())).register(router);
    ConnectRpcService::new(router)
        .with_limits(Limits::default().with_max_request_body_size(state.config.http.max_body_bytes))
        .with_interceptor(AuthInterceptor {
            auth: state.auth.clone(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn come_back_speaks_each_protocol_with_retry_after() {
        let header = |r: &axum::response::Response, name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let grpc = come_back("application/grpc+proto", "down 1.0 s (100%)", 1);
        assert_eq!(grpc.status(), http::StatusCode::OK);
        assert_eq!(header(&grpc, "grpc-status").as_deref(), Some("14"));
        assert_eq!(
            header(&grpc, "grpc-message").as_deref(),
            Some("down 1.0 s (100%25)")
        );
        assert_eq!(header(&grpc, "retry-after").as_deref(), Some("1"));

        let unary = come_back("application/json; charset=utf-8", "down", 1);
        assert_eq!(unary.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&unary, "retry-after").as_deref(), Some("1"));
        let body = axum::body::to_bytes(unary.into_body(), 1024).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["code"], "unavailable");

        let stream = come_back("application/connect+json", "down", 1);
        assert_eq!(stream.status(), http::StatusCode::OK);
        assert_eq!(header(&stream, "retry-after").as_deref(), Some("1"));
        let body = axum::body::to_bytes(stream.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(body[0], 0x02, "an end-of-stream envelope");
        let end: serde_json::Value = serde_json::from_slice(&body[5..]).unwrap();
        assert_eq!(end["error"]["code"], "unavailable");
    }

    #[test]
    fn every_method_of_the_contract_has_an_access_rule() {
        assert!(!RPC_METHODS.is_empty());
        for m in RPC_METHODS {
            assert!(
                access_of(&m.path()).is_some(),
                "{} has no access rule",
                m.path()
            );
        }
        for (path, _) in METHOD_ACCESS {
            assert!(
                RPC_METHODS.iter().any(|m| m.path() == *path),
                "{path} is in the access table but not in the contract"
            );
        }
    }
}
