//! `GET /openapi.json`: every REST route, generated from the handlers'
//! annotations, and every RPC method, generated from the `.proto`
//! descriptors, in one OpenAPI 3.1 document.

use std::sync::OnceLock;

use axum::Json;
use serde_json::{Value, json};
use utoipa::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};

use super::rpc::{Access, RPC_METHODS, access_of};
use super::{audit, capacity, events, export, health, oauth, releases, runtime, tenants, webhooks};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agentbay",
        description = "On-prem runtime for AI agents. REST routes answer JSON and problem+json (RFC 9457); RPC methods speak Connect (JSON and binary protobuf), gRPC and gRPC-Web on the same port. Authenticate with a bearer token from POST /oauth/token.",
        license(name = "Apache-2.0")
    ),
    paths(
        oauth::token, events::sse, events::head, health::healthz, health::readyz, health::metrics,
        capacity::list_pools, capacity::set_pool, capacity::pool_queue, capacity::get_quotas, capacity::set_quota,
        capacity::list_leases, capacity::get_lease, capacity::my_queue, capacity::accounting, capacity::usage,
        tenants::list, tenants::get, tenants::put, tenants::put_project,
        releases::import, releases::list, releases::get, releases::deprecate, releases::revoke,
        runtime::get_attempt, runtime::list_checkpoints, runtime::watch_attempt, runtime::model_text,
        export::export_run,
        runtime::get_call, runtime::get_artifact,
        webhooks::list, webhooks::create, webhooks::get, webhooks::put, webhooks::delete,
        webhooks::rotate, webhooks::deliveries, webhooks::redeliver,
        audit::list, audit::verify,
    ),
    components(schemas(
        oauth::TokenRequest,
        oauth::TokenResponse,
        health::Readiness,
        runtime::AttemptUpdate,
        crate::domain::capacity::LeaseState,
        crate::domain::capacity::QuotaScope,
    )),
    modifiers(&BearerAuth),
    tags(
        (name = "auth", description = "Client credentials and tokens"),
        (name = "events", description = "The outbox as a resumable stream"),
        (name = "operations", description = "Probes and metrics"),
        (name = "capacity", description = "Worker pools, quotas and capacity leases"),
        (name = "tenants", description = "The tenant and project registry"),
        (name = "releases", description = "Signed release bundles and what this appliance verified"),
        (name = "runtime", description = "Attempt timelines, checkpoints and live watches"),
        (name = "webhooks", description = "Signed webhook endpoints and their deliveries"),
        (name = "audit", description = "Who did what, from where, and what it changed: a hash chain"),
    )
)]
struct RestApi;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// Slugs: tenants, projects, pools (see `domain::ids`).
const SLUG: &str = "^[a-z0-9][a-z0-9-]{0,62}$";

/// UUIDs in their hyphenated form (`domain::ids::parse_uuid`).
const UUID: &str = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";

/// Release ids (`domain::release::parse_release_id`).
const RELEASE_ID: &str = "^[a-z0-9][a-z0-9.-]{0,127}$";

/// Completes every REST operation by one rule, so that the document says
/// everything a route may answer and what its parameters must look like:
/// a route with parameters or a body may answer 400, a route with a token
/// 401 and 403, a route with a path parameter 404, a route that writes 409
/// (a concurrent change won) and 503 (the store cannot accept writes), a
/// route with a body 413 and 415 — each as `application/problem+json`; identifiers are typed
/// as the handlers parse them (slugs, UUIDs, content hashes), other text
/// parameters are not empty.
/// The names of the component schemas `schema` refers to, at any depth,
/// appended to `out`.
pub fn refs(schema: &Value, out: &mut Vec<String>) {
    match schema {
        Value::Object(m) => {
            if let Some(name) = m
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
            {
                out.push(name.to_string());
            }
            m.values().for_each(|v| refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// The REST parser refuses a key a body's type does not read, at any depth
/// (`api::json`): every object a request body can hold says so.
fn close_request_bodies(doc: &mut Value) {
    fn close(schema: &mut Value) {
        match schema {
            Value::Object(m) => {
                if m.contains_key("properties") && !m.contains_key("additionalProperties") {
                    m.insert("additionalProperties".into(), Value::Bool(false));
                }
                m.values_mut().for_each(close);
            }
            Value::Array(items) => items.iter_mut().for_each(close),
            _ => {}
        }
    }
    let mut todo = Vec::new();
    if let Some(paths) = doc["paths"].as_object_mut() {
        for op in paths.values_mut().filter_map(Value::as_object_mut) {
            for body in op.values_mut().filter_map(|o| o.get_mut("requestBody")) {
                refs(body, &mut todo);
                close(body);
            }
        }
    }
    let mut done = std::collections::BTreeSet::new();
    while let Some(name) = todo.pop() {
        if !done.insert(name.clone()) {
            continue;
        }
        if let Some(schema) = doc["components"]["schemas"].get_mut(&name) {
            refs(schema, &mut todo);
            close(schema);
        }
    }
}

fn complete_rest(doc: &mut Value) {
    doc["components"]["schemas"]["Problem"] = json!({
        "type": "object",
        "description": "An RFC 9457 problem: what went wrong, the field at fault, in words",
        "required": ["type", "title", "status", "detail", "code"],
        "properties": {
            "type": { "type": "string" },
            "title": { "type": "string" },
            "status": { "type": "integer" },
            "detail": { "type": "string" },
            "code": { "type": "string" },
            "field": { "type": "string" },
        },
    });
    let problem = |what: &str| {
        json!({
            "description": what,
            "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } },
        })
    };
    let paths = doc["paths"].as_object_mut().expect("paths is an object");
    for (path, ops) in paths.iter_mut() {
        let Some(ops) = ops.as_object_mut() else {
            continue;
        };
        for (method, op) in ops.iter_mut() {
            let writes = matches!(method.as_str(), "post" | "put" | "patch" | "delete");
            let parameters = op
                .get_mut("parameters")
                .and_then(Value::as_array_mut)
                .map(std::mem::take)
                .unwrap_or_default();
            let has_parameters = !parameters.is_empty();
            let parameters: Vec<Value> = parameters
                .into_iter()
                .map(|mut p| {
                    let name = p["name"].as_str().unwrap_or_default().to_string();
                    let schema = &mut p["schema"];
                    // A parameter is given or absent, never null.
                    if let Some(types) = schema["type"].as_array_mut() {
                        types.retain(|t| t != "null");
                        if types.len() == 1 {
                            schema["type"] = types[0].clone();
                        }
                    }
                    match name.as_str() {
                        "tenant" | "tenantId" | "projectId" | "poolId" => {
                            schema["pattern"] = json!(SLUG);
                        }
                        "attemptId" | "callId" | "leaseId" | "runId" | "before" => {
                            schema["pattern"] = json!(UUID);
                        }
                        "releaseId" => schema["pattern"] = json!(RELEASE_ID),
                        "after" | "until" | "Last-Event-ID" => {
                            // Outbox sequences: u64.
                            schema["minimum"] = json!(0);
                            schema["maximum"] = json!(u64::MAX);
                        }
                        "limit" => {
                            schema["minimum"] = json!(1);
                            schema["maximum"] = json!(5000);
                        }
                        "hash" => schema["pattern"] = json!("^sha256:[0-9a-f]{64}$"),
                        "holderId" => schema["pattern"] = json!("^[A-Za-z0-9_.:-]{1,128}$"),
                        "scope" => {
                            // `domain::capacity::QuotaScope::parse`.
                            let s = "[a-z0-9][a-z0-9-]{0,62}";
                            schema["pattern"] = json!(format!(
                                "^(edition\\.{s}|tenant\\.{s}|project\\.{s}\\.{s})$"
                            ));
                        }
                        _ if schema["type"] == "string" => schema["minLength"] = json!(1),
                        _ => {}
                    }
                    p
                })
                .collect();
            if has_parameters {
                op["parameters"] = Value::Array(parameters);
            }
            let secured = op["security"].as_array().is_some_and(|s| !s.is_empty());
            let has_body = op.get("requestBody").is_some();
            let responses = op["responses"].as_object_mut().expect("responses");
            for r in responses.values_mut() {
                if let Some(c) = r.pointer_mut("/content/application~1problem+json")
                    && c.get("schema").is_none()
                {
                    c["schema"] = json!({ "$ref": "#/components/schemas/Problem" });
                }
            }
            let mut add = |code: &str, what: &str| {
                responses.entry(code).or_insert_with(|| problem(what));
            };
            if has_parameters || has_body {
                add(
                    "400",
                    "A parameter or the body is not valid; the problem names it",
                );
            }
            if secured {
                add("401", "No valid token");
                add(
                    "403",
                    "The token lacks the scope, or acts for another tenant",
                );
            }
            if path.contains('{') {
                add("404", "Nothing of the caller's tenant has that id");
            }
            if writes && secured {
                add(
                    "409",
                    "A concurrent change to the same record won; read it again and retry",
                );
                add(
                    "503",
                    "The store cannot accept writes now (see /readyz); nothing was changed",
                );
            }
            if has_body {
                add("413", "The body is larger than http.max_body_bytes");
                add("415", "The body is not of a documented content type");
            }
        }
    }
}

/// The document, built once.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(RestApi::openapi()).expect("the OpenAPI document serialises");
        doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
        // Every message of the contract in its proto3 JSON form (build.rs).
        let rpc: serde_json::Map<String, Value> =
            serde_json::from_str(include_str!(concat!(env!("OUT_DIR"), "/rpc_schemas.json")))
                .expect("build.rs writes the RPC schemas as JSON");
        let schemas = doc["components"]["schemas"]
            .as_object_mut()
            .expect("components.schemas is an object");
        schemas.extend(rpc);
        schemas.insert(
            "ConnectError".into(),
            json!({
                "type": "object",
                "required": ["code"],
                "properties": {
                    "code": { "type": "string", "description": "canceled, unknown, invalid_argument, deadline_exceeded, not_found, already_exists, permission_denied, resource_exhausted, failed_precondition, aborted, out_of_range, unimplemented, internal, unavailable, data_loss or unauthenticated" },
                    "message": { "type": "string" },
                    "details": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "description": "A google.protobuf.Any: its type and its value in binary protobuf, base64",
                            "properties": {
                                "type": { "type": "string" },
                                "value": { "type": "string" },
                                "debug": {},
                            },
                        },
                    },
                },
            }),
        );
        complete_rest(&mut doc);
        close_request_bodies(&mut doc);
        let paths = doc["paths"].as_object_mut().expect("paths is an object");
        for m in RPC_METHODS {
            let access = match access_of(&m.path()) {
                Some(Access::Scope(scope)) => format!("Requires the scope `{scope}`."),
                _ => "Requires any valid token.".to_string(),
            };
            let shape = match (m.client_streaming, m.server_streaming) {
                (false, false) => "unary",
                (false, true) => "server-streaming",
                (true, false) => "client-streaming",
                (true, true) => "bidi-streaming",
            };
            let (service_short, _) = m.service.rsplit_once('.').map(|(_, s)| (s, ())).unwrap_or((m.service, ()));
            let schema = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
            let (content, response) = if m.server_streaming || m.client_streaming {
                (
                    json!({
                        "application/connect+json": {},
                        "application/connect+proto": {},
                        "application/grpc": {},
                        "application/grpc-web": {},
                    }),
                    json!({
                        "description": format!(
                            "A stream of `{}` (Connect streaming envelopes). Every error, a refusal \
                             before the first message included (unauthenticated, permission_denied), \
                             is in the end-of-stream message with HTTP 200, as the Connect protocol \
                             puts streaming errors.",
                            m.output
                        ),
                        "content": { "application/connect+json": {} },
                    }),
                )
            } else {
                // JSON is the codec a schema describes; the binary codecs
                // (application/proto, gRPC, gRPC-Web) carry the same
                // messages (see x-rpc.codecs and /proto/).
                (
                    json!({
                        "application/json": { "schema": schema(m.input) },
                    }),
                    json!({
                        "description": format!("`{}`", m.output),
                        "content": { "application/json": { "schema": schema(m.output) } },
                    }),
                )
            };
            paths.insert(
                format!("/{}", m.path()),
                json!({
                    "post": {
                        "tags": [format!("rpc: {service_short}")],
                        "operationId": m.path().replace(['/', '.'], "_"),
                        "summary": m.doc,
                        "description": format!(
                            "{} RPC `{}`. Request `{}`, response `{}` (see /proto/). {}",
                            shape, m.path(), m.input, m.output, access
                        ),
                        "requestBody": { "required": true, "content": content },
                        "responses": {
                            "200": response,
                            "default": {
                                "description": "A Connect error",
                                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ConnectError" } } },
                            }
                        },
                        "security": [{ "bearer": [] }],
                        "x-rpc": {
                            "codecs": if m.server_streaming || m.client_streaming {
                                json!(["application/connect+json", "application/connect+proto", "application/grpc", "application/grpc-web"])
                            } else {
                                json!(["application/json", "application/proto", "application/grpc", "application/grpc-web"])
                            },
                            "service": m.service,
                            "method": m.method,
                            "input": m.input,
                            "output": m.output,
                            "serverStreaming": m.server_streaming,
                            "clientStreaming": m.client_streaming,
                        }
                    }
                }),
            );
        }
        doc
    })
}

/// Serves the document.
pub async fn openapi_json() -> Json<Value> {
    Json(document().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rpc_method_has_json_schemas_and_every_reference_resolves() {
        let doc = document();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for m in RPC_METHODS {
            let op = &doc["paths"][format!("/{}", m.path())]["post"];
            if m.server_streaming || m.client_streaming {
                continue;
            }
            assert_eq!(
                op["requestBody"]["content"]["application/json"]["schema"]["$ref"],
                format!("#/components/schemas/{}", m.input)
            );
            assert_eq!(
                op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
                format!("#/components/schemas/{}", m.output)
            );
        }
        // Field names are the proto3 JSON names; 64-bit integers accept
        // strings; an optional field may be null (absent); a required one
        // is required, a UUID in its hyphenated form.
        let run = &schemas["agentbay.runs.v1.Run"]["properties"];
        assert!(run["runId"].is_object() && run["run_id"].is_null());
        let begin = &schemas["agentbay.adapter.v1.BeginCallRequest"];
        assert_eq!(
            begin["properties"]["fencingToken"]["anyOf"][0]["type"],
            json!(["string", "integer"])
        );
        assert_eq!(
            begin["properties"]["fencingToken"]["anyOf"][1]["type"],
            "null"
        );
        assert!(
            begin["required"]
                .as_array()
                .unwrap()
                .contains(&json!("attemptId"))
        );
        assert_eq!(begin["properties"]["attemptId"]["pattern"], UUID);
        // A text holding a JSON document says so.
        let report = &schemas["agentbay.adapter.v1.ReportOutcomeRequest"];
        assert!(
            report.to_string().contains(r#""format":"json""#),
            "{report}"
        );
        fn refs(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    if let Some(Value::String(r)) = o.get("$ref") {
                        out.push(r.clone());
                    }
                    o.values().for_each(|x| refs(x, out));
                }
                Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        refs(doc, &mut all);
        for r in all {
            let name = r.trim_start_matches("#/components/schemas/");
            assert!(schemas.contains_key(name), "{r} does not resolve");
        }
    }

    #[test]
    fn the_document_lists_rest_routes_and_rpc_methods() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        assert!(paths.contains_key("/oauth/token"));
        assert!(paths.contains_key("/events"));
        for m in RPC_METHODS {
            let p = &paths[&format!("/{}", m.path())];
            assert_eq!(p["post"]["x-rpc"]["method"], m.method);
        }
        assert_eq!(
            doc["paths"]["/agentbay.admin.v1.Admin/WatchEvents"]["post"]["x-rpc"]["serverStreaming"],
            true
        );
    }

    /// Every body of every operation, and every schema they use, says what
    /// it holds: no object without properties (a bare `Object`), except
    /// where a JSON document of the caller's is the content.
    #[test]
    fn no_schema_is_a_bare_object() {
        fn walk(v: &Value, at: &str, bare: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    let is_object = match o.get("type") {
                        Some(Value::String(t)) => t == "object",
                        Some(Value::Array(ts)) => ts.contains(&json!("object")),
                        _ => false,
                    };
                    let said = [
                        "properties",
                        "additionalProperties",
                        "allOf",
                        "oneOf",
                        "anyOf",
                        "$ref",
                    ]
                    .iter()
                    .any(|k| o.contains_key(*k));
                    if is_object && !said {
                        bare.push(at.to_string());
                    }
                    for (k, x) in o {
                        walk(x, &format!("{at}/{k}"), bare);
                    }
                }
                Value::Array(a) => {
                    for (i, x) in a.iter().enumerate() {
                        walk(x, &format!("{at}/{i}"), bare);
                    }
                }
                _ => {}
            }
        }
        let doc = document();
        let mut bare = Vec::new();
        walk(&doc["paths"], "paths", &mut bare);
        walk(&doc["components"]["schemas"], "schemas", &mut bare);
        assert!(bare.is_empty(), "bare objects: {bare:#?}");
        // Every success of a REST route says its content and its schema.
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                if op.get("x-rpc").is_some() {
                    // Streams are Connect envelopes of the named message.
                    continue;
                }
                for (code, r) in op["responses"].as_object().unwrap() {
                    if !code.starts_with('2') || code == "204" {
                        continue;
                    }
                    let content = r["content"].as_object();
                    assert!(
                        content.is_some_and(
                            |c| !c.is_empty() && c.values().all(|m| m["schema"].is_object())
                        ),
                        "{method} {path} {code} does not say what it answers: {r}"
                    );
                }
            }
        }
    }
}
