//! Identifiers shared by every aggregate.
//!
//! Tenant and project ids are short slugs chosen by people; they begin every
//! store key, so their alphabet is restricted to what can never be confused
//! with a key separator. Everything the appliance mints itself is a UUIDv7,
//! which sorts by creation time.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::FieldError;

/// The tenant that owns the platform itself: PlatformAdmin credentials live
/// here, and shared pools belong to it.
pub const PLATFORM_TENANT: &str = "platform";

/// Checks a slug: 1 to 63 characters of `a-z`, `0-9` and `-`, starting with a
/// letter or digit.
pub fn check_slug(field: &str, value: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if value.len() > 63 {
        return Err(FieldError::new(
            field,
            format!("is {} characters long; at most 63 are allowed", value.len()),
        ));
    }
    if !value.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err(FieldError::new(
            field,
            format!("{value:?} must start with a lowercase letter or a digit"),
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(FieldError::new(
            field,
            format!("{value:?} contains {bad:?}; only a-z, 0-9 and '-' are allowed"),
        ));
    }
    Ok(())
}

macro_rules! slug_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Parses and validates, naming the field on failure.
            pub fn parse(value: &str) -> Result<Self, FieldError> {
                Self::parse_field($field, value)
            }

            /// Parses and validates, naming `field` on failure.
            pub fn parse_field(field: &str, value: &str) -> Result<Self, FieldError> {
                check_slug(field, value)?;
                Ok(Self(value.to_string()))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = FieldError;
            fn from_str(s: &str) -> Result<Self, FieldError> {
                Self::parse(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = FieldError;
            fn try_from(s: String) -> Result<Self, FieldError> {
                Self::parse(&s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        /// In the API's schemas: a slug, inline.
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .pattern(Some(SLUG_PATTERN))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

/// What [`check_slug`] accepts, as a regular expression.
pub const SLUG_PATTERN: &str = "^[a-z0-9][a-z0-9-]{0,62}$";

slug_id!(
    /// A tenant: the unit of isolation. Every stored record belongs to one.
    TenantId,
    "tenantId"
);
slug_id!(
    /// A project within a tenant.
    ProjectId,
    "projectId"
);

impl TenantId {
    /// The platform tenant.
    pub fn platform() -> TenantId {
        TenantId(PLATFORM_TENANT.to_string())
    }

    /// Whether this is the platform tenant.
    pub fn is_platform(&self) -> bool {
        self.0 == PLATFORM_TENANT
    }
}

/// A new time-ordered id.
pub fn new_id() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}

/// Parses a UUID field, naming it on failure. Only the hyphenated form
/// (`8-4-4-4-12` hex digits, what every answer shows and the contract's
/// pattern says) is a UUID here; braces, URNs and bare hex are refused.
pub fn parse_uuid(field: &str, value: &str) -> Result<uuid::Uuid, FieldError> {
    let hyphenated = value.len() == 36
        && value
            .char_indices()
            .all(|(i, c)| matches!(i, 8 | 13 | 18 | 23) == (c == '-'));
    hyphenated
        .then(|| uuid::Uuid::parse_str(value).ok())
        .flatten()
        .ok_or_else(|| {
            FieldError::new(
                field,
                format!("{value:?} is not a UUID (8-4-4-4-12 hexadecimal digits)"),
            )
        })
}

/// A UUID field that must be given.
pub fn required_uuid(field: &str, value: &str) -> Result<uuid::Uuid, FieldError> {
    if value.is_empty() {
        return Err(FieldError::new(field, "is required"));
    }
    parse_uuid(field, value)
}

/// A UUID field that may be empty (absent).
pub fn optional_uuid(field: &str, value: &str) -> Result<Option<uuid::Uuid>, FieldError> {
    if value.is_empty() {
        Ok(None)
    } else {
        parse_uuid(field, value).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_hyphenated_form_is_a_uuid() {
        let id = "01a2354f-8f2b-7c4e-9a10-0123456789ab";
        assert_eq!(parse_uuid("runId", id).unwrap().to_string(), id);
        assert!(parse_uuid("runId", &id.to_uppercase()).is_ok());
        for bad in [
            "01a2354f8f2b7c4e9a100123456789ab",
            "{01a2354f-8f2b-7c4e-9a10-0123456789ab}",
            "urn:uuid:01a2354f-8f2b-7c4e-9a10-0123456789ab",
            "01a2354f-8f2b-7c4e-9a10-0123456789aX",
            "01a2354f-8f2b7-c4e-9a10-0123456789ab",
        ] {
            let err = parse_uuid("runId", bad).unwrap_err();
            assert_eq!(err.field, "runId");
        }
        assert_eq!(
            required_uuid("runId", "").unwrap_err().reason,
            "is required"
        );
        assert_eq!(optional_uuid("runId", "").unwrap(), None);
    }

    #[test]
    fn slugs_are_checked_with_the_field_named() {
        assert!(TenantId::parse("acme-01").is_ok());
        let err = TenantId::parse("Acme").unwrap_err();
        assert_eq!(err.field, "tenantId");
        assert!(err.reason.contains("lowercase"), "{}", err.reason);
        let err = ProjectId::parse("a/b").unwrap_err();
        assert_eq!(err.field, "projectId");
        assert!(err.reason.contains("'/'"), "{}", err.reason);
        assert!(TenantId::parse("").is_err());
        assert!(TenantId::parse(&"a".repeat(64)).is_err());
        assert!(TenantId::parse("-a").is_err());
    }

    #[test]
    fn ids_round_trip_through_serde() {
        let id = TenantId::parse("acme").unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"acme\"");
        let back: TenantId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, id);
        assert!(serde_json::from_str::<TenantId>("\"A B\"").is_err());
    }
}
