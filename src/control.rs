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
use crate::domain::access::TenantScope;
use crate::domain::access::parse_scopes;
use crate::domain::credential::ClientCredential;
use crate::proto::agentbay::admin::v1 as pb;
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
    Ok(pb::AdminClient::new(
        pinned_transport(fingerprint),
        client_config(url, token)?,
    ))
}

/// A client configuration for `url` with `token` as its bearer.
fn client_config(url: &str, token: &str) -> anyhow::Result<ClientConfig> {
    Ok(
        ClientConfig::new(url.parse().with_context(|| format!("{url} is not a URL"))?)
            .with_default_header("authorization", format!("Bearer {token}")),
    )
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

/// `agentbay rotate-token-key`: a new token signing key, offline only.
pub async fn rotate_token_key(config: &Config) -> anyhow::Result<()> {
    match Target::of(config)? {
        Target::Running { info, .. } => bail!(
            "the appliance runs (pid {}, {}); stop it first (systemctl stop agentbay): it keeps the key in memory",
            info.pid,
            info.url
        ),
        Target::Offline(local) => {
            crate::auth::token::TokenKeys::rotate(&local.store).await?;
            println!(
                "The token signing key of {} is new: every token issued before is refused from the next start; clients ask for new ones with their credentials.",
                local.datadir.root().display()
            );
            Ok(())
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
                &owner(),
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
        Target::Offline(local) => clients::list_all(
            &local.store,
            &crate::domain::access::PlatformScope::internal(),
        )?
        .iter()
        .map(crate::api::rpc::admin::client_message)
        .collect(),
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
                &owner(),
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

/// What `agentbay user create` asks for.
pub struct NewUserArgs<'a> {
    /// Tenant.
    pub tenant: &'a str,
    /// Sign-in name.
    pub username: &'a str,
    /// Role names.
    pub roles: &'a [String],
    /// Display name.
    pub name: &'a str,
    /// The password; generated when `None`.
    pub password: Option<String>,
    /// The mail address.
    pub email: Option<String>,
}

/// `agentbay user create`.
pub async fn user_create(config: &Config, args: NewUserArgs<'_>, json: bool) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let (user, generated) = match &target {
        Target::Running { client, .. } => {
            let response = client
                .create_user(pb::CreateUserRequest {
                    tenant_id: args.tenant.to_string(),
                    username: args.username.to_string(),
                    display_name: args.name.to_string(),
                    roles: args.roles.to_vec(),
                    password: args.password.clone().unwrap_or_default(),
                    email: args.email.clone().unwrap_or_default(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?
                .into_owned();
            (
                response.user.as_option().cloned().unwrap_or_default(),
                response.generated_password,
            )
        }
        Target::Offline(local) => {
            let tenant = TenantId::parse_field("--tenant", args.tenant)?;
            let roles = crate::domain::user::parse_roles(args.roles)?;
            let (user, generated) = crate::auth::users::create(
                &local.store,
                &owner(),
                crate::auth::users::NewUser {
                    tenant: TenantScope::new(tenant),
                    username: args.username,
                    display_name: args.name,
                    roles,
                    password: args.password.as_deref(),
                    email: args.email.as_deref().unwrap_or_default(),
                },
                chrono::Utc::now(),
            )
            .await?;
            (
                crate::api::rpc::admin::user_message(&user),
                generated.unwrap_or_default(),
            )
        }
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "username": user.username, "tenant_id": user.tenant_id, "roles": user.roles,
                "password": if generated.is_empty() { None } else { Some(&generated) },
            })
        );
    } else {
        println!(
            "created user {} in tenant {} with roles {} ({})",
            user.username,
            user.tenant_id,
            user.roles.join(", "),
            target.describe()
        );
        if !generated.is_empty() {
            println!("  password: {generated}   (shown once; only its hash is kept)");
        }
    }
    close(target)
}

/// `agentbay user list`.
pub async fn user_list(config: &Config, tenant: Option<&str>, json: bool) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let users: Vec<pb::User> = match &target {
        Target::Running { client, .. } => {
            client
                .list_users(pb::ListUsersRequest {
                    tenant_id: tenant.unwrap_or_default().to_string(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?
                .into_owned()
                .users
        }
        Target::Offline(local) => {
            let list = match tenant {
                Some(t) => crate::auth::users::list(
                    &local.store,
                    &TenantScope::new(TenantId::parse_field("--tenant", t)?),
                )?,
                None => crate::auth::users::list_all(
                    &local.store,
                    &crate::domain::access::PlatformScope::internal(),
                )?,
            };
            list.iter()
                .map(crate::api::rpc::admin::user_message)
                .collect()
        }
    };
    if json {
        let rows: Vec<_> = users
            .iter()
            .map(|u| {
                serde_json::json!({
                    "username": u.username, "tenant_id": u.tenant_id, "roles": u.roles,
                    "display_name": u.display_name, "created_at": u.created_at,
                    "disabled_at": if u.disabled_at.is_empty() { None } else { Some(&u.disabled_at) },
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("{:<24} {:<12} {:<9} roles", "username", "tenant", "state");
        for u in &users {
            let state = if u.disabled_at.is_empty() {
                "active"
            } else {
                "disabled"
            };
            println!(
                "{:<24} {:<12} {:<9} {}",
                u.username,
                u.tenant_id,
                state,
                u.roles.join(" ")
            );
        }
    }
    close(target)
}

/// `agentbay user disable`.
pub async fn user_disable(config: &Config, tenant: &str, username: &str) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    match &target {
        Target::Running { client, .. } => {
            client
                .disable_user(pb::DisableUserRequest {
                    tenant_id: tenant.to_string(),
                    username: username.to_string(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?;
        }
        Target::Offline(local) => {
            crate::auth::users::disable(
                &local.store,
                &owner(),
                TenantScope::new(TenantId::parse_field("--tenant", tenant)?),
                username,
                chrono::Utc::now(),
            )
            .await?;
        }
    }
    println!("disabled {username} in {tenant} ({})", target.describe());
    close(target)
}

/// `agentbay user set-email`.
pub async fn user_set_email(
    config: &Config,
    tenant: &str,
    username: &str,
    email: &str,
) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    match &target {
        Target::Running { client, .. } => {
            client
                .set_user_email(pb::SetUserEmailRequest {
                    tenant_id: tenant.to_string(),
                    username: username.to_string(),
                    email: email.to_string(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?;
        }
        Target::Offline(local) => {
            crate::auth::users::set_email(
                &local.store,
                &owner(),
                TenantScope::new(TenantId::parse_field("--tenant", tenant)?),
                username,
                email,
                chrono::Utc::now(),
            )
            .await?;
        }
    }
    match email.trim() {
        "" => println!(
            "cleared the mail address of {username} in {tenant} ({})",
            target.describe()
        ),
        e => println!(
            "{username} in {tenant} is mailed at {e} ({})",
            target.describe()
        ),
    }
    close(target)
}

/// `agentbay user enable`.
pub async fn user_enable(config: &Config, tenant: &str, username: &str) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    match &target {
        Target::Running { client, .. } => {
            client
                .enable_user(pb::EnableUserRequest {
                    tenant_id: tenant.to_string(),
                    username: username.to_string(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?;
        }
        Target::Offline(local) => {
            crate::auth::users::enable(
                &local.store,
                &owner(),
                TenantScope::new(TenantId::parse_field("--tenant", tenant)?),
                username,
                chrono::Utc::now(),
            )
            .await?;
        }
    }
    println!("enabled {username} in {tenant} ({})", target.describe());
    close(target)
}

/// `agentbay user reset-password`: a password from a file, or a generated
/// one printed once.
pub async fn user_reset_password(
    config: &Config,
    tenant: &str,
    username: &str,
    password: Option<String>,
) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let generated = match &target {
        Target::Running { client, .. } => {
            client
                .reset_user_password(pb::ResetUserPasswordRequest {
                    tenant_id: tenant.to_string(),
                    username: username.to_string(),
                    password: password.unwrap_or_default(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?
                .into_owned()
                .generated_password
        }
        Target::Offline(local) => {
            let generated = password
                .is_none()
                .then(crate::auth::users::generate_password);
            crate::auth::users::set_password(
                &local.store,
                &owner(),
                TenantScope::new(TenantId::parse_field("--tenant", tenant)?),
                username,
                password
                    .as_deref()
                    .or(generated.as_deref())
                    .unwrap_or_default(),
                chrono::Utc::now(),
            )
            .await?;
            generated.unwrap_or_default()
        }
    };
    if generated.is_empty() {
        println!(
            "password of {username} in {tenant} set ({})",
            target.describe()
        );
    } else {
        println!(
            "password of {username} in {tenant} reset ({}); the new password, shown once:\n  {generated}",
            target.describe()
        );
    }
    close(target)
}

/// The appliance's owner at the machine: what the offline CLI acts as.
fn owner() -> crate::domain::access::Actor {
    crate::domain::access::Actor::owner("the appliance's owner (agentbay command line)")
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
                let mut out = crate::store::datadir::create_private_file(&partial)?;
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
                let files = crate::store::datadir::backup_files(local.datadir.root());
                let summary = local.store.backup_file(&partial, files).await?;
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
pub async fn restore(config: &Config, file: &Path) -> anyhow::Result<()> {
    let backend = crate::app::store_backend(config, &config.store.backend, config.listen, "")?;
    let summary = crate::store::restore_to(file, &config.data_dir, &backend)?;
    // The restored store records that it was restored, and by whom.
    if let Target::Offline(local) = Target::of(config)? {
        let change = crate::domain::audit::Change::new(
            &crate::domain::TenantId::platform(),
            "backup.restore",
            file.display().to_string(),
        )
        .detail(format!("{} records restored", summary.records));
        let recorded = local.store.record_action(chrono::Utc::now(), change).await;
        close(Target::Offline(local))?;
        recorded?;
    }
    let into = match &backend {
        crate::store::Backend::Sled => config.data_dir.display().to_string(),
        crate::store::Backend::Postgres(pg) => format!(
            "{} (files) and the PostgreSQL store ({})",
            config.data_dir.display(),
            pg.describe()
        ),
    };
    println!(
        "restored {} records and {} files (schema {}) into {into}",
        summary.records, summary.files, summary.schema_version,
    );
    Ok(())
}

/// `agentbay store migrate --to BACKEND`: copies the stopped appliance's
/// store to the other backend and verifies it.
pub fn migrate_store(
    config: &Config,
    to: crate::config::StoreBackend,
    json: bool,
) -> anyhow::Result<()> {
    use crate::config::StoreBackend;
    let from = config.store.backend;
    if from == to {
        anyhow::bail!(
            "the store is already on {} (store.backend); --to names the backend to move it to",
            backend_name(to)
        );
    }
    if to == StoreBackend::Postgres {
        config.store.postgres.check()?;
    }
    // No appliance may run on this data directory meanwhile.
    let datadir = crate::store::DataDir::open(&config.data_dir).map_err(|e| match e {
        crate::store::StoreError::InUse { .. } => anyhow::anyhow!(
            "{e}; stop the appliance first (systemctl stop agentbay): the store is copied as it stands"
        ),
        e => e.into(),
    })?;
    let path = datadir.store_path();
    let source = crate::app::store_backend(config, &from, config.listen, "")?;
    let target = crate::app::store_backend(config, &to, config.listen, "")?;
    let tables = crate::store::migrate::migrate(&path, &source, &target)?;
    let records: u64 = tables.iter().map(|t| t.records).sum();
    if json {
        println!(
            "{}",
            serde_json::json!({"from": backend_name(from), "to": backend_name(to), "records": records, "tables": tables})
        );
    } else {
        println!(
            "copied {records} records in {} tables from {} to {}; every table read back with the same count and SHA-256:",
            tables.len(),
            backend_name(from),
            backend_name(to)
        );
        for t in tables.iter().filter(|t| t.records > 0) {
            println!("  {:<20} {:>8}  {}", t.table, t.records, t.sha256);
        }
        println!(
            "now set store.backend = \"{}\" and start the appliance; the {} store is left as it was",
            backend_name(to),
            backend_name(from)
        );
    }
    Ok(())
}

fn backend_name(backend: crate::config::StoreBackend) -> &'static str {
    match backend {
        crate::config::StoreBackend::Sled => "sled",
        crate::config::StoreBackend::Postgres => "postgres",
    }
}

/// `agentbay init`: creates the data directory, the certificate and the
/// bootstrap credential without serving.
pub async fn init(config: &Config, json: bool) -> anyhow::Result<()> {
    let local = open_local(config)?;
    let material = crate::tls::load_or_generate(&config.tls, &local.datadir.tls_dir())?;
    let clock = SystemClock::shared();
    let editions: Vec<String> = config.capacity.edition_defaults.keys().cloned().collect();
    crate::capacity::ensure_platform_tenant(&local.store, &editions, clock.now()).await?;
    let created = crate::app::bootstrap(&local.store, local.datadir.root(), &clock).await?;
    match (&created, json) {
        (Some(b), true) => println!(
            "{}",
            serde_json::json!({
                "client_id": b.client_id,
                "client_secret": b.client_secret,
                "console_username": b.username,
                "console_password": b.password,
                "certificate_fingerprint": material.fingerprint,
                "already_initialised": !b.first_time,
            })
        ),
        (Some(b), false) => {
            if b.first_time {
                println!("initialised {}", config.data_dir.display());
            } else {
                println!("{} is already initialised", config.data_dir.display());
            }
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
    retention: Option<crate::domain::retention::RetentionOverride>,
) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let (id, name, edition, regions, kept) = match &target {
        Target::Running { client, .. } => {
            let t = client
                .put_tenant(pb::PutTenantRequest {
                    tenant_id: tenant.to_string(),
                    display_name: display_name.unwrap_or_default().to_string(),
                    edition: edition.to_string(),
                    residency_regions: regions.to_vec(),
                    payload_retention_days: retention.map(|r| r.payload_days.unwrap_or(0)),
                    history_retention_days: retention.map(|r| r.history_days.unwrap_or(0)),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?
                .into_owned();
            let t = t.tenant.as_option().cloned().unwrap_or_default();
            let kept = (t.payload_retention_days, t.history_retention_days);
            (
                t.tenant_id,
                t.display_name,
                t.edition,
                t.residency_regions,
                kept,
            )
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
                        retention,
                    },
                )
                .await?;
            let kept = (t.retention.payload_days, t.retention.history_days);
            (
                t.tenant_id.to_string(),
                t.display_name,
                t.edition,
                t.residency_regions,
                kept,
            )
        }
    };
    let regions = if regions.is_empty() {
        "any".to_string()
    } else {
        regions.join(", ")
    };
    let days = |d: Option<u32>| d.map_or("the default".to_string(), |d| format!("{d} days"));
    println!(
        "tenant {id} ({name}): edition {edition}, regions {regions}; payloads kept {}, history kept {} ({})",
        days(kept.0),
        days(kept.1),
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

/// The release service over the offline store, for trust commands.
async fn offline_releases(
    config: &Config,
    local: &Local,
) -> anyhow::Result<crate::releases::Releases> {
    Ok(crate::releases::Releases::open(
        local.store.clone(),
        SystemClock::shared(),
        &config.releases,
        crate::config::SiteRules::new(
            config,
            crate::config::Live::new(config.runtime.clone()),
            config.listen,
        ),
        crate::releases::demo_key(config)?,
    )
    .await?)
}

fn print_reverified(r: &pb::Reverified) {
    println!(
        "stored releases verified again: {} verified, {} untrusted, {} rejected{}",
        r.verified,
        r.untrusted,
        r.rejected,
        if r.changed + r.failed > 0 {
            format!(", {} left for the ReleaseCacheWarmer", r.changed + r.failed)
        } else {
            String::new()
        }
    );
}

/// `agentbay reload`: the running appliance reads its configuration again.
pub async fn reload(config: &Config) -> anyhow::Result<()> {
    let Target::Running { client, info } = Target::of(config)? else {
        bail!(
            "no appliance runs on {}: the next start reads the configuration",
            config.data_dir.display()
        );
    };
    // A reload reads the file the appliance started with; another one
    // given here would be ignored in silence.
    if let Some(given) = &config.source.file {
        let same = |f: &std::path::Path| {
            let canon = |p: &std::path::Path| std::fs::canonicalize(p).ok();
            canon(f).is_some() && canon(f) == canon(given)
        };
        if !info.config_file.as_deref().is_some_and(same) {
            bail!(
                "the appliance at {} reads {}, not {}: a reload reads the file it started with; \
                 to use another file, restart it with --config {}",
                info.url,
                info.config_file
                    .as_ref()
                    .map(|f| f.display().to_string())
                    .unwrap_or_else(|| "no configuration file (the built-in defaults)".into()),
                given.display(),
                given.display()
            );
        }
    }
    let r = client
        .reload_configuration(pb::ReloadConfigurationRequest::default())
        .await
        .map_err(connect_error)?
        .into_owned();
    println!(
        "configuration of the appliance at {} reloaded from {}",
        info.url, r.loaded_from
    );
    if r.applied.is_empty() && r.restart_needed.is_empty() {
        println!("nothing changed");
    }
    for key in &r.applied {
        println!("  in force now: {key}");
    }
    for key in &r.restart_needed {
        println!("  needs a restart (keeps its running value): {key}");
    }
    Ok(())
}

/// What `agentbay model` does.
pub enum ModelAction {
    /// Map or re-point a profile.
    Put(pb::PutModelProfileRequest),
    /// List them.
    List,
    /// Remove one.
    Delete(pb::DeleteModelProfileRequest),
}

/// `agentbay run rerun`, through the running appliance (whose runtime
/// runs the new run).
pub async fn rerun(
    config: &Config,
    request: crate::proto::agentbay::runs::v1::RerunFromCheckpointRequest,
) -> anyhow::Result<()> {
    use crate::proto::agentbay::runs::v1 as runs;
    let Some((info, token)) = running_appliance(&config.data_dir) else {
        bail!(
            "no appliance runs on {}: start it (a re-run is run by the running appliance)",
            config.data_dir.display()
        );
    };
    let client = runs::RunsClient::new(
        pinned_transport(&info.certificate_fingerprint),
        client_config(&info.url, &token)?,
    );
    let r = client
        .rerun_from_checkpoint(request)
        .await
        .map_err(connect_error)?
        .into_owned();
    let run = r.run.as_option().cloned().unwrap_or_default();
    let origin = run.rerun_of.as_option().cloned().unwrap_or_default();
    println!(
        "run {} ({}) starts from checkpoint {} of attempt {} (run {}) with release {}",
        run.run_id,
        run.state,
        origin.checkpoint_sequence,
        origin.attempt_id,
        origin.run_id,
        run.release_id
    );
    Ok(())
}

/// `agentbay model put|list|delete`, through the running appliance (the
/// profiles apply to its next model calls).
pub async fn model_profiles(config: &Config, action: ModelAction) -> anyhow::Result<()> {
    let Target::Running { client, info } = Target::of(config)? else {
        bail!(
            "no appliance runs on {}: start it (model profiles are set through the running appliance, whose next model calls use them)",
            config.data_dir.display()
        );
    };
    let line = |p: &pb::ModelProfile| {
        format!(
            "{:<24} {:<12} {}{} (model {}{}, timeout {} s, {})",
            p.profile_id,
            if p.tenant_id.is_empty() {
                "every tenant"
            } else {
                p.tenant_id.as_str()
            },
            p.endpoint,
            p.fallback_endpoints
                .iter()
                .map(|f| format!(", then {f}"))
                .collect::<String>(),
            p.model,
            if p.api_key_ref.is_empty() {
                String::new()
            } else {
                format!(", key {}", p.api_key_ref)
            },
            p.timeout_seconds,
            crate::domain::model_profile::ServerLimits::of(
                p.max_concurrent,
                p.requests_per_minute,
                p.tokens_per_minute
            )
            .map(|l| l.describe())
            .unwrap_or_default()
        )
    };
    match action {
        ModelAction::Put(request) => {
            let r = client
                .put_model_profile(request)
                .await
                .map_err(connect_error)?
                .into_owned();
            let p = r.profile.as_option().cloned().unwrap_or_default();
            println!("set through the running appliance at {}:", info.url);
            println!("{}", line(&p));
        }
        ModelAction::List => {
            let r = client
                .list_model_profiles(pb::ListModelProfilesRequest::default())
                .await
                .map_err(connect_error)?
                .into_owned();
            if r.profiles.is_empty() {
                println!("no model profiles: releases call their own endpoints");
            }
            for p in &r.profiles {
                println!("{}", line(p));
            }
        }
        ModelAction::Delete(request) => {
            let r = client
                .delete_model_profile(request)
                .await
                .map_err(connect_error)?
                .into_owned();
            let p = r.profile.as_option().cloned().unwrap_or_default();
            println!("removed: {}", line(&p));
        }
    }
    Ok(())
}

/// `agentbay trust add`.
pub async fn trust_add(
    config: &Config,
    name: &str,
    public_key: &str,
    tenants: &[String],
    replace: bool,
) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let (key, change, done) = match &target {
        Target::Running { client, .. } => {
            let r = client
                .trust_publisher_key(pb::TrustPublisherKeyRequest {
                    name: name.to_string(),
                    public_key: public_key.to_string(),
                    tenants: tenants.to_vec(),
                    replace,
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?
                .into_owned();
            (
                r.key.as_option().cloned().unwrap_or_default(),
                r.change,
                r.reverified.as_option().cloned().unwrap_or_default(),
            )
        }
        Target::Offline(local) => {
            let releases = offline_releases(config, local).await?;
            let (key, change, done) = releases
                .trust_key(
                    name,
                    public_key,
                    tenants,
                    replace,
                    "local administrator (offline)",
                )
                .await?;
            (
                crate::api::rpc::admin::key_message(&key, releases.demo_key_id()),
                change.unwrap_or_default(),
                crate::api::rpc::admin::reverified_message(done),
            )
        }
    };
    let scope = if key.tenants.is_empty() {
        "any tenant".to_string()
    } else {
        format!("tenants {}", key.tenants.join(", "))
    };
    if change.is_empty() {
        println!(
            "publisher key {} ({}) was already trusted for {scope}: nothing changed ({})",
            key.key_id,
            key.name,
            target.describe()
        );
    } else {
        println!(
            "publisher key {} {change} ({})",
            key.key_id,
            target.describe()
        );
    }
    print_reverified(&done);
    close(target)
}

/// `agentbay trust revoke`.
pub async fn trust_revoke(config: &Config, key_id: &str, reason: &str) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let (key, done) = match &target {
        Target::Running { client, .. } => {
            let r = client
                .revoke_publisher_key(pb::RevokePublisherKeyRequest {
                    key_id: key_id.to_string(),
                    reason: reason.to_string(),
                    ..Default::default()
                })
                .await
                .map_err(connect_error)?
                .into_owned();
            (
                r.key.as_option().cloned().unwrap_or_default(),
                r.reverified.as_option().cloned().unwrap_or_default(),
            )
        }
        Target::Offline(local) => {
            let releases = offline_releases(config, local).await?;
            let (key, done) = releases
                .revoke_key(key_id, reason, "local administrator (offline)")
                .await?;
            (
                crate::api::rpc::admin::key_message(&key, releases.demo_key_id()),
                crate::api::rpc::admin::reverified_message(done),
            )
        }
    };
    println!(
        "publisher key {} ({}) is revoked: {}; it no longer signs for {}, and what it signed is Untrusted ({})",
        key.key_id,
        key.name,
        key.revoke_reason,
        if key.tenants.is_empty() {
            "any tenant".to_string()
        } else {
            format!("tenants {}", key.tenants.join(", "))
        },
        target.describe()
    );
    print_reverified(&done);
    close(target)
}

/// `agentbay trust list`.
pub async fn trust_list(config: &Config, json: bool) -> anyhow::Result<()> {
    let target = Target::of(config)?;
    let keys: Vec<pb::PublisherKey> = match &target {
        Target::Running { client, .. } => {
            client
                .list_publisher_keys(pb::ListPublisherKeysRequest::default())
                .await
                .map_err(connect_error)?
                .into_owned()
                .keys
        }
        Target::Offline(local) => {
            let releases = offline_releases(config, local).await?;
            releases
                .keys()?
                .iter()
                .map(|k| crate::api::rpc::admin::key_message(k, releases.demo_key_id()))
                .collect()
        }
    };
    if json {
        let rows: Vec<_> = keys
            .iter()
            .map(|k| {
                serde_json::json!({
                    "key_id": k.key_id, "name": k.name, "state": k.state,
                    "tenants": k.tenants, "source": k.source, "demo": k.demo,
                    "trusted_by": k.trusted_by, "revoked_by": k.revoked_by,
                    "revoke_reason": k.revoke_reason,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!(
            "{:<26} {:<8} {:<14} {:<16} name",
            "key", "state", "source", "tenants"
        );
        for k in &keys {
            let tenants = if k.tenants.is_empty() {
                "any".to_string()
            } else {
                k.tenants.join(",")
            };
            println!(
                "{:<26} {:<8} {:<14} {:<16} {}{}",
                k.key_id,
                k.state,
                k.source,
                tenants,
                k.name,
                if k.revoke_reason.is_empty() {
                    String::new()
                } else {
                    format!(" (revoked by {}: {})", k.revoked_by, k.revoke_reason)
                }
            );
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

/// POSTs bytes to the running appliance with the local administration
/// token; returns the status and the JSON body.
async fn post_to_appliance(
    info: &RuntimeInfo,
    token: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> anyhow::Result<(u16, serde_json::Value)> {
    let (status, bytes) = call_appliance(
        info,
        token,
        http::Method::POST,
        path,
        Some((content_type, body)),
    )
    .await?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}

/// Sends one request to the running appliance with the local
/// administration token; returns the status and the body.
async fn call_appliance(
    info: &RuntimeInfo,
    token: &str,
    method: http::Method,
    path: &str,
    body: Option<(&str, Vec<u8>)>,
) -> anyhow::Result<(u16, bytes::Bytes)> {
    use http_body_util::{BodyExt as _, Full};
    let transport = pinned_transport(&info.certificate_fingerprint);
    let client = transport.inner().clone();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", info.url))
        .header("authorization", format!("Bearer {token}"));
    let bytes = match body {
        Some((content_type, bytes)) => {
            request = request.header("content-type", content_type);
            bytes
        }
        None => Vec::new(),
    };
    let body: ClientBody = Full::new(bytes::Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed();
    let response = client
        .request(request.body(body)?)
        .await
        .context("sending the request to the appliance")?;
    let status = response.status().as_u16();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}

/// GETs JSON from the running appliance; a refusal is its problem's detail.
async fn get_json<T: serde::de::DeserializeOwned>(
    info: &RuntimeInfo,
    token: &str,
    path: &str,
) -> anyhow::Result<T> {
    let (status, bytes) = call_appliance(info, token, http::Method::GET, path, None).await?;
    if status != 200 {
        bail!("{}", refusal_text(status, &bytes));
    }
    serde_json::from_slice(&bytes).with_context(|| format!("reading the answer of {path}"))
}

/// A problem+json refusal in words.
fn refusal_text(status: u16, bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_string))
        .unwrap_or_else(|| format!("the appliance answered {status}"))
}

/// `agentbay audit verify`.
pub async fn audit_verify(
    config: &Config,
    json: bool,
    expect: &crate::domain::audit::Expect,
) -> anyhow::Result<()> {
    let (report, how) = match Target::of(config)? {
        Target::Running { info, .. } => {
            let token = running_appliance(&config.data_dir)
                .map(|(_, t)| t)
                .unwrap_or_default();
            let mut query = Vec::new();
            if let Some(n) = expect.first {
                query.push(format!("expectFirst={n}"));
            }
            if let Some(h) = &expect.head {
                query.push(format!("expectHead={}", crate::console::urlencode(h)));
            }
            let path = if query.is_empty() {
                "/factory/audit/verify".to_string()
            } else {
                format!("/factory/audit/verify?{}", query.join("&"))
            };
            let report: crate::domain::audit::TrailReport = get_json(&info, &token, &path).await?;
            (
                report,
                format!("through the running appliance at {}", info.url),
            )
        }
        Target::Offline(local) => {
            let report = local.store.verify_audit(expect)?;
            let how = format!("offline, in {}", local.datadir.root().display());
            close(Target::Offline(local))?;
            (report, how)
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let range = match (report.first, report.last) {
            (Some(first), Some(last)) => format!(" (records {first} to {last})"),
            _ => String::new(),
        };
        match &report.broken {
            None => println!(
                "the audit trail is whole: {} records checked{range}, {how}\n  first follows {}\n  head {}",
                report.checked, report.anchor, report.head
            ),
            Some(b) => println!(
                "the audit trail is BROKEN at record {}: {}\n  {} records before it checked{range}, {how}\n  last good hash {}",
                b.sequence, b.reason, report.checked, report.head
            ),
        }
    }
    if !json {
        for unmet in &report.unmet {
            println!("  NOT AS EXPECTED: {unmet}");
        }
    }
    if report.broken.is_some() {
        bail!("the audit trail's hash chain is broken");
    }
    if !report.unmet.is_empty() {
        bail!(
            "the audit trail is not what was noted: {}",
            report.unmet.join("; ")
        );
    }
    Ok(())
}

/// `agentbay audit export`.
pub async fn audit_export(
    config: &Config,
    query: &[(&str, String)],
    csv: bool,
    out: Option<&Path>,
) -> anyhow::Result<()> {
    use crate::domain::audit::{AuditQuery, AuditRecord, MAX_AUDIT_PAGE};
    let mut records: Vec<AuditRecord> = Vec::new();
    match Target::of(config)? {
        Target::Running { info, .. } => {
            let token = running_appliance(&config.data_dir)
                .map(|(_, t)| t)
                .unwrap_or_default();
            let base: String = serde_urlencoded::to_string(query)?;
            let mut older: Option<u64> = None;
            loop {
                let mut path = format!("/factory/audit?limit={MAX_AUDIT_PAGE}");
                if !base.is_empty() {
                    path.push('&');
                    path.push_str(&base);
                }
                if let Some(b) = older {
                    path.push_str(&format!("&olderThan={b}"));
                }
                let page: serde_json::Value = get_json(&info, &token, &path).await?;
                let got: Vec<AuditRecord> =
                    serde_json::from_value(page.get("records").cloned().unwrap_or_default())?;
                records.extend(got);
                match page.get("nextOlderThan").and_then(|v| v.as_u64()) {
                    Some(b) => older = Some(b),
                    None => break,
                }
            }
        }
        Target::Offline(local) => {
            let get = |k: &str| {
                query
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.as_str())
            };
            let mut parsed =
                AuditQuery::parse(get).map_err(|e| anyhow!("--{}: {}", e.field, e.reason))?;
            parsed.filter.tenant = get("tenant")
                .map(|t| crate::domain::TenantId::parse_field("tenant", t))
                .transpose()
                .map_err(|e| anyhow!("--tenant: {}", e.reason))?;
            records = local.store.audit_page(&parsed.filter, None, usize::MAX)?;
            close(Target::Offline(local))?;
        }
    }
    let text = if csv {
        crate::api::audit::csv_of(&records)
    } else {
        serde_json::to_string_pretty(&records)? + "\n"
    };
    match out {
        Some(path) => {
            crate::store::datadir::write_private(path, text.as_bytes())?;
            eprintln!(
                "{} audit records written to {}",
                records.len(),
                path.display()
            );
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// `agentbay run export`, through the running appliance.
pub async fn run_export(
    config: &Config,
    run_id: &str,
    tenant: Option<&str>,
    out: Option<&Path>,
) -> anyhow::Result<()> {
    let Some((info, token)) = running_appliance(&config.data_dir) else {
        bail!(
            "no appliance runs on {}: start it (the export is made by the running appliance)",
            config.data_dir.display()
        );
    };
    let mut path = format!("/runtime/runs/{}/export", crate::console::urlencode(run_id));
    if let Some(t) = tenant {
        path.push_str(&format!("?tenant={}", crate::console::urlencode(t)));
    }
    let (status, bytes) = call_appliance(&info, &token, http::Method::GET, &path, None).await?;
    if status != 200 {
        bail!("{}", refusal_text(status, &bytes));
    }
    let file = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| std::path::PathBuf::from(format!("run-{run_id}.tar.gz")));
    if file.exists() {
        bail!("{} exists already; choose a new file name", file.display());
    }
    crate::store::datadir::write_private(&file, &bytes)?;
    println!(
        "run {run_id} exported to {} ({} bytes): open index.html inside it; manifest.json lists every file's sha256",
        file.display(),
        bytes.len()
    );
    Ok(())
}

/// `agentbay release keygen`.
pub fn release_keygen(out: &Path, force: bool) -> anyhow::Result<()> {
    let key_path = out.with_extension("key");
    let pub_path = out.with_extension("pub");
    if !force && (key_path.exists() || pub_path.exists()) {
        bail!(
            "{} or {} exists already; pass --force to replace it",
            key_path.display(),
            pub_path.display()
        );
    }
    let (private_pem, public, id) = crate::releases::signing::generate();
    crate::store::datadir::write_private(&key_path, private_pem.as_bytes())?;
    std::fs::write(&pub_path, format!("{public}\n"))?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!("generated publisher key {id}");
    println!(
        "  private key: {} (owner-only; keep it off the appliance)",
        key_path.display()
    );
    println!("  public key:  {}", pub_path.display());
    println!();
    println!("Trust it on an appliance (running or not; PlatformAdmin):");
    println!(
        "  agentbay trust add --name {name} --public-key-file {} [--tenant acme]",
        pub_path.display()
    );
    println!("or seed it from the configuration at every start:");
    println!("[[releases.trusted_keys]]");
    println!("name = \"{name}\"");
    println!("public_key = \"{public}\"");
    println!("# tenants = [\"acme\"]   # optional: the tenants it may sign for");
    Ok(())
}

/// `agentbay release sign`.
pub fn release_sign(dir: &Path, key: &Path, update_hashes: bool) -> anyhow::Result<()> {
    use crate::releases::bundle::{MANIFEST, SIGNATURE};
    if !dir.is_dir() {
        bail!(
            "{} is not a directory; sign the bundle directory, then pack it with tar if needed",
            dir.display()
        );
    }
    let pem = std::fs::read_to_string(key).with_context(|| format!("reading {}", key.display()))?;
    let pair = crate::releases::signing::read_private_key(&pem)?;
    let manifest_path = dir.join(MANIFEST);
    let text = std::fs::read(&manifest_path)
        .with_context(|| format!("reading {}", manifest_path.display()))?;
    let mut value: serde_json::Value =
        serde_json::from_slice(&text).context("manifest.json is not JSON")?;
    if update_hashes {
        update_file_hashes(dir, &mut value)?;
        let mut pretty = serde_json::to_vec_pretty(&value)?;
        pretty.push(b'\n');
        std::fs::write(&manifest_path, pretty)?;
    }
    let parsed = crate::releases::verify::parse_manifest(&serde_json::to_vec(&value)?)
        .map_err(|r| anyhow!(r.reason))?;
    for (role, path, expected) in parsed.manifest.files() {
        let bytes = std::fs::read(dir.join(path)).with_context(|| format!("{role} file {path}"))?;
        let actual = crate::domain::content::content_hash(&bytes);
        if actual != expected {
            bail!(
                "file {path} ({role}): the manifest says {expected}, the file is {actual}; fix it or pass --update-hashes"
            );
        }
    }
    let signature = crate::releases::signing::sign(&pair, &parsed.canonical);
    std::fs::write(dir.join(SIGNATURE), serde_json::to_vec_pretty(&signature)?)?;
    println!(
        "signed release {} (manifest {}) with {}",
        parsed.manifest.release_id, parsed.manifest_hash, signature.key_id
    );
    Ok(())
}

/// Sets every `sha256` next to a `path` in the manifest from the file.
fn update_file_hashes(dir: &Path, value: &mut serde_json::Value) -> anyhow::Result<()> {
    match value {
        serde_json::Value::Object(map) => {
            if let (Some(serde_json::Value::String(path)), true) =
                (map.get("path"), map.contains_key("sha256"))
            {
                crate::domain::release::check_path("path", path)
                    .map_err(|e| anyhow!("{}", e.reason))?;
                let bytes = std::fs::read(dir.join(path.as_str()))
                    .with_context(|| format!("reading {path}"))?;
                map.insert(
                    "sha256".into(),
                    serde_json::Value::String(crate::domain::content::content_hash(&bytes)),
                );
            }
            for v in map.values_mut() {
                update_file_hashes(dir, v)?;
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                update_file_hashes(dir, v)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `agentbay release verify`: prints the verification report. Returns
/// whether the bundle verified.
pub fn release_verify(
    config: &Config,
    bundle: &Path,
    extra_trust: &[std::path::PathBuf],
) -> anyhow::Result<bool> {
    let mut trusted = crate::releases::configured_keys(&config.releases);
    for path in extra_trust {
        let public =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let name = path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        trusted.push(crate::releases::signing::TrustedKey::new(
            &name,
            &public,
            Vec::new(),
        )?);
    }
    let limits = crate::releases::bundle::Limits {
        max_bundle_bytes: config.releases.max_bundle_bytes,
        max_file_bytes: config.releases.max_file_bytes,
        max_files: config.releases.max_files,
    };
    println!("verification of {}", bundle.display());
    let read = match crate::releases::bundle::Bundle::from_path(bundle, &limits) {
        Ok(b) => b,
        Err(e) => {
            println!("  REJECTED: the bundle cannot be read: {e}");
            return Ok(false);
        }
    };
    println!("  ok  bundle: {} files", read.files.len());
    let site = crate::config::SiteRules::new(
        config,
        crate::config::Live::new(config.runtime.clone()),
        config.listen,
    );
    let report = crate::releases::verify::verify(
        &read,
        &crate::releases::signing::Trust::of(trusted),
        &|t| site.reach(t),
    );
    for line in &report.passed {
        println!("  ok  {line}");
    }
    match &report.rejection {
        None => {
            println!("  VERIFIED");
            Ok(true)
        }
        Some(r) => {
            println!("  REJECTED ({}): {}", r.category, r.reason);
            Ok(false)
        }
    }
}

/// `agentbay release import`.
pub async fn release_import(config: &Config, path: &Path) -> anyhow::Result<()> {
    let limits = crate::releases::bundle::Limits {
        max_bundle_bytes: config.releases.max_bundle_bytes,
        max_file_bytes: config.releases.max_file_bytes,
        max_files: config.releases.max_files,
    };
    let bundle = crate::releases::bundle::Bundle::from_path(path, &limits)?;
    if let Some((info, token)) = running_appliance(&config.data_dir) {
        let (status, body) = post_to_appliance(
            &info,
            &token,
            "/runtime/releases",
            "application/gzip",
            bundle.to_archive(),
        )
        .await?;
        let release = body.get("release").cloned().unwrap_or_default();
        match status {
            200 | 201 => {
                println!(
                    "release {} verified (manifest {}, adapter {}) through the running appliance at {}",
                    release["releaseId"].as_str().unwrap_or("?"),
                    release["manifestHash"].as_str().unwrap_or("?"),
                    release["adapterVersion"].as_str().unwrap_or("?"),
                    info.url
                );
                Ok(())
            }
            _ => bail!(
                "{}",
                body["detail"]
                    .as_str()
                    .unwrap_or("the appliance refused the bundle")
            ),
        }
    } else {
        let local = open_local(config)?;
        let releases = crate::releases::Releases::open(
            local.store.clone(),
            SystemClock::shared(),
            &config.releases,
            crate::config::SiteRules::new(
                config,
                crate::config::Live::new(config.runtime.clone()),
                config.listen,
            ),
            crate::releases::demo_key(config)?,
        )
        .await?;
        let report = releases.check(&bundle);
        let outcome = releases
            .record(bundle, report, "local administrator (offline)")
            .await;
        local.store.close()?;
        match outcome {
            Ok(r) => {
                println!(
                    "release {} verified (manifest {}, adapter {}), offline",
                    r.release_id, r.manifest_hash, r.adapter_version
                );
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}
