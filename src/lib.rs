//! agentbay: an on-prem runtime for AI agents in one binary.
//!
//! # Layout
//!
//! ```text
//! main.rs        CLI: serve, init, backup, restore, user, client, tenant, release, version
//! acting.rs      who the current task acts for (address, door, actor), read by the audit trail
//! app/           wiring: data dir + store + TLS + workers + routers, ordered shutdown;
//!                `app::standby`, the node of a pair that waits for the store and forwards
//! config.rs      one Config from TOML file < AGENTBAY_* environment < CLI flags
//! reload.rs      reloading the running configuration (SIGHUP, `agentbay reload`)
//! control.rs     administration from the CLI: through the running appliance, or offline
//! clock.rs       injectable time (system or manual)
//! tls.rs         rustls with ring: configured or generated certificates, pinning
//! telemetry.rs   logs (text or JSON) and Prometheus metrics
//! worker.rs      the Worker trait, its runner on the clock, the registry
//! demo.rs        the demo tenant a zero-config start seeds
//! winservice.rs  the Windows service of the MSI install (Windows only)
//! domain/        the rules, pure: types and transitions, no IO, no async
//! store/         one typed facade on two engines (sled embedded, PostgreSQL for a pair):
//!                tenant-first keys, versioned aggregates, group commit, outbox, backup
//! auth/          client credentials, console users and sessions, bearer tokens, principals
//! runs/          run control: submit, status, cancel, approvals, settlement, outcomes
//! runtime/       the AttemptGrain per live attempt, adapter operations, claim queue, workers;
//!                `runtime::confine`, the tool spawner and the world each tool process lives
//!                in; `runtime::servers`, the model servers' limits and queues
//! capacity/      the ExecutionCapacityService: a PoolGrain per pool, the quota book, leases,
//!                placement, autoscaling, what the host backs
//! releases/      loading agent releases: bundles, signature and hash checks, trusted keys,
//!                the release cache warmer
//! webhooks/      signed messages to the site's endpoints from a durable outbox
//! notify/        mail to the people who may answer a decision, with signed single-use links
//! api/           REST routes, Connect RPC services, SSE events, errors, OpenAPI, the
//!                `AppState` handlers reach and the scope extractors
//! console/       server-rendered pages (askama): a `Console` extractor (session, CSRF,
//!                roles), server-side tables, live parts over SSE
//! ```
//!
//! Dependencies point one way: `app` builds the services and hands their
//! handles to `api` and `console`; `console` uses `api`'s errors and
//! extractors; neither names a store type: a store failure reaches them as
//! a [`domain::DomainError`], and who acts for a request travels in
//! [`acting`], which the store's audit trail reads.
//!
//! # How a request flows
//!
//! 1. `api::conn` accepts the connection under its bounds (a cap, then
//!    header-read and idle timeouts, below TLS); `api::router` receives the
//!    request; REST routes go to handlers, RPC paths
//!    (`/agentbay.x.v1.Service/Method`) to the Connect service.
//! 2. Authentication happens before the handler: the `Authorized<need::X>`
//!    extractor (REST) or the `AuthInterceptor` (RPC) turns the bearer token
//!    into a [`auth::Principal`] holding the required scope, or answers 401 /
//!    403 naming what is missing.
//! 3. The handler parses its input (`api::json::ApiJson`, field errors named)
//!    and asks the principal for the [`domain::access::TenantScope`] of the tenant it
//!    touches; another tenant's data is refused there.
//! 4. A service function (or the actor owning the aggregate) reads the
//!    current state and calls a `domain` transition, which returns the new
//!    state and its events, or a typed error.
//! 5. One [`store::Store::transact`] closure writes the aggregate, its
//!    indexes and its events; an aggregate that more than one path writes
//!    is [`store::Versioned`] and goes in only over the stored version it
//!    was derived from ([`store::Tx::save`]), so no path can replace a
//!    newer state with an older one. The store's writer applies the closure
//!    with the other writes that queued up, the flusher syncs them to disk,
//!    and only then does the call return.
//! 6. The handler answers; errors become problem+json or Connect errors from
//!    one table (`api::error`). Committed events reach `/events` subscribers.
//!
//! A console page takes the same path with a session instead of a token:
//! the `console::Console` extractor finds the signed-in user (or redirects
//! to sign in), a form's CSRF token is checked before anything else, the
//! page requires its scope from the user's roles, and the services answer
//! in the tenant the session looks at.

pub mod acting;
pub mod api;
pub mod app;
pub mod auth;
pub mod capacity;
pub mod clock;
pub mod config;
pub mod console;
pub mod control;
pub mod demo;
pub mod domain;
pub mod notify;
pub mod releases;
pub mod reload;
pub mod runs;
pub mod runtime;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod webhooks;
#[cfg(windows)]
pub mod winservice;
pub mod worker;

/// Code generated from the `.proto` files under `static/proto/`.
pub mod proto {
    connectrpc::include_generated!();
}
