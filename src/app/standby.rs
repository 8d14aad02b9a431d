//! Appliances sharing one PostgreSQL store: one active, the others
//! standing by (DESIGN.md, "Beyond one machine").
//!
//! [`run`] is the serving loop of an appliance on the PostgreSQL store.
//! It stands by until it can take the store's leader row, then serves as
//! the active appliance, as a start does, until the shutdown or until it
//! loses the row (another appliance took it, or its lease ran out
//! unrenewed because PostgreSQL was out of reach): then it stops at once,
//! with no drain, and stands by again.
//!
//! Standing by, it answers on the same address:
//! - `/healthz`: the process serves;
//! - `/readyz`: 503, with its role and the active appliance;
//! - everything else is forwarded to the active appliance, over TLS
//!   pinned to the certificate fingerprint the active one wrote into the
//!   leader row, streaming both ways (Connect, gRPC with its trailers,
//!   SSE, the console). So a client configured with every appliance's
//!   address works whichever is active.
//!
//! A standby believes only its pair: it forwards only to a leader row
//! signed with the pair key (`pair.key`), and proves with that key which
//! client it forwards for, so the active appliance limits, locks out and
//! audits the client's own address, not the standby's
//! ([`crate::api::conn::believe_the_pair`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::FutureExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use serde::Serialize;

use super::{Clocks, bind, load_tls, open_store, serve};
use crate::api::conn;
use crate::config::Config;
use crate::domain::cluster::{Node, Role};
use crate::store::{DataDir, StoreError};

/// How often a standby tries to take the store over.
const POLL: Duration = Duration::from_secs(1);

/// How often the active appliance checks that it still holds the store:
/// well inside the margin it keeps before its lease runs out.
const CHECK: Duration = Duration::from_millis(250);

/// Serves until `shutdown` completes: standing by or active, in turn.
pub async fn run(
    config: Config,
    clocks: Clocks,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    crate::store::datadir::private_files();
    let config = Arc::new(config);
    let shutdown = Box::pin(shutdown).shared();
    let listener = bind(&config)?;
    loop {
        let datadir = DataDir::open(&config.data_dir)?;
        #[cfg(unix)]
        let tools = super::confiner(&config)?;
        let material = load_tls(&config, &datadir)?;
        let Some(store) =
            stand_by(&config, &listener, &datadir, &material, shutdown.clone()).await?
        else {
            return Ok(());
        };
        let running = serve(
            config.clone(),
            clocks.clone(),
            listener.try_clone()?,
            datadir,
            store,
            material,
            #[cfg(unix)]
            tools,
        )
        .await?;
        let leader = running.state.store.leadership();
        tracing::info!(
            node = leader.as_ref().map_or("", |l| l.node.as_str()),
            epoch = leader.as_ref().map_or(0, |l| l.epoch),
            url = %running.url,
            "this appliance is active"
        );
        println!(
            "agentbay {} active, serving {}",
            env!("CARGO_PKG_VERSION"),
            running.url
        );
        super::print_host_fit(&running.state.capacity);
        if let Some(bootstrap) = &running.bootstrap {
            super::print_bootstrap(bootstrap, &config, Some(&running.url));
        }
        let lost = {
            let store = running.state.store.clone();
            async move {
                loop {
                    tokio::time::sleep(CHECK).await;
                    if let Err(why) = store.healthy() {
                        return why;
                    }
                }
            }
        };
        tokio::select! {
            () = shutdown.clone() => return running.stop().await,
            why = lost => {
                tracing::error!(reason = %why, "this appliance stops acting and stands by");
                // No drain: what runs now could not commit anyway.
                if let Err(e) = running.stop_draining(Duration::ZERO).await {
                    tracing::warn!(error = %e, "stopping the active appliance");
                }
            }
        }
    }
}

/// What a standby knows of the pair, for its readiness and forwarding.
#[derive(Default)]
struct Pair {
    /// The active appliance, as the leader row names it.
    active: Option<Node>,
    /// Why this one is not active (the last attempt's words).
    reason: String,
    /// The pair key, read again at every attempt (it may be copied in
    /// while this one stands by); it proves for whom this one forwards.
    key: Option<Arc<crate::domain::cluster::PairKey>>,
}

/// Serves as a standby until the store can be taken (`Some`) or the
/// shutdown (`None`).
async fn stand_by(
    config: &Arc<Config>,
    listener: &std::net::TcpListener,
    datadir: &DataDir,
    material: &crate::tls::TlsMaterial,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Option<crate::store::Store>> {
    let pair = Arc::new(Mutex::new(Pair::default()));
    let mut server: Option<(axum_server::Handle<SocketAddr>, tokio::task::JoinHandle<_>)> = None;
    tokio::pin!(shutdown);
    let mut announced = false;
    loop {
        pair.lock().key = crate::store::datadir::read_pair_key(&config.data_dir)
            .ok()
            .flatten()
            .map(Arc::new);
        let attempt = {
            let (config, path, fingerprint) = (
                config.clone(),
                datadir.store_path(),
                material.fingerprint.clone(),
            );
            let listen = listener.local_addr()?;
            tokio::task::spawn_blocking(move || open_store(&config, &path, listen, &fingerprint))
                .await?
        };
        match attempt {
            Ok(store) => {
                if let Some((handle, task)) = server.take() {
                    handle.shutdown();
                    let _ = task.await;
                }
                return Ok(Some(store));
            }
            Err(StoreError::Standby {
                active,
                untrusted: None,
            }) => {
                let mut p = pair.lock();
                p.reason = format!(
                    "{} is active (epoch {}) until its lease runs out",
                    active.node, active.epoch
                );
                p.active = Some(*active);
            }
            Err(StoreError::Standby {
                active,
                untrusted: Some(why),
            }) => {
                let reason = format!(
                    "the leader row names {} at {} (epoch {}), but {why}: this appliance does not believe it, forwards nothing, and takes the store over when that lease runs out. Someone other than this pair wrote the row: check who holds the database's credentials",
                    active.node, active.url, active.epoch
                );
                let mut p = pair.lock();
                if p.reason != reason {
                    tracing::error!(
                        node = %active.node,
                        url = %active.url,
                        epoch = active.epoch,
                        "standing by: the leader row is not signed with this pair's key ({why}); nothing is forwarded to it"
                    );
                }
                p.reason = reason;
                p.active = None;
            }
            Err(e) => {
                // PostgreSQL out of reach, or refused: keep trying.
                let mut p = pair.lock();
                p.reason = format!("the store cannot be opened: {e}");
                tracing::warn!(error = %e, "standing by: the store cannot be opened");
            }
        }
        if server.is_none() {
            server = Some(serve_standby(config, listener, material, pair.clone())?);
            // Where it listens, for the commands and scripts that look.
            let url = format!("https://{}", super::display_addr(listener.local_addr()?));
            datadir.write_runtime_info(&super::runtime_info(
                config,
                &url,
                material,
                chrono::Utc::now(),
            ))?;
        }
        if !announced {
            announced = true;
            let p = pair.lock();
            tracing::info!(
                active = p.active.as_ref().map_or("", |a| a.node.as_str()),
                "this appliance stands by"
            );
            println!(
                "agentbay {} standing by on https://{}: {}",
                env!("CARGO_PKG_VERSION"),
                super::display_addr(listener.local_addr()?),
                p.reason
            );
        }
        tokio::select! {
            () = &mut shutdown => {
                if let Some((handle, task)) = server.take() {
                    handle.graceful_shutdown(Some(Duration::from_secs(5)));
                    let _ = task.await;
                }
                return Ok(None);
            }
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// The standby's own server on the shared listener.
#[allow(clippy::type_complexity)]
fn serve_standby(
    config: &Arc<Config>,
    listener: &std::net::TcpListener,
    material: &crate::tls::TlsMaterial,
    pair: Arc<Mutex<Pair>>,
) -> anyhow::Result<(
    axum_server::Handle<SocketAddr>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let forward = Forward {
        pair,
        node: config.store.postgres.node_name(),
        started: Instant::now(),
        clients: Arc::new(Mutex::new(None)),
    };
    let app = axum::Router::new()
        .route("/healthz", get(crate::api::health::healthz))
        .route("/readyz", get(readyz))
        .fallback(forward_request)
        .with_state(forward);
    let handle = axum_server::Handle::new();
    // The same connection layer as the active node's: a standby is as
    // exposed, and half-sent requests must not hold it.
    let task = super::serve_bounded(
        listener.try_clone()?,
        material,
        &config.http,
        handle.clone(),
        app,
    )?;
    Ok((handle, task))
}

type Upstream = Client<hyper_rustls::HttpsConnector<HttpConnector>, Body>;

#[derive(Clone)]
struct Forward {
    pair: Arc<Mutex<Pair>>,
    node: String,
    started: Instant,
    /// The client pinned to the active appliance's fingerprint.
    clients: Arc<Mutex<Option<(String, Upstream)>>>,
}

impl Forward {
    fn client(&self, fingerprint: &str) -> Upstream {
        let mut clients = self.clients.lock();
        if let Some((pinned, client)) = clients.as_ref()
            && pinned == fingerprint
        {
            return client.clone();
        }
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(crate::tls::pinned_client_config(fingerprint))
            .https_only()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client: Upstream = Client::builder(TokioExecutor::new()).build(connector);
        *clients = Some((fingerprint.to_string(), client.clone()));
        client
    }
}

/// A standby's readiness: never ready itself, and where the active one is.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StandbyReadiness {
    ready: bool,
    version: &'static str,
    role: Role,
    node: String,
    /// The active appliance, when one holds the store.
    active: Option<Node>,
    /// Why this one is not active.
    store: String,
    /// The id of the pair key it holds (equal ids, equal keys), if any.
    pair_key: Option<String>,
    standing_by_seconds: u64,
}

async fn readyz(State(f): State<Forward>) -> Response {
    let p = f.pair.lock();
    let body = StandbyReadiness {
        ready: false,
        version: env!("CARGO_PKG_VERSION"),
        role: Role::Standby,
        node: f.node.clone(),
        active: p.active.clone(),
        store: p.reason.clone(),
        pair_key: p.key.as_ref().map(|k| k.id().to_string()),
        standing_by_seconds: f.started.elapsed().as_secs(),
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// Headers that describe one connection, not the request.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "transfer-encoding",
    "upgrade",
    "host",
];

async fn forward_request(
    State(f): State<Forward>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let (active, key, why) = {
        let p = f.pair.lock();
        (p.active.clone(), p.key.clone(), p.reason.clone())
    };
    // Without a key the store is not opened (and says why), no leader row
    // is read, and nothing is forwarded.
    let (Some(active), Some(key)) = (active.filter(|a| !a.url.is_empty()), key) else {
        return unavailable(&format!(
            "no appliance this one believes is active ({why}); it stands by and takes over when it can"
        ));
    };
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let Ok(uri) = format!("{}{path}", active.url.trim_end_matches('/')).parse::<Uri>() else {
        return unavailable("the active appliance's address in the store is not a URL");
    };
    let (mut parts, body) = request.into_parts();
    parts.uri = uri;
    for name in HOP_BY_HOP.iter().chain(&conn::FORWARDING_HEADERS) {
        parts.headers.remove(*name);
    }
    let client = peer.ip().to_canonical();
    let proof = key.forward_proof(chrono::Utc::now().timestamp(), client, &f.node);
    for (name, value) in [
        (conn::FORWARDED_FOR, client.to_string()),
        (conn::FORWARDED_BY, f.node.clone()),
        (conn::PAIR_PROOF, proof),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            parts.headers.insert(HeaderName::from_static(name), v);
        }
    }
    let client = f.client(&active.fingerprint);
    match client.request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            for name in HOP_BY_HOP {
                parts.headers.remove(name);
            }
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            tracing::warn!(error = %e, active = %active.node, "forwarding to the active appliance failed");
            // Retry-After says nothing was done: only when the request
            // never reached the active appliance.
            if e.is_connect() {
                return unavailable(&format!(
                    "the active appliance {} at {} could not be reached ({e}); retry: a standby takes over within its lease",
                    active.node, active.url
                ));
            }
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({
                    "code": "unavailable",
                    "message": format!(
                        "the active appliance {} at {} did not answer ({e}); whether it acted on the request is not known: read what it would have changed before repeating it",
                        active.node, active.url
                    ),
                })),
            )
                .into_response()
        }
    }
}

/// Nothing was done: come back in a second.
fn unavailable(message: &str) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(axum::http::header::RETRY_AFTER, "1")],
        Json(serde_json::json!({"code": "unavailable", "message": message})),
    )
        .into_response()
}
