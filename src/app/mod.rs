//! Wiring: open the data directory and the store, load TLS, start the
//! workers, build the router, serve HTTPS, and shut everything down in
//! order.
//!
//! [`start`] returns a [`Running`] appliance that [`Running::stop`] shuts
//! down; [`run`] does both around a shutdown future, which is how `main`
//! (SIGTERM, Ctrl-C, the Windows service stop) and in-process tests and
//! benchmarks drive the same path.

pub mod standby;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::AppState;
use crate::auth::Auth;
use crate::capacity::Capacity;
use crate::capacity::workers::{AccountingReconciler, Autoscaler, LeaseExpirer};
use crate::clock::{ManualClock, SharedClock, SystemClock};
use crate::config::Config;
use crate::releases::Releases;
use crate::releases::warmer::ReleaseCacheWarmer;
use crate::runs::RunControl;
use crate::runtime::Runtime;
use crate::runtime::workers::{CheckpointCompactor, LeaseHeartbeat, OrphanedAttemptReconciler};
use crate::store::datadir::RuntimeInfo;
use crate::store::{DataDir, Store, StoreOptions};
use crate::tls::{self, TlsInfo, TlsMaterial};
use crate::worker::{self, WorkerRegistry};

/// The clock an appliance runs on.
#[derive(Clone)]
pub struct Clocks {
    /// What everything reads the time from.
    pub clock: SharedClock,
    /// The same clock when it is manual (tests), so the Admin service can
    /// move it.
    pub manual: Option<Arc<ManualClock>>,
}

impl Clocks {
    /// The wall clock.
    pub fn system() -> Clocks {
        Clocks {
            clock: SystemClock::shared(),
            manual: None,
        }
    }

    /// A manual clock standing at `start`.
    pub fn manual_at(start: chrono::DateTime<chrono::Utc>) -> Clocks {
        let manual = ManualClock::new(start);
        Clocks {
            clock: manual.clone(),
            manual: Some(manual),
        }
    }
}

/// The data directory and the store, opened and locked.
pub struct Local {
    /// The locked data directory.
    pub datadir: DataDir,
    /// The store inside it.
    pub store: Store,
}

/// Opens the data directory (taking its lock) and the store.
pub fn open_local(config: &Config) -> Result<Local, crate::store::StoreError> {
    let datadir = DataDir::open(&config.data_dir)?;
    // The certificate's fingerprint is what a standby pins when it
    // forwards to this appliance; an offline command serves nothing.
    let store = open_store(config, &datadir.store_path(), config.listen, "")?;
    Ok(Local { datadir, store })
}

/// Opens the store the configuration names: sled in the data directory,
/// or the shared PostgreSQL one, which fails with
/// [`StoreError::Standby`](crate::store::StoreError::Standby) while
/// another appliance is active. `listen` (the bound address) and
/// `fingerprint` (of the served certificate) tell the other appliances
/// how to reach this one.
pub fn open_store(
    config: &Config,
    store_path: &std::path::Path,
    listen: SocketAddr,
    fingerprint: &str,
) -> Result<Store, crate::store::StoreError> {
    let options = StoreOptions {
        cache_bytes: config.store.cache_mb * 1024 * 1024,
        snapshot_every_bytes: config.store.snapshot_every_mb * 1024 * 1024,
        upgrade_backup_dir: Some(config.upgrade_backup_dir()),
        backend: store_backend(config, &config.store.backend, listen, fingerprint)?,
        ..StoreOptions::default()
    };
    Store::open(store_path, &options)
}

/// How the store reaches `backend` as the configuration sets it up (on
/// PostgreSQL with the pair key of the data directory, when it has one).
pub fn store_backend(
    config: &Config,
    backend: &crate::config::StoreBackend,
    listen: SocketAddr,
    fingerprint: &str,
) -> Result<crate::store::Backend, crate::store::StoreError> {
    Ok(match backend {
        crate::config::StoreBackend::Sled => crate::store::Backend::Sled,
        crate::config::StoreBackend::Postgres => {
            let pg = &config.store.postgres;
            crate::store::Backend::Postgres(crate::store::PgOptions {
                url: pg.url.expose().to_string(),
                ca_file: pg.ca_file.clone(),
                node: pg.node_name(),
                advertise: pg.advertise_url(listen),
                fingerprint: fingerprint.to_string(),
                lease: Duration::from_secs(pg.lease_seconds),
                pair: crate::store::datadir::read_pair_key(&config.data_dir)?,
            })
        }
    })
}

/// What `agentbay check` found in a stopped appliance's store.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreCheck {
    /// The schema version the store is at (after any migration).
    pub schema_version: u32,
    /// Records read back, by table.
    pub records: std::collections::BTreeMap<&'static str, usize>,
    /// What is wrong (none: every record reads back and every derived
    /// entry, count and reference is what the records make).
    pub problems: Vec<String>,
}

/// Checks a store: every record of every table reads back as this
/// version's type, and what records derive (indexes, counts, artifact
/// references, the audit chain) is what is stored ([`Store::audit`]).
/// Reads the whole store: for a stopped appliance, after an upgrade or a
/// restore.
pub fn check_store(store: &Store) -> Result<StoreCheck, crate::store::StoreError> {
    use crate::domain::attempt::{
        CallRecord, Checkpoint, DecisionRequest, ExecutionAttempt, SubAgentDelegation,
    };
    use crate::store::Record;
    let mut check = StoreCheck {
        schema_version: store.schema_version(),
        records: Default::default(),
        problems: Vec::new(),
    };
    fn table<R: Record>(store: &Store, check: &mut StoreCheck) {
        match store.read_back::<R>() {
            Ok(n) => {
                check.records.insert(R::TABLE.name(), n);
            }
            Err(e) => check
                .problems
                .push(format!("table {}: {e}", R::TABLE.name())),
        }
    }
    table::<crate::domain::tenant::Tenant>(store, &mut check);
    table::<crate::domain::tenant::Project>(store, &mut check);
    table::<crate::domain::credential::ClientCredential>(store, &mut check);
    table::<crate::domain::user::User>(store, &mut check);
    table::<crate::domain::capacity::WorkerPool>(store, &mut check);
    table::<crate::domain::capacity::Quota>(store, &mut check);
    table::<crate::domain::capacity::CapacityLease>(store, &mut check);
    table::<crate::capacity::records::ExecutionMinutes>(store, &mut check);
    table::<crate::capacity::records::RunSlot>(store, &mut check);
    table::<crate::capacity::ledger::TokenDay>(store, &mut check);
    table::<crate::capacity::ledger::RunTokens>(store, &mut check);
    table::<crate::store::artifacts::Artifact>(store, &mut check);
    table::<crate::domain::release::LoadedRelease>(store, &mut check);
    table::<crate::domain::trust::ReleaseVerdict>(store, &mut check);
    table::<crate::domain::trust::PublisherKey>(store, &mut check);
    table::<crate::domain::model_profile::SiteModelProfile>(store, &mut check);
    table::<crate::domain::run::Run>(store, &mut check);
    table::<ExecutionAttempt>(store, &mut check);
    table::<Checkpoint>(store, &mut check);
    table::<CallRecord>(store, &mut check);
    table::<DecisionRequest>(store, &mut check);
    table::<SubAgentDelegation>(store, &mut check);
    table::<crate::domain::webhook::WebhookEndpoint>(store, &mut check);
    table::<crate::domain::webhook::Delivery>(store, &mut check);
    check.problems.extend(store.audit()?);
    Ok(check)
}

/// The bootstrap PlatformAdmin secrets, while unused.
pub use crate::auth::bootstrap::Bootstrapped as Bootstrap;

/// Creates the PlatformAdmin bootstrap credential and console user if this
/// store never had them, or returns them again while neither was used.
pub async fn bootstrap(
    store: &Store,
    data_dir: &std::path::Path,
    clock: &SharedClock,
) -> anyhow::Result<Option<Bootstrap>> {
    Ok(crate::auth::bootstrap::ensure(store, data_dir, clock.now()).await?)
}

/// Prints the bootstrap credential to standard output (never to the log).
pub fn print_bootstrap(bootstrap: &Bootstrap, config: &Config, url: Option<&str>) {
    let url = url
        .map(str::to_string)
        .unwrap_or_else(|| format!("https://{}", display_addr(config.listen)));
    let ca = std::path::absolute(config.data_dir.join("tls/ca.pem"))
        .unwrap_or_else(|_| config.data_dir.join("tls/ca.pem"));
    println!();
    if bootstrap.first_time {
        println!("agentbay bootstrap credentials (PlatformAdmin) - store them now:");
    } else {
        println!("agentbay bootstrap credentials (PlatformAdmin) - made earlier, not used yet:");
    }
    println!("  client_id:     {}", bootstrap.client_id);
    println!("  client_secret: {}", bootstrap.client_secret);
    println!();
    println!("Console: sign in at {url}/ as");
    println!("  username:      {}", bootstrap.username);
    println!("  password:      {}", bootstrap.password);
    println!();
    println!("Get a token:");
    println!(
        "  curl --cacert {} -u '{}:{}' -d grant_type=client_credentials {url}/oauth/token",
        ca.display(),
        bootstrap.client_id,
        bootstrap.client_secret
    );
    println!();
    println!(
        "Every start shows these again (on standard output, never in the log) until the credential gets a token or admin signs in;"
    );
    println!(
        "then never again (a lost password: agentbay user reset-password --tenant platform admin)."
    );
    println!();
}

/// The address as a client would dial it.
pub fn display_addr(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(v4) if v4.ip().is_unspecified() => format!("127.0.0.1:{}", v4.port()),
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => format!("[::1]:{}", v6.port()),
        other => other.to_string(),
    }
}

/// A serving appliance.
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// `https://...` as clients dial it.
    pub url: String,
    /// The state handlers see.
    pub state: AppState,
    /// The bootstrap secrets, while unused (printed at every start).
    pub bootstrap: Option<Bootstrap>,
    /// What the demo seeded at this start, if anything.
    pub demo: Option<String>,
    handle: axum_server::Handle<SocketAddr>,
    server: JoinHandle<std::io::Result<()>>,
    workers: Vec<JoinHandle<()>>,
    shutdown: watch::Sender<bool>,
    datadir: DataDir,
}

/// Starts the appliance: returns once it listens.
pub async fn start(config: Config, clocks: Clocks) -> anyhow::Result<Running> {
    crate::store::datadir::private_files();
    let config = Arc::new(config);
    // Every precondition of serving is checked before anything is made:
    // the address first, then the data directory (its lock), the
    // certificate, the backup directory; the bootstrap secrets come last.
    let listener = bind(&config)?;
    let addr = listener.local_addr()?;
    let datadir = DataDir::open(&config.data_dir)?;
    #[cfg(unix)]
    let tools = confiner(&config)?;
    let (store, material) = match config.store.backend {
        crate::config::StoreBackend::Sled => {
            let store = open_store(&config, &datadir.store_path(), addr, "")?;
            (store, load_tls(&config, &datadir)?)
        }
        crate::config::StoreBackend::Postgres => {
            let material = load_tls(&config, &datadir)?;
            let store = open_store(&config, &datadir.store_path(), addr, &material.fingerprint)?;
            (store, material)
        }
    };
    serve(
        config,
        clocks,
        listener,
        datadir,
        store,
        material,
        #[cfg(unix)]
        tools,
    )
    .await
}

/// Where this process serves, for the commands and scripts that look
/// (`run/appliance.json`).
pub(crate) fn runtime_info(
    config: &Config,
    url: &str,
    material: &TlsMaterial,
    started_at: DateTime<Utc>,
) -> RuntimeInfo {
    RuntimeInfo {
        pid: std::process::id(),
        url: url.to_string(),
        certificate_fingerprint: material.fingerprint.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_at,
        config_file: config
            .source
            .file
            .as_ref()
            .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone())),
    }
}

/// Binds the listening address.
pub(crate) fn bind(config: &Config) -> anyhow::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(config.listen)
        .with_context(|| format!("cannot listen on {} (listen)", config.listen))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// What confines tool processes on this host, found before any store is
/// opened. Refused: a PostgreSQL store reached over a Unix socket while
/// tools would run as the appliance's own uid, which PostgreSQL's `peer`
/// authentication (the default for local sockets) cannot tell from the
/// appliance.
#[cfg(unix)]
pub(crate) fn confiner(config: &Config) -> anyhow::Result<Arc<crate::runtime::confine::Confiner>> {
    let confiner = crate::runtime::confine::Confiner::detect(
        config.data_dir.join("work"),
        config.protected_paths(),
    );
    if config.store.backend == crate::config::StoreBackend::Postgres
        && let Some(socket) = crate::store::unix_socket(config.store.postgres.url.expose())
        && let Some(why) = confiner.tools_share_uid(&config.runtime)
    {
        anyhow::bail!(
            "store.postgres.url connects over the Unix socket {socket} while tool processes would run as the appliance's own uid ({why}): PostgreSQL's peer authentication could not tell a tenant's tool from the appliance. Connect over TCP (host=127.0.0.1 with a password or a certificate), or give tools a uid of their own (an unprivileged account: a subordinate range in /etc/subuid and /etc/subgid with uidmap installed; as root: runtime.tool_user or runtime.tool_uid_range)"
        );
    }
    Ok(Arc::new(confiner))
}

/// The certificate the appliance serves (generated on first start).
pub(crate) fn load_tls(config: &Config, datadir: &DataDir) -> anyhow::Result<TlsMaterial> {
    tls::load_or_generate(&config.tls, &datadir.tls_dir()).context("loading the TLS certificate")
}

/// Starts serving on an opened data directory and store: returns once it
/// listens.
pub(crate) async fn serve(
    config: Arc<Config>,
    clocks: Clocks,
    listener: std::net::TcpListener,
    datadir: DataDir,
    store: Store,
    material: TlsMaterial,
    #[cfg(unix)] tools: Arc<crate::runtime::confine::Confiner>,
) -> anyhow::Result<Running> {
    let clock = clocks.clock.clone();
    let addr = listener.local_addr()?;
    let url = format!("https://{}", display_addr(addr));
    let auth_config = crate::config::Live::new(config.auth.clone());
    let auth = Arc::new(
        Auth::open(&store, clock.clone(), auth_config.clone())
            .await
            .context("loading credentials")?,
    );
    let workers = Arc::new(WorkerRegistry::default());
    let capacity = {
        let registry = workers.clone();
        Capacity::start(
            store.clone(),
            clock.clone(),
            &config.capacity,
            Box::new(move || {
                registry.trigger("Autoscaler");
            }),
        )
        .await
        .context("loading pools, quotas and leases")?
    };
    // `runtime.*` is live: one value that the reloader sets and that the
    // runtime and the site's rules read.
    let runtime_config = crate::config::Live::new(config.runtime.clone());
    let releases = Arc::new(
        Releases::open(
            store.clone(),
            clock.clone(),
            &config.releases,
            crate::config::SiteRules::new(&config, runtime_config.clone(), addr),
            crate::releases::demo_key(&config).context("the demo publisher key")?,
        )
        .await
        .context("loading trusted publisher keys")?,
    );

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let reloader = Arc::new(crate::reload::Reloader::new(
        &config,
        runtime_config,
        auth_config.clone(),
        releases.clone(),
        capacity.clone(),
        store.clone(),
        clock.clone(),
    ));
    let runtime = Runtime::start(
        store.clone(),
        clock.clone(),
        reloader.runtime.clone(),
        capacity.clone(),
        releases.clone(),
        Arc::new(crate::runs::Port),
        shutdown_rx.clone(),
        #[cfg(unix)]
        tools,
    )
    .await
    .map_err(|e| anyhow::anyhow!("loading live attempts: {e}"))?;
    #[cfg(windows)]
    crate::runtime::jobobject::start_probe();
    let runs = Arc::new(RunControl::new(
        runtime.clone(),
        releases.clone(),
        capacity.clone(),
        clock.clone(),
        reloader.runtime.clone(),
    ));
    let links =
        crate::notify::Links::open(store.clone(), clock.clone(), reloader.notify.clone(), addr)
            .await
            .context("loading the key of links to decisions")?;
    let notifier = crate::notify::Notifier::new(
        store.clone(),
        clock.clone(),
        reloader.notify.clone(),
        links.clone(),
    );
    let webhooks = crate::webhooks::Webhooks::new(
        store.clone(),
        clock.clone(),
        reloader.webhooks.clone(),
        releases.site().clone(),
        runtime.clone(),
        capacity.clone(),
        links.clone(),
    );
    let state = AppState {
        webhooks: webhooks.clone(),
        links,
        notifier: notifier.clone(),
        store: store.clone(),
        auth: auth.clone(),
        sessions: crate::auth::session::Sessions::new(clock.clone(), auth_config),
        capacity: capacity.clone(),
        releases: releases.clone(),
        runs: runs.clone(),
        runtime: runtime.clone(),
        clock: clock.clone(),
        manual_clock: clocks.manual.clone(),
        config: config.clone(),
        tls: Arc::new(TlsInfo {
            fingerprint: material.fingerprint.clone(),
            ca_fingerprint: material.ca_fingerprint.clone(),
        }),
        workers: workers.clone(),
        metrics: crate::telemetry::metrics_handle(),
        reloader: reloader.clone(),
        exports: Default::default(),
        shutdown: shutdown_rx.clone(),
        started_at: clock.now(),
        backups: match &config.backup.dir {
            Some(dir) => Some(
                crate::store::scheduled::Backups::new(
                    store.clone(),
                    config.data_dir.clone(),
                    dir.clone(),
                    config.backup.interval_minutes,
                    config.backup.keep,
                    clock.now(),
                )
                .with_context(|| {
                    format!(
                        "preparing the backup directory {} (backup.dir)",
                        dir.display()
                    )
                })?,
            ),
            None => None,
        },
    };

    let bootstrap = bootstrap(&store, datadir.root(), &clock).await?;
    if let Some(secrets) = &bootstrap {
        auth.bootstrap.arm(secrets, datadir.root());
    }

    let demo = if config.demo.enabled {
        crate::demo::seed(&state)
            .await
            .context("seeding the demo (turn it off with demo.enabled = false)")?
    } else {
        None
    };

    let seconds = Duration::from_secs;
    let mut background: Vec<Arc<dyn worker::Worker>> = vec![
        crate::runs::purge::worker(store.clone(), reloader.retention.clone()),
        Arc::new(LeaseExpirer {
            capacity: capacity.clone(),
            every: seconds(config.capacity.expire_interval_seconds),
        }),
        Arc::new(Autoscaler {
            capacity: capacity.clone(),
            every: seconds(config.capacity.autoscale_interval_seconds),
        }),
        Arc::new(AccountingReconciler {
            capacity: capacity.clone(),
            every: seconds(config.capacity.reconcile_interval_seconds),
        }),
        Arc::new(ReleaseCacheWarmer {
            releases: releases.clone(),
            every: seconds(config.releases.warm_interval_seconds),
        }),
        Arc::new(LeaseHeartbeat {
            runtime: runtime.clone(),
        }),
        Arc::new(OrphanedAttemptReconciler {
            runtime: runtime.clone(),
        }),
        Arc::new(CheckpointCompactor {
            runtime: runtime.clone(),
        }),
    ];
    background.push(Arc::new(crate::webhooks::WebhookDispatcher {
        webhooks: webhooks.clone(),
    }));
    background.push(Arc::new(crate::notify::NotifyWorker { notifier }));
    if let Some(backups) = &state.backups {
        background.push(Arc::new(crate::store::scheduled::ScheduledBackup {
            backups: backups.clone(),
        }));
    }
    // A committed event that webhooks carry starts a dispatcher pass at
    // once, not at its next poll.
    {
        let mut events = store.subscribe();
        let registry = workers.clone();
        let mut stop = shutdown_rx.clone();
        let tried = webhooks.tried.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    // A try ended: the endpoint's next delivery may go.
                    _ = tried.notified() => {
                        registry.trigger("WebhookDispatcher");
                    }
                    event = events.recv() => match event {
                        Ok(e) => {
                            if crate::domain::webhook::WebhookEvent::of_topic(&e.topic).is_some() {
                                registry.trigger("WebhookDispatcher");
                            }
                            if e.topic == crate::notify::TOPIC {
                                registry.trigger("Notifier");
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            registry.trigger("WebhookDispatcher");
                        }
                        Err(_) => break,
                    },
                    _ = stop.changed() => break,
                }
            }
        });
    }
    // Each minute, and at a stop, the counts of refused sign-ins whose
    // minute is over go to the audit trail.
    {
        let (auth, store, clock) = (auth.clone(), store.clone(), clock.clone());
        let mut stop = shutdown_rx.clone();
        let mut ticks = clock.ticks();
        tokio::spawn(async move {
            loop {
                let stopping = tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(60)) => false,
                    _ = ticks.changed() => false,
                    _ = stop.changed() => true,
                };
                let now = clock.now();
                let ended = if stopping {
                    auth.refusals.all(now)
                } else {
                    auth.refusals.ended(now)
                };
                if let Err(e) = crate::auth::refusals::record(&store, ended).await {
                    tracing::warn!(error = %e, "refused sign-ins could not be recorded");
                }
                if stopping {
                    break;
                }
            }
        });
    }
    let worker_tasks = background
        .into_iter()
        .map(|w| {
            worker::spawn(
                w,
                clock.clone(),
                workers.clone(),
                config.workers.retries(),
                shutdown_rx.clone(),
            )
        })
        .collect();

    let pair = match config.store.backend {
        crate::config::StoreBackend::Postgres => {
            crate::store::datadir::read_pair_key(datadir.root())?.map(Arc::new)
        }
        crate::config::StoreBackend::Sled => None,
    };
    let app = crate::api::router(state.clone(), crate::console::router(&state)).layer(
        axum::middleware::from_fn(move |request, next| {
            crate::api::conn::believe_the_pair(pair.clone(), request, next)
        }),
    );
    let handle = axum_server::Handle::new();
    let http = &config.http;
    let server = serve_bounded(listener, &material, http, handle.clone(), app)?;

    let admin_token = auth.issue_local_admin_token();
    datadir.write_admin_token(&admin_token)?;
    datadir.write_runtime_info(&runtime_info(&config, &url, &material, clock.now()))?;
    tracing::info!(
        %url,
        certificate = %material.fingerprint,
        ca = material.ca_fingerprint.as_deref().unwrap_or("(configured certificate)"),
        data_dir = %config.data_dir.display(),
        version = env!("CARGO_PKG_VERSION"),
        "agentbay is serving"
    );
    Ok(Running {
        addr,
        url,
        state,
        bootstrap,
        demo,
        handle,
        server,
        workers: worker_tasks,
        shutdown: shutdown_tx,
        datadir,
    })
}

impl Running {
    /// Shuts down in order: stop accepting, let requests in flight finish
    /// (up to `http.drain_seconds`), stop the workers, flush the store.
    pub async fn stop(self) -> anyhow::Result<()> {
        let drain = Duration::from_secs(self.state.config.http.drain_seconds);
        self.stop_draining(drain).await
    }

    /// Shuts down as [`Running::stop`] does, letting requests in flight
    /// run for `drain` at most.
    pub async fn stop_draining(self, drain: Duration) -> anyhow::Result<()> {
        tracing::info!(drain_seconds = drain.as_secs(), "shutting down");
        let _ = self.shutdown.send(true);
        self.handle.graceful_shutdown(Some(drain));
        match tokio::time::timeout(drain + Duration::from_secs(5), self.server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the listener ended with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "the listener task failed"),
            Err(_) => tracing::warn!("requests still running after the drain deadline were cut"),
        }
        for task in self.workers {
            let _ = task.await;
        }
        // Tool processes end with the appliance, whatever their loops are
        // doing.
        #[cfg(unix)]
        self.state.runtime.end_tool_processes();
        let store = self.state.store.clone();
        drop(self.state);
        tokio::task::spawn_blocking(move || store.close())
            .await
            .context("closing the store")??;
        self.datadir.clear_runtime_files();
        tracing::info!("agentbay stopped; every acknowledged write is on disk");
        Ok(())
    }
}

/// What the start banner says of the pools that run on this host: what
/// they promise of it, and a warning for each way they promise more than
/// it has (also in the log).
pub fn print_host_fit(capacity: &crate::capacity::Capacity) {
    let Some(fit) = capacity.host_fit() else {
        println!("  pools: this host's CPUs and memory could not be read");
        return;
    };
    println!("  {}", fit.summary());
    for warning in &fit.warnings {
        println!("  warning: {warning}");
        tracing::warn!("{warning}");
    }
}

/// What the start banner says of scheduled backups: where they go, or that
/// they are off and how to turn them on.
pub fn backup_line(config: &Config) -> String {
    match &config.backup.dir {
        Some(dir) => format!(
            "scheduled backups every {} min into {} (keep {})",
            config.backup.interval_minutes,
            dir.display(),
            config.backup.keep
        ),
        None => "scheduled backups are OFF: nothing protects this data from a lost disk; \
                 set [backup] dir (or AGENTBAY_BACKUP__DIR) to take a verified backup every 15 minutes"
            .to_string(),
    }
}

/// Runs until `shutdown` completes, then stops. `shutdown` is first polled
/// once the appliance serves.
pub async fn run(
    config: Config,
    clocks: Clocks,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if config.store.backend == crate::config::StoreBackend::Postgres {
        return standby::run(config, clocks, shutdown).await;
    }
    let running = start(config.clone(), clocks).await?;
    if let Some(bootstrap) = &running.bootstrap {
        // Until used, every start prints them, on standard output only:
        // the log (standard error, the journal) never holds a secret, and
        // the packaged service sends standard output nowhere.
        print_bootstrap(bootstrap, &config, Some(&running.url));
    }
    println!(
        "agentbay {} serving {}",
        env!("CARGO_PKG_VERSION"),
        running.url
    );
    println!("  certificate {}", running.state.tls.fingerprint);
    if let Some(demo) = &running.demo {
        println!("  {demo}");
    }
    println!("  {}", backup_line(&config));
    print_host_fit(&running.state.capacity);
    #[cfg(unix)]
    {
        let tools = running.state.runtime.confinement();
        println!("  tools run as: {}", tools.user);
        if !tools.own_identity {
            tracing::warn!(user = %tools.user, "tool processes share the appliance's uid");
        }
    }
    if config.backup.dir.is_none() {
        tracing::warn!("scheduled backups are off: set [backup] dir");
    }
    #[cfg(unix)]
    {
        let reloader = running.state.reloader.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut hangups) = signal(SignalKind::hangup()) else {
                return;
            };
            while hangups.recv().await.is_some() {
                if let Err(e) = reloader.reload().await {
                    tracing::error!(error = %e, "the configuration was not reloaded; the running one stays");
                }
            }
        });
    }
    shutdown.await;
    running.stop().await
}

/// Serves `app` on `listener` through the connection layer every node of a
/// pair uses, active or standing by: TLS with its handshake bounded, the
/// per-address connection slots and the header timeout (`api::conn`), and
/// HTTP/2 keep-alives.
pub(crate) fn serve_bounded(
    listener: std::net::TcpListener,
    material: &crate::tls::TlsMaterial,
    http: &crate::config::HttpConfig,
    handle: axum_server::Handle<SocketAddr>,
    app: axum::Router,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let seconds = Duration::from_secs;
    let bounds = crate::api::conn::Bounds::from_config(http);
    let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(
        axum_server::tls_rustls::RustlsConfig::from_config(material.server_config.clone()),
    )
    .handshake_timeout(bounds.header_read)
    .acceptor(crate::api::conn::BoundedAcceptor::new(bounds));
    let mut server = axum_server::from_tcp(listener)?
        .acceptor(acceptor)
        .handle(handle);
    server
        .http_builder()
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Some(seconds(http.http2_keepalive_interval_seconds)))
        .keep_alive_timeout(seconds(http.http2_keepalive_timeout_seconds));
    Ok(tokio::spawn(server.serve(
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )))
}
