//! Administration from the command line, whether or not the appliance runs.
//!
//! A running appliance holds the data directory's lock and has written where
//! it listens (`run/appliance.json`) and a local administration token
//! (`run/admin.token`, owner-only). Administrative commands then talk to it
//! over its own HTTPS port with the Admin RPC service, pinning its
//! certificate. When no appliance runs, they take the lock themselves and
//! open the store. Both paths call the same service functions, so a
//! credential or a backup made offline is the same as one made online.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context as _, anyhow, bail};
use connectrpc::client::{ClientBody, ClientConfig, ServiceTransport};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::app::{Local, open_local};
use crate::auth::clients;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::domain::TenantId;
use crate::domain::access::parse_scopes;
use crate::domain::credential::ClientCredential;
use crate::proto::agentbay::admin::v1 as pb;
use crate::store::TenantScope;
use crate::store::datadir::{RuntimeInfo, running_appliance};

/// The HTTPS transport of the CLI and the tests: hyper with rustls (ring),
/// pinned to one certificate.
pub type Transport =
    ServiceTransport<Client<hyper_rustls::HttpsConnector<HttpConnector>, ClientBody>>;

/// An Admin client for `url`, trusting only the certificate `fingerprint`.
pub fn admin_client(
    url: &str,
    fingerprint: &str,
    token: &str,
) -> anyhow::Result<pb::AdminClient<Transport>> {
    let config = ClientConfig::new(url.parse().with_context(|| format!("{url} is not a URL"))?)
        .with_default_header("authorization", format!("Bearer {token}"));
    Ok(pb::AdminClient::new(pinned_transport(fingerprint), config))
}

/// A transport that accepts only the certificate with `fingerprint`.
pub fn pinned_transport(fingerprint: &str) -> Transport {
    let tls = crate::tls::pinned_client_config(fingerprint);
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    ServiceTransport::new(Client::builder(TokioExecutor::new()).build(connector))
}

/// Where an administrative command acts.
pub enum Target {
    /// Through the running appliance.
    Running {
        /// The Admin client, authenticated as the local administrator.
        client: Box<pb::AdminClient<Transport>>,
        /// Where it runs.
        info: RuntimeInfo,
    },
    /// On the store directly; no appliance runs.
    Offline(Box<Local>),
}

impl Target {
    /// The running appliance of the data directory, or the opened store.
    pub fn of(config: &Config) -> anyhow::Result<Target> {
        if let Some((info, token)) = running_appliance(&config.data_dir) {
            let client = admin_client(&info.url, &info.certificate_fingerprint, &token)?;
            return Ok(Target::Running {
                client: Box::new(client),
                info,
            });
        }
        Ok(Target::Offline(Box::new(open_local(config)?)))
    }

    fn describe(&self) -> String {
        match self {
            Target::Running { info, .. } => {
                format!("through the running appliance at {}", info.url)
            }
            Target::Offline(local) => format!("offline, in {}", local.datadir.root().display()),
        }
    }
}

fn connect_error(e: connectrpc::ConnectError) -> anyhow::Error {
    anyhow!(e.message.unwrap_or_else(|| format!("{:?}", e.code)))
}

/// `agentbay client create`.
pub async fn client_create(
    config: &Config,
    tenant: &str,
    scopes: &[String],
    description: &str,
    json: bool,
) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let (client_id, tenant_id, granted, secret) = match &target {
        Target::Running { client, .. } => {
            let response = client
                .create_client(pb::CreateClientRequest {
                    tenant_id: tenant.to_string(),
                    scopes: scopes.to_vec(),
                    description: description.to_string(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?
                .into_owned();
            let c = response.client.as_option().cloned().unwrap_or_default();
            (c.client_id, c.tenant_id, c.scopes, response.client_secret)
        }
        Target::Offline(local) => {
            let tenant = TenantId::parse_field("--tenant", tenant)?;
            let scopes = parse_scopes(scopes)?;
            let (c, secret) = clients::create(
                &local.store,
                TenantScope::new(tenant),
                scopes,
                description,
                chrono::Utc::now(),
            )
            .await?;
            (
                c.client_id.clone(),
                c.tenant_id.to_string(),
                c.scopes.iter().map(|s| s.to_string()).collect(),
                secret,
            )
        }
    };
    if json {
        println!(
            "{}",
            serde_json::json!({ "client_id": client_id, "client_secret": secret, "tenant_id": tenant_id, "scopes": granted })
        );
    } else {
        println!("created a client credential ({}):", target.describe());
        println!("  client_id:     {client_id}");
        println!("  client_secret: {secret}");
        println!("  tenant:        {tenant_id}");
        println!("  scopes:        {}", granted.join(" "));
        println!("The secret is shown only now; agentbay keeps only its hash.");
    }
    close(target)
}

/// `agentbay client list`.
pub async fn client_list(config: &Config, json: bool) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let clients: Vec<pb::Client> = match &target {
        Target::Running { client, .. } => {
            client
                .list_clients(pb::ListClientsRequest::default())
                .await
                .map_err(connect_error)?
                .into_owned()
                .clients
        }
        Target::Offline(local) => {
            clients::list_all(&local.store, &crate::store::PlatformScope::internal())?
                .iter()
                .map(crate::api::rpc::admin::client_message)
                .collect()
        }
    };
    if json {
        let rows: Vec<_> = clients
            .iter()
            .map(|c| {
                serde_json::json!({
                    "client_id": c.client_id, "tenant_id": c.tenant_id, "scopes": c.scopes,
                    "description": c.description, "created_at": c.created_at,
                    "revoked_at": if c.revoked_at.is_empty() { None } else { Some(&c.revoked_at) },
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("{:<48} {:<12} {:<8} scopes", "client_id", "tenant", "state");
        for c in &clients {
            let state = if c.revoked_at.is_empty() {
                "live"
            } else {
                "revoked"
            };
            println!(
                "{:<48} {:<12} {:<8} {}",
                c.client_id,
                c.tenant_id,
                state,
                c.scopes.join(" ")
            );
        }
    }
    close(target)
}

/// `agentbay client revoke`.
pub async fn client_revoke(config: &Config, client_id: &str) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    match &target {
        Target::Running { client, .. } => {
            client
                .revoke_client(pb::RevokeClientRequest {
                    client_id: client_id.to_string(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?;
        }
        Target::Offline(local) => {
            let tenant = ClientCredential::tenant_of(client_id)
                .ok_or_else(|| anyhow!("{client_id:?} is not a client id"))?;
            clients::revoke(
                &local.store,
                None,
                TenantScope::new(tenant),
                client_id,
                chrono::Utc::now(),
            )
            .await?;
        }
    }
    println!("revoked {client_id} ({})", target.describe());
    close(target)
}

/// `agentbay backup FILE`.
pub async fn backup(config: &Config, file: &Path) -> anyhow::Result<()> {
    if file.exists() {
        bail!("{} exists already; choose a new file name", file.display());
    }
    let partial = file.with_extension("partial");
    let target = Target::of(config)?;
    let result = async {
        match &target {
            Target::Running { client, .. } => {
                let mut out = std::fs::File::create(&partial)
                    .with_context(|| format!("creating {}", partial.display()))?;
                let mut stream = client
                    .backup(pb::BackupRequest::default())
                    .await
                    .map_err(connect_error)?;
                let mut bytes = 0usize;
                while let Some(chunk) = stream.message().await.map_err(connect_error)? {
                    out.write_all(chunk.data())?;
                    bytes += chunk.data().len();
                }
                out.sync_all()?;
                Ok::<_, anyhow::Error>(format!("{bytes} bytes"))
            }
            Target::Offline(local) => {
                let out = std::fs::File::create(&partial)
                    .with_context(|| format!("creating {}", partial.display()))?;
                let files = crate::tls::backup_files(&local.datadir.tls_dir());
                let summary = local.store.backup(out, files).await?;
                std::fs::File::open(&partial)?.sync_all()?;
                Ok(format!(
                    "{} records, {} files",
                    summary.records, summary.files
                ))
            }
        }
    }
    .await;
    match result {
        Ok(what) => {
            std::fs::rename(&partial, file)?;
            println!(
                "backup written to {} ({what}, {})",
                file.display(),
                target.describe()
            );
            close(target)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// `agentbay restore FILE`.
pub fn restore(config: &Config, file: &Path) -> anyhow::Result<()> {
    let summary = crate::store::restore_into(file, &config.data_dir)?;
    println!(
        "restored {} records and {} files (schema {}) into {}",
        summary.records,
        summary.files,
        summary.schema_version,
        config.data_dir.display()
    );
    Ok(())
}

/// `agentbay init`: creates the data directory, the certificate and the
/// bootstrap credential without serving.
pub async fn init(config: &Config, json: bool) -> anyhow::Result<()> {
    let local = open_local(config)?;
    let material = crate::tls::load_or_generate(&config.tls, &local.datadir.tls_dir())?;
    let clock = SystemClock::shared();
    let editions: Vec<String> = config.capacity.edition_defaults.keys().cloned().collect();
    crate::capacity::ensure_platform_tenant(&local.store, &editions, clock.now()).await?;
    let created = crate::app::bootstrap(&local.store, &clock).await?;
    match (&created, json) {
        (Some(b), true) => println!(
            "{}",
            serde_json::json!({
                "client_id": b.credential.client_id,
                "client_secret": b.secret,
                "certificate_fingerprint": material.fingerprint,
            })
        ),
        (Some(b), false) => {
            println!("initialised {}", config.data_dir.display());
            println!("  certificate {}", material.fingerprint);
            crate::app::print_bootstrap(b, config, None);
        }
        (None, true) => println!(
            "{}",
            serde_json::json!({ "certificate_fingerprint": material.fingerprint, "already_initialised": true })
        ),
        (None, false) => {
            println!("{} is already initialised", config.data_dir.display());
            println!("  certificate {}", material.fingerprint);
        }
    }
    close(Target::Offline(Box::new(local)))
}

fn close(target: Target) -> anyhow::Result<()> {
    if let Target::Offline(local) = target {
        local.store.close()?;
    }
    Ok(())
}

/// The capacity service over the offline store, for registry commands.
async fn offline_capacity(
    config: &Config,
    local: &Local,
) -> anyhow::Result<std::sync::Arc<crate::capacity::Capacity>> {
    Ok(crate::capacity::Capacity::start(
        local.store.clone(),
        SystemClock::shared(),
        &config.capacity,
        Box::new(|| {}),
    )
    .await?)
}

/// `agentbay tenant put`.
pub async fn tenant_put(
    config: &Config,
    tenant: &str,
    edition: &str,
    display_name: Option<&str>,
    regions: &[String],
) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let (id, edition, regions) = match &target {
        Target::Running { client, .. } => {
            let t = client
                .put_tenant(pb::PutTenantRequest {
                    tenant_id: tenant.to_string(),
                    display_name: display_name.unwrap_or_default().to_string(),
                    edition: edition.to_string(),
                    residency_regions: regions.to_vec(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?
                .into_owned();
            let t = t.tenant.as_option().cloned().unwrap_or_default();
            (t.tenant_id, t.edition, t.residency_regions)
        }
        Target::Offline(local) => {
            let capacity = offline_capacity(config, local).await?;
            let t = capacity
                .put_tenant(
                    TenantId::parse_field("TENANT", tenant)?,
                    crate::domain::tenant::TenantSpec {
                        display_name: display_name.map(str::to_string),
                        edition: edition.to_string(),
                        residency_regions: regions.to_vec(),
                    },
                )
                .await?;
            (t.tenant_id.to_string(), t.edition, t.residency_regions)
        }
    };
    let regions = if regions.is_empty() {
        "any".to_string()
    } else {
        regions.join(", ")
    };
    println!(
        "tenant {id}: edition {edition}, regions {regions} ({})",
        target.describe()
    );
    close(target)
}

/// `agentbay tenant list`.
pub async fn tenant_list(config: &Config, json: bool) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let tenants: Vec<pb::Tenant> = match &target {
        Target::Running { client, .. } => {
            client
                .list_tenants(pb::ListTenantsRequest::default())
                .await
                .map_err(connect_error)?
                .into_owned()
                .tenants
        }
        Target::Offline(local) => offline_capacity(config, local)
            .await?
            .tenants()
            .iter()
            .map(crate::api::rpc::admin::tenant_message)
            .collect(),
    };
    if json {
        let rows: Vec<_> = tenants
            .iter()
            .map(|t| {
                serde_json::json!({
                    "tenant_id": t.tenant_id, "display_name": t.display_name,
                    "edition": t.edition, "residency_regions": t.residency_regions,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("{:<24} {:<12} regions", "tenant", "edition");
        for t in &tenants {
            let regions = if t.residency_regions.is_empty() {
                "any".to_string()
            } else {
                t.residency_regions.join(", ")
            };
            println!("{:<24} {:<12} {regions}", t.tenant_id, t.edition);
        }
    }
    close(target)
}

/// `agentbay project put`.
pub async fn project_put(
    config: &Config,
    tenant: &str,
    project: &str,
    display_name: Option<&str>,
) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    match &target {
        Target::Running { client, .. } => {
            client
                .put_project(pb::PutProjectRequest {
                    tenant_id: tenant.to_string(),
                    project_id: project.to_string(),
                    display_name: display_name.unwrap_or_default().to_string(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?;
        }
        Target::Offline(local) => {
            offline_capacity(config, local)
                .await?
                .put_project(
                    TenantId::parse_field("TENANT", tenant)?,
                    crate::domain::ProjectId::parse_field("PROJECT", project)?,
                    display_name.map(str::to_string),
                )
                .await?;
        }
    }
    println!(
        "project {tenant}/{project} registered ({})",
        target.describe()
    );
    close(target)
}
