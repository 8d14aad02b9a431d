//! JSON request bodies, rejected in the API's own error shape.
//!
//! [`ApiJson`] replaces axum's `Json` extractor so that a wrong content
//! type (415), a body over the limit (413), malformed JSON (400
//! `malformed-json`, with line and column) and a well-formed body with a
//! wrong field (400 `invalid-argument`, naming the field's path) all answer
//! problem+json.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorCode};

/// A JSON body of type `T`.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = content_type.split(';').next().unwrap_or("").trim();
        if !(essence == "application/json" || essence.ends_with("+json")) {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                if content_type.is_empty() {
                    "the request has no Content-Type; send application/json".to_string()
                } else {
                    format!(
                        "Content-Type {content_type:?} is not accepted here; send application/json"
                    )
                },
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(body_error)?;
        parse(&bytes).map(ApiJson)
    }
}

/// Maps a failure to read the body (usually: over the limit).
pub fn body_error(rejection: axum::extract::rejection::BytesRejection) -> ApiError {
    if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            "the request body is larger than this route accepts (http.max_body_bytes; for release bundles, releases.max_bundle_bytes)",
        )
    } else {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("the request body could not be read: {rejection}"),
        )
    }
}

/// Parses a JSON object, telling syntax errors from field errors. Every
/// body of the API is an object: anything else (`[]`, `"x"`, `1`) is
/// refused before serde could read a sequence into a struct.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        None => {
            return Err(ApiError::new(
                ErrorCode::MalformedJson,
                "the request body is empty; send a JSON object",
            ));
        }
        Some(_) => {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                "the request body must be a JSON object ({...})",
            ));
        }
    }
    let syntax = |e: serde_json::Error| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!(
                "the request body is not valid JSON: {} at line {} column {}",
                strip_position(&e.to_string()),
                e.line(),
                e.column()
            ),
        )
    };
    let mut document: serde_json::Value = serde_json::from_slice(bytes).map_err(syntax)?;
    integral_numbers(&mut document);
    // A key the body's type does not read, at any depth, is a mistake (a
    // misspelt `retention.payloadDay` would otherwise clear the setting it
    // meant), refused by name like a wrong value.
    let mut ignored: Option<String> = None;
    let mut track = serde_path_to_error::Track::new();
    let read = serde_ignored::deserialize(
        serde_path_to_error::Deserializer::new(document, &mut track),
        |path| {
            ignored.get_or_insert_with(|| path.to_string());
        },
    );
    match read {
        Err(e) => {
            let mut path = track.path().to_string();
            let mut reason = strip_position(&e.to_string());
            // serde says a missing field at the object that misses it.
            if let Some(name) = reason
                .strip_prefix("missing field `")
                .and_then(|r| r.strip_suffix('`'))
            {
                path = if path == "." {
                    name.to_string()
                } else {
                    format!("{path}.{name}")
                };
                reason = "is required".into();
            }
            Err(if path == "." {
                ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("the request body is wrong: {reason}"),
                )
            } else {
                ApiError::invalid(path, reason)
            })
        }
        Ok(_) if ignored.is_some() => Err(ApiError::invalid(
            ignored.unwrap_or_default(),
            "is not a field here (misspelt, or of another version of the API?)",
        )),
        Ok(value) => Ok(value),
    }
}

/// JSON has one number type: `2.0` is the integer 2 (as JSON Schema says),
/// so a whole number written with a fraction reads as an integer.
fn integral_numbers(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && f.abs() <= 9_007_199_254_740_992.0
            {
                *v = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(fields) => fields.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Body {
        #[allow(dead_code)]
        tenant_id: String,
        #[allow(dead_code)]
        limits: Limits,
    }

    #[derive(Deserialize, Debug)]
    #[serde(rename_all = "camelCase")]
    struct Limits {
        #[allow(dead_code)]
        max_minutes: u32,
    }

    #[test]
    fn syntax_errors_and_field_errors_are_told_apart() {
        let e = parse::<Body>(b"{\"tenantId\": ").unwrap_err();
        assert_eq!(e.code, ErrorCode::MalformedJson);
        assert!(e.detail.contains("line 1"), "{}", e.detail);

        let e =
            parse::<Body>(br#"{"tenantId": "a", "limits": {"maxMinutes": "ten"}}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert_eq!(e.field.as_deref(), Some("limits.maxMinutes"));

        let e = parse::<Body>(br#"{"tenantId": "a", "limits": {"maxMinutes": 1}, "extra": 1}"#)
            .unwrap_err();
        assert!(e.detail.contains("extra"), "{}", e.detail);

        let e = parse::<Body>(br#"{"tenantId": "a", "limits": {"maxMinutes": 1}} trailing"#)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::MalformedJson);
    }

    #[test]
    fn a_misspelt_nested_field_and_a_missing_one_are_named() {
        // `Limits` does not deny unknown fields itself: the parser does.
        let e = parse::<Body>(br#"{"tenantId": "a", "limits": {"maxMinutes": 1, "maxMinute": 2}}"#)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert_eq!(e.field.as_deref(), Some("limits.maxMinute"));
        let e = parse::<Body>(br#"{"tenantId": "a"}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("limits"));
        let e = parse::<Body>(br#"{"tenantId": "a", "limits": {}}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("limits.maxMinutes"));
        assert!(e.detail.contains("required"), "{}", e.detail);
    }

    #[test]
    fn a_whole_number_with_a_fraction_is_an_integer() {
        let b = parse::<Body>(br#"{"tenantId": "a", "limits": {"maxMinutes": 30.0}}"#).unwrap();
        assert_eq!(b.limits.max_minutes, 30);
        let e = parse::<Body>(br#"{"tenantId": "a", "limits": {"maxMinutes": 30.5}}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("limits.maxMinutes"));
    }
}
