//! Axum extractors that authenticate before a handler runs.
//!
//! A handler declares the scope its operation needs in its signature,
//! `Authorized<need::CapacityRead>`, and never runs for a caller without
//! it: the refusal (401 or 403, problem+json, naming what is missing)
//! happens in the extractor.

use std::marker::PhantomData;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::AppState;
use super::error::ApiError;
use crate::auth::Principal;
use crate::domain::access::Scope;

/// A scope an operation requires, as a type.
pub trait RequiredScope: Send + Sync + 'static {
    /// The scope.
    const SCOPE: Scope;
}

/// The caller, known to hold `S::SCOPE`.
pub struct Authorized<S: RequiredScope> {
    /// The caller.
    pub principal: Principal,
    _scope: PhantomData<S>,
}

impl<S: RequiredScope> FromRequestParts<AppState> for Authorized<S> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let principal = state.auth.authenticate(header)?;
        principal.require(S::SCOPE)?;
        Ok(Authorized {
            principal,
            _scope: PhantomData,
        })
    }
}

/// Marker types, one per scope.
pub mod need {
    use super::RequiredScope;
    use crate::domain::access::Scope;

    macro_rules! markers {
        ($($name:ident),* $(,)?) => {
            $(
                #[doc = concat!("Requires [`Scope::", stringify!($name), "`].")]
                pub struct $name;
                impl RequiredScope for $name {
                    const SCOPE: Scope = Scope::$name;
                }
            )*
        };
    }

    markers!(
        CapacityRead,
        CapacityAdmin,
        CapacityLease,
        RunsRead,
        RunsWrite,
        RunsDecide,
        RunsOperate,
        RunsExecute,
        AssetsRead,
        AssetsAdmin,
        EventsRead,
        MetricsRead,
        Admin,
        Platform,
    );
}
