//! A unary Connect JSON request checked against the published schema of its
//! message (`/openapi.json`, written by build.rs from the `.proto` files)
//! before it is decoded, so that a client's mistake is refused naming the
//! field and the reason, as on the REST routes:
//!
//! - a field the message does not have (proto3 JSON accepts the field's
//!   JSON name and its proto name; anything else is a typo that would
//!   otherwise be dropped in silence);
//! - a value of the wrong type, out of range, or not of the documented
//!   form (a UUID, a slug, one of the listed values).
//!
//! The binary protocols (proto, gRPC) carry no names to misspell and no
//! values of a wrong JSON type; their values are checked by the handlers.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use jsonschema::error::ValidationErrorKind;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};

use crate::domain::FieldError;

/// The first mistake in `body`, a request of the message `message` (its
/// full proto name), as a field error.
pub fn check(message: &str, body: &Value) -> Result<(), FieldError> {
    let schemas = schemas();
    let root = json!({ "$ref": reference(message) });
    let mut path = String::new();
    let body = normalize(schemas, &root, body, &mut path)
        .map_err(|(field, reason)| FieldError::new(field, reason))?;
    let Some(validator) = validator(message) else {
        return Ok(());
    };
    let first = validator.iter_errors(&body).next();
    match first {
        Some(error) => {
            let (at, reason) = describe(&error);
            let field = field_path(&at);
            Err(FieldError::new(
                if field.is_empty() { "body" } else { &field },
                reason,
            ))
        }
        None => Ok(()),
    }
}

/// Every schema of the document, by name.
fn schemas() -> &'static Map<String, Value> {
    crate::api::openapi::document()["components"]["schemas"]
        .as_object()
        .expect("components.schemas is an object")
}

fn reference(message: &str) -> String {
    format!("#/components/schemas/{message}")
}

/// The compiled schema of a message, made at its first use.
fn validator(message: &str) -> Option<Arc<jsonschema::Validator>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Arc<jsonschema::Validator>>>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().get(message) {
        return v.clone();
    }
    // Only the schemas the message reaches: a compiled copy of the whole
    // document per message would cost megabytes.
    let schemas = self::schemas();
    let mut reached = Map::new();
    let mut todo = vec![message.to_string()];
    while let Some(name) = todo.pop() {
        if reached.contains_key(&name) {
            continue;
        }
        if let Some(schema) = schemas.get(&name) {
            crate::api::openapi::refs(schema, &mut todo);
            reached.insert(name, schema.clone());
        }
    }
    let schema = json!({
        "$ref": reference(message),
        "components": { "schemas": reached },
    });
    let compiled = match jsonschema::validator_for(&schema) {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            tracing::error!(message, error = %e, "a request schema does not compile; its requests are not checked");
            None
        }
    };
    cache.lock().insert(message.to_string(), compiled.clone());
    compiled
}

/// The schema a `$ref` names, or the schema itself.
fn resolve<'a>(schemas: &'a Map<String, Value>, schema: &'a Value) -> (&'a Value, Option<&'a str>) {
    match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
    {
        Some(name) => match schemas.get(name) {
            Some(s) => (s, Some(name)),
            None => (schema, None),
        },
        None => (schema, None),
    }
}

/// The first schema `pick` takes among `schema` and its alternatives,
/// looking through references.
fn find<'a, T>(
    schemas: &'a Map<String, Value>,
    schema: &'a Value,
    pick: &impl Fn(&'a Value, Option<&'a str>) -> Option<T>,
) -> Option<T> {
    let (s, name) = resolve(schemas, schema);
    pick(s, name).or_else(|| {
        s.get("anyOf")?
            .as_array()?
            .iter()
            .find_map(|branch| find(schemas, branch, pick))
    })
}

/// The schema of an object (a message, or a map) that `schema` allows.
fn object_schema<'a>(
    schemas: &'a Map<String, Value>,
    schema: &'a Value,
) -> Option<(&'a Value, Option<&'a str>)> {
    find(schemas, schema, &|s: &'a Value, name| {
        (s.get("properties").is_some() || s.get("additionalProperties").is_some())
            .then_some((s, name))
    })
}

/// The schema of a list's items that `schema` allows.
fn items_schema<'a>(schemas: &'a Map<String, Value>, schema: &'a Value) -> Option<&'a Value> {
    find(schemas, schema, &|s: &'a Value, _| s.get("items"))
}

/// A field's JSON name from its proto name (`tenant_id` -> `tenantId`).
fn json_name(proto: &str) -> String {
    let mut out = String::with_capacity(proto.len());
    let mut upper = false;
    for c in proto.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// `value` with every field under its JSON name, or the first key, at any
/// depth, that its message does not have (path, reason).
fn normalize(
    schemas: &Map<String, Value>,
    schema: &Value,
    value: &Value,
    path: &mut String,
) -> Result<Value, (String, String)> {
    match value {
        Value::Object(fields) => {
            let Some((object, name)) = object_schema(schemas, schema) else {
                return Ok(value.clone());
            };
            let properties = object.get("properties").and_then(Value::as_object);
            let mut out = Map::new();
            for (key, inner) in fields {
                let at = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                let (key, inner_schema) = match properties {
                    Some(p) => {
                        let renamed = json_name(key);
                        match (p.get(key), p.get(&renamed)) {
                            (Some(s), _) => (key.clone(), Some(s)),
                            (None, Some(s)) => (renamed, Some(s)),
                            (None, None) => {
                                let known: Vec<&str> = p.keys().map(String::as_str).collect();
                                let message = name
                                    .map(|n| n.rsplit('.').next().unwrap_or(n))
                                    .unwrap_or("this message");
                                let field = if path.is_empty() { "body" } else { path };
                                return Err((
                                    field.to_string(),
                                    format!(
                                        "{key:?} is not a field of {message}; its fields are {}",
                                        known.join(", ")
                                    ),
                                ));
                            }
                        }
                    }
                    // A map: every value has the same schema.
                    None => (key.clone(), object.get("additionalProperties")),
                };
                let inner = match inner_schema {
                    Some(s) => normalize(schemas, s, inner, path)?,
                    None => inner.clone(),
                };
                out.insert(key, inner);
                path.truncate(at);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => {
            let Some(schema) = items_schema(schemas, schema) else {
                return Ok(value.clone());
            };
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let at = path.len();
                path.push_str(&format!("[{i}]"));
                out.push(normalize(schemas, schema, item, path)?);
                path.truncate(at);
            }
            Ok(Value::Array(out))
        }
        _ => Ok(value.clone()),
    }
}

/// Where an error is and what it says. An `anyOf` (an optional field may
/// also be null, an optional text also empty) says what its first
/// alternative found, unless that is only a wrong type and another
/// alternative says more.
fn describe(error: &jsonschema::ValidationError<'_>) -> (String, String) {
    if let ValidationErrorKind::AnyOf { context } = error.kind() {
        // `Needs one of: a, b`: every alternative misses a field.
        let missing: Option<Vec<String>> = context
            .iter()
            .map(|branch| match branch.as_slice() {
                [only] => match only.kind() {
                    ValidationErrorKind::Required { property } => {
                        property.as_str().map(str::to_string)
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        if let Some(names) = missing.filter(|n| n.len() > 1) {
            let at = error.instance_path().to_string();
            let first = if at.is_empty() {
                names[0].clone()
            } else {
                format!("{at}/{}", names[0])
            };
            return (
                first,
                format!("is required, or else {}", names[1..].join(" or ")),
            );
        }
        let telling = context
            .iter()
            .find(|branch| {
                branch
                    .iter()
                    .any(|e| !matches!(e.kind(), ValidationErrorKind::Type { .. }))
            })
            .or_else(|| context.first());
        if let Some(first) = telling.and_then(|b| b.first()) {
            return describe(first);
        }
    }
    // A text the domain checks is refused in the words of its rule, not
    // with the published pattern's regex.
    if let ValidationErrorKind::Pattern { pattern } = error.kind()
        && let Some(text) = error.instance().as_str()
        && let Some(reason) = WORDED
            .iter()
            .find(|(p, _)| p == pattern)
            .and_then(|(_, rule)| rule(text))
    {
        return (error.instance_path().to_string(), reason);
    }
    (error.instance_path().to_string(), error.to_string())
}

/// A domain rule: why a text is refused, or None.
type Rule = fn(&str) -> Option<String>;

/// Published patterns and the domain rules they stand for: a refusal's
/// reason is the rule's own.
const WORDED: &[(&str, Rule)] = &[
    (crate::domain::user::EMAIL_PATTERN, |text| {
        crate::domain::user::parse_email("", text)
            .err()
            .map(|e| e.reason)
    }),
    (crate::domain::user::USERNAME_PATTERN, |text| {
        crate::domain::user::parse_username(text)
            .err()
            .map(|e| e.reason)
    }),
];

/// `/retention/payloadDays` -> `retention.payloadDays`; `/roles/0` ->
/// `roles[0]`.
fn field_path(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        let part = part.replace("~1", "/").replace("~0", "~");
        if part.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{part}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(message: &str, body: Value) -> (String, String) {
        let e = check(message, &body).expect_err("refused");
        (e.field.clone(), e.reason.clone())
    }

    #[test]
    fn a_misspelt_field_is_named_at_any_depth() {
        let (field, reason) = refused(
            "agentbay.runs.v1.ListRunsRequest",
            json!({"tenantID": "demo"}),
        );
        assert_eq!(field, "tenantID");
        assert!(reason.contains("tenantId"), "{reason}");
        // The proto name is proto3 JSON too.
        check(
            "agentbay.runs.v1.ListRunsRequest",
            &json!({"tenant_id": "demo", "pageSize": 3}),
        )
        .unwrap();
    }

    #[test]
    fn a_wrong_value_names_its_field_and_the_reason() {
        let (field, reason) = refused("agentbay.runs.v1.ListRunsRequest", json!({"pageSize": -1}));
        assert_eq!(field, "pageSize");
        assert!(reason.contains("minimum"), "{reason}");
        let (field, reason) = refused(
            "agentbay.runs.v1.ListRunsRequest",
            json!({"pageAfter": "not-a-uuid"}),
        );
        assert_eq!(field, "pageAfter");
        assert!(reason.contains("does not match"), "{reason}");
        let (field, _) = refused(
            "agentbay.runs.v1.ListRunsRequest",
            json!({"state": "Sleeping"}),
        );
        assert_eq!(field, "state");
    }

    #[test]
    fn a_text_the_domain_checks_is_refused_in_its_rules_words() {
        let (field, reason) = refused(
            "agentbay.admin.v1.SetUserEmailRequest",
            json!({"tenantId": "demo", "username": "Alice", "email": "alice at site"}),
        );
        assert_eq!(field, "email");
        assert!(reason.contains("is not a mail address"), "{reason}");
        let (field, reason) = refused(
            "agentbay.admin.v1.DisableUserRequest",
            json!({"tenantId": "demo", "username": "Alice"}),
        );
        assert_eq!(field, "username");
        assert!(reason.contains("is not a user name"), "{reason}");
    }

    #[test]
    fn alternatives_and_conditions_read_as_the_contract_says() {
        let (field, reason) = refused(
            "agentbay.runs.v1.DecideApprovalRequest",
            json!({"approve": true}),
        );
        assert_eq!(field, "approvalId");
        assert!(reason.contains("decisionId"), "{reason}");
        let settle = |effect: &str| {
            json!({
                "attemptId": "01a23682-051c-7550-ba3d-6553f5e67547",
                "callId": "01a23682-051c-7550-ba3d-6553f5e67548",
                "effect": effect,
                "reason": "checked the pager",
                "retry": true,
            })
        };
        check(
            "agentbay.runs.v1.SettleCallRequest",
            &settle("did-not-happen"),
        )
        .unwrap();
        let (field, _) = refused("agentbay.runs.v1.SettleCallRequest", settle("happened"));
        assert_eq!(field, "effect");
    }

    #[test]
    fn paths_read_as_fields() {
        assert_eq!(
            field_path("/retention/payloadDays"),
            "retention.payloadDays"
        );
        assert_eq!(field_path("/roles/0"), "roles[0]");
        assert_eq!(field_path(""), "");
    }
}
