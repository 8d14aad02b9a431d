//! The errors domain rules raise.
//!
//! Each names what was wrong in words an operator can act on. The API layer
//! maps them to a stable code, an HTTP status and a Connect code in one
//! table (`api::error`).

use std::fmt;

/// One input field that was rejected, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// The field as the caller spelled it (camelCase, dotted for nesting).
    pub field: String,
    /// Why it was rejected.
    pub reason: String,
}

/// Longest free text (a reason, a summary) a record keeps, in characters.
pub const MAX_TEXT_CHARS: usize = 2000;

/// Longest key a caller chooses (a request id, an environment id).
pub const MAX_KEY_CHARS: usize = 128;

impl FieldError {
    /// A UTC day as `YYYY-MM-DD`, or the error naming `field`.
    pub fn parse_day(field: &str, text: &str) -> Result<chrono::NaiveDate, FieldError> {
        chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .map_err(|_| FieldError::new(field, format!("{text:?} is not a day (YYYY-MM-DD)")))
    }

    /// A rejected field.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Refuses a required text that is empty or only blanks (spaces, tabs,
    /// line breaks), saying what it is for. The contract's schemas say the
    /// same (`pattern: [^ \t\n\r]`), so the rule lives here only.
    pub fn require(field: &str, value: &str, what: &str) -> Result<(), FieldError> {
        if value.chars().all(|c| matches!(c, ' ' | '\t' | '\n' | '\r')) {
            let reason = if what.is_empty() {
                "is required".to_string()
            } else {
                format!("is required: {what}")
            };
            return Err(FieldError::new(field, reason));
        }
        Ok(())
    }

    /// Refuses free text longer than [`MAX_TEXT_CHARS`].
    pub fn check_text(field: &str, value: &str) -> Result<(), FieldError> {
        let n = value.chars().count();
        if n > MAX_TEXT_CHARS {
            return Err(FieldError::new(
                field,
                format!("is {n} characters long; at most {MAX_TEXT_CHARS} are kept"),
            ));
        }
        Ok(())
    }

    /// Refuses a caller-chosen key that is empty, longer than
    /// [`MAX_KEY_CHARS`], or holds `/` or a control character (keys name
    /// index entries).
    pub fn check_key(field: &str, value: &str) -> Result<(), FieldError> {
        let n = value.chars().count();
        if n == 0 || n > MAX_KEY_CHARS || value.chars().any(|c| c == '/' || c.is_control()) {
            return Err(FieldError::new(
                field,
                format!(
                    "must be 1 to {MAX_KEY_CHARS} characters without '/' or control characters"
                ),
            ));
        }
        Ok(())
    }
}

fn list(violations: &[FieldError]) -> String {
    violations
        .iter()
        .map(FieldError::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A rule of the domain that a command broke.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    /// The input is malformed or out of range.
    #[error(transparent)]
    Invalid(#[from] FieldError),
    /// The thing named does not exist (in the caller's tenant).
    #[error("{kind} {id} not found")]
    NotFound {
        /// What kind of thing: "client", "lease", ...
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The thing exists already.
    #[error("{kind} {id} already exists")]
    AlreadyExists {
        /// What kind of thing.
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The aggregate is in a state where the command does not apply.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A limit (quota, pool bound, budget) stops the command.
    #[error("{0}")]
    Exhausted(String),
    /// A stale fencing token or a conflicting concurrent change.
    #[error("{0}")]
    Aborted(String),
    /// A policy refuses the command (a tool outside the release's closure,
    /// a denied side-effect class).
    #[error("{0}")]
    Refused(String),
    /// Not now: the appliance cannot serve this at the moment (shutting
    /// down, a model server that did not answer).
    #[error("{0}")]
    Unavailable(String),
    /// A documented, normal wait: the command applies once something the
    /// caller does not control happens (capacity granted, a lease renewed,
    /// a quota's next day); call again in [`DomainError::WAIT_SECONDS`].
    /// Not a failure: it is logged as the wait it is.
    #[error("{0}")]
    Waiting(String),
    /// What the caller sent would make a record larger than the store
    /// keeps (free text, lists): nothing was written.
    #[error("{0}")]
    TooLarge(String),
    /// A document does not satisfy the schema it must (a run's input, a
    /// decision's answer): every field at fault, with why.
    #[error("{what} does not match {schema}: {}", list(.violations))]
    Unfit {
        /// The document, as the caller named it (`inputJson`).
        what: String,
        /// The schema, in words (`the input schema of release triage-1.0.0`).
        schema: String,
        /// The fields at fault, named as dotted paths below `what`.
        violations: Vec<FieldError>,
    },
    /// Something beneath the rules failed: a record that cannot be read, a
    /// disk's error. Not the caller's doing: the API logs it in full and
    /// answers with a reference only.
    #[error("{0}")]
    Broken(String),
}

impl DomainError {
    /// How long a [`DomainError::Waiting`] caller is told to wait before
    /// calling again (`Retry-After`).
    pub const WAIT_SECONDS: u32 = 2;

    /// A `NotFound` for `kind` and `id`.
    pub fn not_found(kind: &'static str, id: impl fmt::Display) -> Self {
        DomainError::NotFound {
            kind,
            id: id.to_string(),
        }
    }
}
