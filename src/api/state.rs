//! What a request handler may reach: the services, the clock, the
//! configuration the appliance runs with. `app` builds one at start and
//! hands it to the API's and the console's routers.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;

use crate::auth::Auth;
use crate::capacity::Capacity;
use crate::clock::{ManualClock, SharedClock};
use crate::config::Config;
use crate::releases::Releases;
use crate::runs::RunControl;
use crate::runtime::Runtime;
use crate::store::Store;
use crate::tls::TlsInfo;
use crate::worker::WorkerRegistry;

/// Everything a request handler may need. Cheap to clone: all `Arc`s.
#[derive(Clone)]
pub struct AppState {
    /// The store.
    pub store: Store,
    /// Token verification and credential state.
    pub auth: Arc<Auth>,
    /// Console sessions.
    pub sessions: Arc<crate::auth::session::Sessions>,
    /// Pools, quotas, leases, tenants.
    pub capacity: Arc<Capacity>,
    /// Release bundles.
    pub releases: Arc<Releases>,
    /// Run control: runs, approvals, settlement.
    pub runs: Arc<RunControl>,
    /// The attempt runtime.
    pub runtime: Arc<Runtime>,
    /// The clock.
    pub clock: SharedClock,
    /// The clock again when it is manual.
    pub manual_clock: Option<Arc<ManualClock>>,
    /// The configuration the appliance started with.
    pub config: Arc<Config>,
    /// The served certificate.
    pub tls: Arc<TlsInfo>,
    /// Background workers.
    pub workers: Arc<WorkerRegistry>,
    /// Prometheus rendering.
    pub metrics: PrometheusHandle,
    /// Turns true when shutdown begins; long-lived streams end on it.
    pub shutdown: watch::Receiver<bool>,
    /// When the appliance started.
    pub started_at: DateTime<Utc>,
    /// Scheduled backups, when `backup.dir` is set.
    pub backups: Option<Arc<crate::store::scheduled::Backups>>,
    /// Webhook endpoints and deliveries.
    pub webhooks: Arc<crate::webhooks::Webhooks>,
    /// Links to decisions, made for notifications and opened by the
    /// console.
    pub links: Arc<crate::notify::Links>,
    /// Mails about decisions.
    pub notifier: Arc<crate::notify::Notifier>,
    /// The reloadable configuration (SIGHUP, `agentbay reload`).
    pub reloader: Arc<crate::reload::Reloader>,
    /// Run exports in progress, per tenant.
    pub exports: Arc<crate::api::export::Exports>,
}
