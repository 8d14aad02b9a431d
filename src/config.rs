//! Configuration: one struct, three sources.
//!
//! Precedence is file < environment < command line. The file is TOML
//! (`--config`, or `AGENTBAY_CONFIG`); every key can be overridden by an
//! environment variable named `AGENTBAY_` + the key path in upper case with
//! `__` between sections (`tls.cert` -> `AGENTBAY_TLS__CERT`,
//! `data_dir` -> `AGENTBAY_DATA_DIR`); `serve --data-dir/--listen` win over
//! both. With no source at all the defaults run: data in `./agentbay-data`,
//! HTTPS on `127.0.0.1:8443`, a generated certificate.
//!
//! An unknown key, in the file or the environment, and a value of the wrong
//! type or out of range stop the start with the key and the reason named:
//! a typo must never be silently ignored on an appliance.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Prefix of environment overrides.
pub const ENV_PREFIX: &str = "AGENTBAY_";
/// Keys of earlier versions and where they went: an old configuration is
/// refused with the new key named, never half-applied (a retention silently
/// shortened would delete data).
const MOVED: &[(&str, &str)] = &[
    ("runtime.payload_retention_days", "retention.payload_days"),
    (
        "events.retention_days",
        "retention.history_days (events are history)",
    ),
];

/// Environment variables with the prefix that are not config keys: the
/// file, and the settings of the appliance's clients (the Python SDK, the
/// example adapters), which share a shell with the CLI.
const RESERVED_ENV: &[&str] = &[
    "AGENTBAY_CONFIG",
    "AGENTBAY_URL",
    "AGENTBAY_CA",
    "AGENTBAY_FINGERPRINT",
    "AGENTBAY_CLIENT_ID",
    "AGENTBAY_CLIENT_SECRET",
    "AGENTBAY_TOKEN",
];

/// The whole configuration of the appliance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the store, the generated certificate and the run files live.
    pub data_dir: PathBuf,
    /// Address of the HTTPS listener (there is no plaintext one).
    pub listen: SocketAddr,
    /// Certificate settings.
    pub tls: TlsConfig,
    /// Token settings.
    pub auth: AuthConfig,
    /// HTTP limits and shutdown.
    pub http: HttpConfig,
    /// Logging.
    pub log: LogConfig,
    /// Traces to the site's collector.
    pub telemetry: TelemetryConfig,
    /// Store tuning.
    pub store: StoreConfig,
    /// The event stream.
    pub events: EventsConfig,
    /// How long payloads and history are kept, and the Purger.
    pub retention: RetentionConfig,
    /// Scheduled backups.
    pub backup: BackupConfig,
    /// How background workers retry a failed pass.
    pub workers: WorkersConfig,
    /// Signed webhook deliveries.
    pub webhooks: WebhooksConfig,
    /// Telling people a decision waits for them: mail, and the links in
    /// mails and chat messages.
    pub notify: NotifyConfig,
    /// Pools, quotas and leases (`RuntimeCloud:Capacity`).
    pub capacity: CapacityConfig,
    /// Release bundles and the publishers trusted to sign them.
    pub releases: ReleasesConfig,
    /// Attempt execution (`Runtime:*`).
    pub runtime: RuntimeConfig,
    /// The demo tenant a zero-config start seeds.
    pub demo: DemoConfig,
    /// Where it was read from, so that a reload reads the same sources.
    #[serde(skip)]
    pub source: ConfigSource,
}

/// The sources a configuration was read from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigSource {
    /// The file (`--config` or `AGENTBAY_CONFIG`).
    pub file: Option<PathBuf>,
    /// Values given on the command line.
    pub cli: CliOverrides,
}

impl ConfigSource {
    /// In words, for the System page and the log.
    pub fn describe(&self) -> String {
        match &self.file {
            Some(f) => format!("{} and the AGENTBAY_* environment", f.display()),
            None => "the built-in defaults and the AGENTBAY_* environment".into(),
        }
    }
}

/// A section of the configuration that the appliance reads at every use,
/// so that a reload takes effect without a restart.
#[derive(Debug)]
pub struct Live<T>(Arc<parking_lot::RwLock<Arc<T>>>);

impl<T> Clone for Live<T> {
    fn clone(&self) -> Self {
        Live(self.0.clone())
    }
}

impl<T> Live<T> {
    /// A live value.
    pub fn new(value: T) -> Live<T> {
        Live(Arc::new(parking_lot::RwLock::new(Arc::new(value))))
    }

    /// The value now.
    pub fn get(&self) -> Arc<T> {
        self.0.read().clone()
    }

    /// Replaces the value (a reload).
    pub fn set(&self, value: T) {
        *self.0.write() = Arc::new(value);
    }
}

/// The demo: tenant `demo` with the example releases and a few runs, made
/// on the first start of a data directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DemoConfig {
    /// Seed the demo (packaged installs turn it off).
    pub enabled: bool,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig { enabled: true }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./agentbay-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 8443)),
            tls: TlsConfig::default(),
            auth: AuthConfig::default(),
            http: HttpConfig::default(),
            log: LogConfig::default(),
            telemetry: TelemetryConfig::default(),
            store: StoreConfig::default(),
            events: EventsConfig::default(),
            retention: RetentionConfig::default(),
            backup: BackupConfig::default(),
            workers: WorkersConfig::default(),
            webhooks: WebhooksConfig::default(),
            notify: NotifyConfig::default(),
            capacity: CapacityConfig::default(),
            releases: ReleasesConfig::default(),
            runtime: RuntimeConfig::default(),
            demo: DemoConfig::default(),
            source: ConfigSource::default(),
        }
    }
}

/// TLS: a certificate from files, or one generated in the data directory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first. Generated when absent.
    pub cert: Option<PathBuf>,
    /// PEM private key of the certificate.
    pub key: Option<PathBuf>,
    /// Extra DNS names or IP addresses for the generated certificate, beside
    /// localhost, 127.0.0.1, ::1 and the host name.
    pub extra_names: Vec<String>,
}

/// Bearer tokens issued by `POST /oauth/token`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Lifetime of an access token, in seconds (60 to 86400).
    pub token_ttl_seconds: u64,
    /// A console session ends after this many minutes without a request
    /// (5 to 1440).
    pub session_idle_minutes: u64,
    /// A console session ends this many hours after sign-in, however busy
    /// (1 to 168).
    pub session_max_hours: u64,
    /// Memory for concurrent secret checks, in MiB: each argon2id check
    /// holds 19 MiB, so this sizes how many run at once (16 to 4096).
    pub hash_memory_mb: u64,
    /// Failed checks of one name (client id, user name) from one source per
    /// minute before that pair is refused until the minute passes.
    pub failures_per_name_and_source: u64,
    /// Failed checks from one source per minute before its checks go one at
    /// a time, each after a second.
    pub failures_per_source: u64,
    /// Failed checks of one name per minute before each of its checks waits
    /// a second (never refused: nobody can lock an owner out).
    pub failures_per_name: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            token_ttl_seconds: 900,
            session_idle_minutes: 30,
            session_max_hours: 12,
            hash_memory_mb: 128,
            failures_per_name_and_source: 5,
            failures_per_source: 20,
            failures_per_name: 10,
        }
    }
}

/// The HTTP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// How long a shutdown waits for requests in flight, in seconds.
    pub drain_seconds: u64,
    /// Concurrent connections accepted; one over the limit is closed at once.
    pub max_connections: usize,
    /// Concurrent connections from one remote address (this host's own,
    /// loopback, is exempt), so that one source cannot take every slot.
    pub max_connections_per_address: usize,
    /// Time a client has to finish the TLS handshake and send a complete
    /// request head, counted from its first byte, in seconds.
    pub header_read_timeout_seconds: u64,
    /// Time a connection may stay open with no request in flight, in seconds.
    pub idle_timeout_seconds: u64,
    /// Time a request body has to arrive, from its request head, in seconds.
    pub body_read_timeout_seconds: u64,
    /// Interval of HTTP/2 keep-alive pings, in seconds.
    pub http2_keepalive_interval_seconds: u64,
    /// Time an HTTP/2 peer has to answer a ping before it is dropped, in seconds.
    pub http2_keepalive_timeout_seconds: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 1024 * 1024,
            drain_seconds: 20,
            max_connections: 1024,
            max_connections_per_address: 256,
            header_read_timeout_seconds: 10,
            idle_timeout_seconds: 30,
            body_read_timeout_seconds: 120,
            http2_keepalive_interval_seconds: 30,
            http2_keepalive_timeout_seconds: 10,
        }
    }
}

/// Log output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `auto` (text on a terminal, JSON otherwise), `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter, e.g. `info` or `agentbay=debug,info`.
    pub level: String,
    /// A directory for the log, one file a day (`agentbay.YYYY-MM-DD.log`,
    /// JSON lines), instead of standard error. The Windows service, whose
    /// standard error goes nowhere, logs to `ProgramData\agentbay\logs`.
    pub dir: Option<PathBuf>,
    /// How many daily files `dir` keeps; older ones are removed.
    pub keep_files: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Auto,
            level: "info".into(),
            dir: None,
            keep_files: 14,
        }
    }
}

/// Traces to the site's OpenTelemetry collector (OTLP over
/// HTTP/protobuf). Off unless an endpoint is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector: its base URL (`http://collector.site:4318`, spans go
    /// to `/v1/traces` under it) or the full URL of its traces endpoint.
    /// Empty: nothing leaves the appliance.
    pub otlp_endpoint: String,
    /// Spans waiting for export, at most; when the collector is away,
    /// newer spans are dropped rather than held in memory.
    pub otlp_queue_spans: u32,
    /// Time one export may take.
    pub otlp_timeout_seconds: u64,
    /// `service.name` of the spans.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: String::new(),
            otlp_queue_spans: 2048,
            otlp_timeout_seconds: 10,
            service_name: "agentbay".into(),
        }
    }
}

impl TelemetryConfig {
    /// The traces URL, when export is on.
    pub fn traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.trim();
        if base.is_empty() {
            return None;
        }
        let url = reqwest::Url::parse(base).ok()?;
        Some(if url.path() == "/" || url.path().is_empty() {
            format!("{}/v1/traces", base.trim_end_matches('/'))
        } else {
            base.to_string()
        })
    }
}

/// How log lines look.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Text on a terminal, JSON otherwise.
    Auto,
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Where the store is kept.
    pub backend: StoreBackend,
    /// sled's page cache size, in MiB.
    pub cache_mb: u64,
    /// The sled store reopens itself after this many MiB of records
    /// written, so that its page-table snapshot is fresh and a restart
    /// replays at most that much log (0: never).
    pub snapshot_every_mb: u64,
    /// The PostgreSQL store (`backend = "postgres"`).
    pub postgres: PostgresConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreBackend::Sled,
            cache_mb: 32,
            snapshot_every_mb: 32,
            postgres: PostgresConfig::default(),
        }
    }
}

/// Where the store is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// sled, in the data directory: one appliance, nothing to set up.
    #[default]
    Sled,
    /// The site's PostgreSQL, shared by two or more appliances of which
    /// one is active and the others stand by.
    Postgres,
}

/// The PostgreSQL store: the database every appliance of the pair points
/// at, and how this one is known to the others.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// A libpq connection string or URL: `postgresql://agentbay@db1,db2/agentbay?sslmode=require&target_session_attrs=read-write`.
    /// It may hold a password; it is never logged.
    pub url: Secret,
    /// PEM file of the CA that signed the PostgreSQL servers'
    /// certificates: required for TLS (`sslmode=require`), which is
    /// required for any server not on this host.
    pub ca_file: Option<PathBuf>,
    /// This appliance's name among the pair (default: the host name).
    pub node_name: Option<String>,
    /// Where clients and the other appliances reach this one
    /// (default: `https://<node_name>:<listen port>`).
    pub advertise_url: Option<String>,
    /// How long the active appliance's lease runs without renewal: a
    /// standby takes over at most this long after the active one died,
    /// hung or lost PostgreSQL, plus about two seconds.
    pub lease_seconds: u64,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: Secret(String::new()),
            ca_file: None,
            node_name: None,
            advertise_url: None,
            lease_seconds: 10,
        }
    }
}

impl PostgresConfig {
    /// This appliance's name among the pair.
    pub fn node_name(&self) -> String {
        self.node_name
            .clone()
            .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned())
    }

    /// Where the others reach this appliance.
    pub fn advertise_url(&self, listen: SocketAddr) -> String {
        self.advertise_url
            .clone()
            .unwrap_or_else(|| format!("https://{}:{}", self.node_name(), listen.port()))
    }

    /// Refuses what cannot work or is not safe: no URL, one that does not
    /// parse, a server elsewhere reached without TLS or without a CA to
    /// check it by, a lease too short to renew or too long to wait out.
    pub fn check(&self) -> Result<(), ConfigError> {
        let err = |key: &str, reason: String| Err(ConfigError::new(key, reason, ""));
        if self.url.expose().trim().is_empty() {
            return err(
                "store.postgres.url",
                "store.backend is postgres, so the PostgreSQL connection URL is required".into(),
            );
        }
        let parsed: tokio_postgres::Config = match self.url.expose().parse() {
            Ok(c) => c,
            Err(e) => {
                return err(
                    "store.postgres.url",
                    format!("not a PostgreSQL connection string or URL ({e})"),
                );
            }
        };
        let remote = parsed.get_hosts().iter().any(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => {
                !(name == "localhost"
                    || name
                        .trim_matches(['[', ']'])
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback()))
            }
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(_) => false,
        });
        if remote && parsed.get_ssl_mode() != tokio_postgres::config::SslMode::Require {
            return err(
                "store.postgres.url",
                "a server not on this host is reached with TLS only: add sslmode=require (and set store.postgres.ca_file)".into(),
            );
        }
        if parsed.get_ssl_mode() == tokio_postgres::config::SslMode::Require
            && self.ca_file.is_none()
        {
            return err(
                "store.postgres.ca_file",
                "sslmode=require checks the server's certificate against the site's CA: set the CA's PEM file".into(),
            );
        }
        if let Some(url) = &self.advertise_url
            && !url.starts_with("https://")
        {
            return err(
                "store.postgres.advertise_url",
                format!("{url} is not an https:// URL"),
            );
        }
        if self
            .node_name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty() || n.len() > 64)
        {
            return err(
                "store.postgres.node_name",
                "a node name is 1 to 64 characters".into(),
            );
        }
        if !(3..=120).contains(&self.lease_seconds) {
            return err(
                "store.postgres.lease_seconds",
                format!("{} is outside 3..=120", self.lease_seconds),
            );
        }
        Ok(())
    }
}

/// The outbox and its stream. Events are history: they are kept for the
/// longest history retention of any tenant (`[retention]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {}

/// Retention defaults (a PlatformAdmin may override them per tenant) and
/// the Purger that applies them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Days artifacts (prompts, responses, tool payloads, adapter state,
    /// outputs) are kept after their run ended.
    pub payload_days: u32,
    /// Days finished runs (with attempts, checkpoints, calls, decisions),
    /// ended leases, per-day minutes and events are kept.
    pub history_days: u32,
    /// Days audit records are kept (the whole site's trail: one chain).
    pub audit_days: u32,
    /// Seconds between Purger passes.
    pub purge_interval_seconds: u64,
    /// Records one purge transaction touches at most.
    pub purge_batch_records: u32,
    /// Milliseconds the Purger pauses between two batches, so writers
    /// always get the store between them.
    pub purge_pause_ms: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            payload_days: 30,
            history_days: 90,
            audit_days: 400,
            purge_interval_seconds: 300,
            purge_batch_records: 500,
            purge_pause_ms: 20,
        }
    }
}

impl RetentionConfig {
    /// The defaults as the domain reads them.
    pub fn defaults(&self) -> crate::domain::retention::Retention {
        crate::domain::retention::Retention {
            payload_days: self.payload_days,
            history_days: self.history_days,
        }
    }
}

/// How a background worker's failed pass is retried. The specification
/// names the kind per worker (none, fixed or exponential); these are the
/// delays.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    /// Seconds before the first retry (every retry, for a fixed policy).
    pub retry_delay_seconds: u64,
    /// The longest delay of an exponential policy, in seconds.
    pub retry_max_delay_seconds: u64,
    /// Retries in a row before a worker keeps its schedule again.
    pub retry_attempts: u32,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            retry_delay_seconds: 15,
            retry_max_delay_seconds: 900,
            retry_attempts: 8,
        }
    }
}

impl WorkersConfig {
    /// The settings the worker runner applies.
    pub fn retries(&self) -> crate::worker::RetrySettings {
        crate::worker::RetrySettings {
            delay: std::time::Duration::from_secs(self.retry_delay_seconds),
            max_delay: std::time::Duration::from_secs(self.retry_max_delay_seconds),
            attempts: self.retry_attempts,
        }
    }
}

/// Webhook deliveries: how often the outbox is read, how a failed delivery
/// is retried and how long deliveries are kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Seconds between passes of the WebhookDispatcher (it also runs as
    /// soon as an event is committed).
    pub poll_seconds: u64,
    /// Seconds before the first retry of a failed delivery; doubled at each
    /// failure.
    pub retry_first_seconds: u64,
    /// The longest delay between two tries, in seconds.
    pub retry_max_seconds: u64,
    /// Tries before a delivery is given up.
    pub max_tries: u32,
    /// Seconds one try may take (connect, send and answer).
    pub timeout_seconds: u64,
    /// Days a delivery (delivered or given up) is kept, with its tries.
    pub keep_days: u32,
    /// Endpoints a tenant may register.
    pub max_endpoints_per_tenant: u32,
    /// Tries under way at once, in all.
    pub senders: u32,
    /// Tries under way at once for one tenant: its share, whatever its
    /// endpoints do.
    pub senders_per_tenant: u32,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            poll_seconds: 5,
            retry_first_seconds: 30,
            retry_max_seconds: 3600,
            max_tries: 12,
            timeout_seconds: 5,
            keep_days: 7,
            max_endpoints_per_tenant: 100,
            senders: 32,
            senders_per_tenant: 4,
        }
    }
}

/// Telling people a decision waits for them (`[notify]`, reloadable).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// The console's address as people's browsers reach it, the base of
    /// every link sent (`https://host:port`); empty: `https://` + this
    /// host's name + the listener's port.
    pub console_url: String,
    /// Hours a link to a decision may be opened (1 to 720); never past the
    /// decision's own expiry.
    pub link_hours: u32,
    /// Mails sent about one decision, at most (1 to 1000): its assignees,
    /// else the people of its tenant who may decide, with a mail address.
    pub max_recipients: u32,
    /// Days a mail (sent or given up) is kept with its tries (1 to 3650).
    pub keep_days: u32,
    /// The site's mail relay; mail is sent only when `relay` is set.
    pub smtp: SmtpConfig,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            console_url: String::new(),
            link_hours: 72,
            max_recipients: 20,
            keep_days: 7,
            smtp: SmtpConfig::default(),
        }
    }
}

impl NotifyConfig {
    /// The base of every link: `console_url`, or this host's name with the
    /// listener's port (the generated certificate names the host).
    pub fn base_url(&self, listen: SocketAddr) -> String {
        if !self.console_url.is_empty() {
            return self.console_url.trim_end_matches('/').to_string();
        }
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        format!("https://{host}:{}", listen.port())
    }
}

/// `[notify.smtp]`: the site's SMTP relay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SmtpConfig {
    /// `host` or `host:port` of the relay (port 587 with `starttls`, 465
    /// with `tls`, 25 with `none`, when not given); empty: no mail.
    pub relay: String,
    /// How the connection is protected: `starttls` (the default), `tls`
    /// (TLS from the first byte), or `none`, allowed only for a relay on
    /// this host.
    pub security: SmtpSecurity,
    /// The sender, `agentbay@<host name>` when empty.
    pub from: String,
    /// A user name for the relay's AUTH, when it asks for one.
    pub username: String,
    /// Its password. Never logged.
    pub password: Option<Secret>,
    /// PEM file of the CA that signed the relay's certificate, beside the
    /// host's CA store.
    pub ca_file: Option<PathBuf>,
    /// Seconds one try may take (connect, greet, send; 1 to 300).
    pub timeout_seconds: u64,
    /// Tries of one mail before it is given up (1 to 100); a refusal the
    /// relay calls permanent (5xx) is not tried again.
    pub max_tries: u32,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        SmtpConfig {
            relay: String::new(),
            security: SmtpSecurity::Starttls,
            from: String::new(),
            username: String::new(),
            password: None,
            ca_file: None,
            timeout_seconds: 10,
            max_tries: 8,
        }
    }
}

/// How the connection to the relay is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// Plain connection upgraded with STARTTLS, which must succeed.
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
    /// No TLS: only for a relay on this host.
    None,
}

impl SmtpConfig {
    /// The relay's host and port, when mail is on.
    pub fn relay(&self) -> Option<(String, u16)> {
        let relay = self.relay.trim();
        if relay.is_empty() {
            return None;
        }
        let default_port = match self.security {
            SmtpSecurity::Starttls => 587,
            SmtpSecurity::Tls => 465,
            SmtpSecurity::None => 25,
        };
        let (host, port) = match relay.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') || h.starts_with('[') => {
                (h.trim_matches(['[', ']']), p.parse().ok()?)
            }
            _ => (relay, default_port),
        };
        Some((host.to_string(), port))
    }

    /// Checks the relay's address and the rule that mail leaves the host
    /// protected.
    fn check(&self) -> Result<(), ConfigError> {
        if self.relay.trim().is_empty() {
            return Ok(());
        }
        let Some((host, _)) = self.relay() else {
            return Err(ConfigError::new(
                "notify.smtp.relay",
                format!("{:?} is not host or host:port", self.relay),
                "",
            ));
        };
        let local = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if self.security == SmtpSecurity::None && !local {
            return Err(ConfigError::new(
                "notify.smtp.security",
                format!(
                    "\"none\" sends mail in the clear: it is allowed only for a relay on this host, and {host} is not; use starttls or tls (and notify.smtp.ca_file)"
                ),
                "",
            ));
        }
        if self.password.is_some() && self.username.is_empty() {
            return Err(ConfigError::new(
                "notify.smtp.username",
                "a password is set: name the user it belongs to",
                "",
            ));
        }
        if !self.from.is_empty() && self.from.parse::<lettre::Address>().is_err() {
            return Err(ConfigError::new(
                "notify.smtp.from",
                format!("{:?} is not a mail address", self.from),
                "",
            ));
        }
        Ok(())
    }
}

/// Scheduled backups (off unless `dir` is set).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackupConfig {
    /// Where backups are written; unset: no scheduled backups.
    pub dir: Option<PathBuf>,
    /// Minutes between backups (the recovery point objective).
    pub interval_minutes: u64,
    /// How many backups are kept; older ones are deleted.
    pub keep: u32,
}

impl Default for BackupConfig {
    fn default() -> Self {
        BackupConfig {
            dir: None,
            interval_minutes: 15,
            keep: 96,
        }
    }
}

/// Quota limits of an edition; an absent key is unlimited.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EditionLimits {
    /// Concurrent attempt and build leases.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent_runs: Option<u32>,
    /// Concurrent sandbox and browser-session leases.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent_sandboxes: Option<u32>,
    /// Largest CPU per lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_per_attempt: Option<f64>,
    /// Largest memory per lease, GB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_gb_per_attempt: Option<f64>,
    /// Lease minutes per UTC day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_minutes_per_day: Option<u32>,
    /// Model tokens (input and output) per UTC day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
}

/// The CPU and memory of one slot of a node profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeProfileConfig {
    /// CPUs per slot.
    pub cpu: f64,
    /// Memory per slot, GB.
    pub memory_gb: f64,
}

/// `RuntimeCloud:Capacity`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CapacityConfig {
    /// Lease time-to-live between heartbeats, in seconds (`LeaseTtlSeconds`).
    pub lease_ttl_seconds: u64,
    /// Quota defaults per edition (`EditionDefaults`).
    pub edition_defaults: std::collections::BTreeMap<String, EditionLimits>,
    /// Slot sizes pools can be built from.
    pub node_profiles: std::collections::BTreeMap<String, NodeProfileConfig>,
    /// How many times a waiting request may be passed over by later,
    /// smaller ones before the pool holds capacity back for it.
    pub max_pass_over: u32,
    /// Seconds between LeaseExpirer passes.
    pub expire_interval_seconds: u64,
    /// Seconds between Autoscaler passes.
    pub autoscale_interval_seconds: u64,
    /// Seconds between checks of the pools' counters against their leases.
    pub reconcile_interval_seconds: u64,
    /// Longest one AcquireLease call waits for a grant, in seconds.
    pub max_wait_seconds: u64,
    /// Create a shared agent pool and a shared sandbox pool on first start,
    /// sized from the host.
    pub default_pools: bool,
    /// Region of the default pools: this host's. Pools in it run here and
    /// count against the host; pools in other regions are remote.
    pub default_region: String,
    /// CPUs kept for the appliance itself: the host's pools promise the
    /// rest.
    pub reserve_cpu: f64,
    /// Memory kept for the appliance itself, GB.
    pub reserve_memory_gb: f64,
    /// How many times over the host's pools may promise its CPUs (less
    /// the reserve): an agent attempt mostly waits for its model server
    /// and tools. Memory is promised once.
    pub cpu_overcommit: f64,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        let edition = |runs, sandboxes, minutes| EditionLimits {
            concurrent_runs: Some(runs),
            concurrent_sandboxes: Some(sandboxes),
            execution_minutes_per_day: Some(minutes),
            ..EditionLimits::default()
        };
        let profile = |cpu, memory_gb| NodeProfileConfig { cpu, memory_gb };
        CapacityConfig {
            lease_ttl_seconds: 120,
            edition_defaults: [
                ("starter".to_string(), edition(5, 5, 600)),
                ("team".to_string(), edition(25, 25, 6000)),
                ("platform".to_string(), EditionLimits::default()),
            ]
            .into(),
            node_profiles: [
                ("small".to_string(), profile(2.0, 4.0)),
                ("medium".to_string(), profile(4.0, 8.0)),
                ("large".to_string(), profile(8.0, 16.0)),
            ]
            .into(),
            max_pass_over: 4,
            expire_interval_seconds: 60,
            autoscale_interval_seconds: 120,
            reconcile_interval_seconds: 300,
            max_wait_seconds: 60,
            default_pools: true,
            default_region: "local".into(),
            reserve_cpu: 0.5,
            reserve_memory_gb: 1.0,
            cpu_overcommit: 8.0,
        }
    }
}

/// A publisher key trusted to sign releases.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedKeyConfig {
    /// A name for people, e.g. "acme-ci".
    pub name: String,
    /// The raw Ed25519 public key in base64 (the `.pub` file of
    /// `agentbay release keygen`).
    pub public_key: String,
    /// Tenants it may sign for; any when absent or empty.
    #[serde(default)]
    pub tenants: Vec<String>,
}

/// Release bundles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReleasesConfig {
    /// Largest bundle accepted, decompressed, in bytes.
    pub max_bundle_bytes: u64,
    /// Largest file in a bundle, in bytes.
    pub max_file_bytes: u64,
    /// Most files in a bundle.
    pub max_files: usize,
    /// Trust this appliance's own demo publisher key (made at its first
    /// start in the data dir), for the `demo` tenant only.
    pub trust_demo_key: bool,
    /// Publisher keys trusted to sign releases.
    pub trusted_keys: Vec<TrustedKeyConfig>,
    /// Seconds between ReleaseCacheWarmer passes.
    pub warm_interval_seconds: u64,
}

impl Default for ReleasesConfig {
    fn default() -> Self {
        ReleasesConfig {
            max_bundle_bytes: 32 * 1024 * 1024,
            max_file_bytes: 8 * 1024 * 1024,
            max_files: 1000,
            trust_demo_key: true,
            trusted_keys: Vec::new(),
            warm_interval_seconds: 600,
        }
    }
}

/// Attempt execution: the specification's `Runtime:*` options and the
/// appliance's timers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Self-corrections per attempt unless the release says otherwise
    /// (`Runtime:Attempts:DefaultMaxCorrections`).
    pub default_max_corrections: u32,
    /// A checkpoint at least every this many calls
    /// (`Runtime:Attempts:CheckpointEveryCalls`).
    pub checkpoint_every_calls: u32,
    /// Deepest sub-agent delegation (`Runtime:Attempts:MaxSubAgentDepth`).
    pub max_sub_agent_depth: u32,
    /// Context budget unless the release says less
    /// (`Runtime:Context:MaxContextTokens`).
    pub max_context_tokens: u32,
    /// Minutes a decision may wait for a human
    /// (`Runtime:Decisions:InputTimeoutMinutes`).
    pub input_timeout_minutes: u64,
    /// Seconds between LeaseHeartbeat passes.
    pub heartbeat_seconds: u64,
    /// Seconds an adapter's attempt lease lasts without a heartbeat.
    pub attempt_lease_seconds: u64,
    /// Seconds a running attempt has to observe an interrupt before the
    /// appliance settles it.
    pub interrupt_grace_seconds: u64,
    /// Seconds an attempt may wait for a human decision (or stay Paused)
    /// before it gives its capacity lease back; it asks again once it can
    /// go on. 0: at once.
    pub return_capacity_after_seconds: u64,
    /// Seconds between OrphanedAttemptReconciler passes.
    pub reconcile_interval_seconds: u64,
    /// Days superseded checkpoints of ended attempts are kept.
    pub checkpoint_retention_days: u32,
    /// When the CheckpointCompactor runs: a five-field cron expression in
    /// the site's local time (the specification's `0 3 * * *`).
    pub compact_schedule: crate::worker::Cron,
    /// Longest one ClaimAttempt or Await call waits, in seconds.
    pub max_wait_seconds: u64,
    /// API keys of site model servers, by the name a release's model
    /// profile refers to (`apiKeyRef`). Never logged.
    pub model_api_keys: std::collections::BTreeMap<String, Secret>,
    /// Longest a model server's streamed answer may go without sending a
    /// byte before the call is given up on, seconds (the profile's
    /// `timeoutSeconds` bounds the whole call).
    pub model_stream_idle_seconds: u64,
    /// How long an attempt waits for a site model server that is down
    /// (every server of its profile refuses or does not answer) before it
    /// fails `model-unavailable`, minutes.
    pub model_outage_max_minutes: u64,
    /// How tool processes are bound: `auto` (a cgroup where the host has
    /// one, else what `when_unconfinable` says), `cgroup` (refuse tools
    /// where there is none) or `rlimit` (resource limits and a process
    /// group only).
    pub confinement: Confinement,
    /// Where a tool cannot be confined as its lease says (no cgroup, no
    /// network namespace, no Landlock): `rlimit` runs it with the weaker
    /// mechanism and says so on the call, `refuse` fails the call.
    pub when_unconfinable: WhenUnconfinable,
    /// What an attempt does when its project's or tenant's `tokensPerDay`
    /// refuses a model call: `wait` pauses it until the next UTC day (or
    /// until the quota is raised; it gives its compute back meanwhile),
    /// `fail` fails it (budget) naming the quota.
    pub when_tokens_run_out: WhenTokensRunOut,
    /// Processes and threads one tool process tree may have.
    pub tool_pids_max: u32,
    /// MiB an attempt's working directory may hold (a tmpfs, where the
    /// appliance runs as root).
    pub tool_workdir_mb: u64,
    /// The account tool processes run as where the appliance runs as root
    /// and `tool_uid_range` is not set (so that a tool can read neither
    /// the appliance's memory nor its files); empty runs them as root, the
    /// appliance's own uid. An unprivileged appliance's tools run as a uid
    /// of its account's subordinate range (`/etc/subuid`), one per attempt.
    pub tool_user: String,
    /// Where the appliance runs as root: uids (and gids of the same
    /// numbers) tools run as, one of its own per attempt while it runs
    /// (`"FIRST-LAST"`, none of them an account's). Unset: `tool_user`.
    pub tool_uid_range: Option<UidRange>,
    /// Seconds a tool call may take unless its release says otherwise;
    /// then its process tree is killed and the call settles by its class.
    pub tool_timeout_seconds: u64,
    /// Directories whose contents a release may ask its tools to read
    /// (its tools' `readPaths`); nothing at, above or below a protected
    /// path (the data dir, the configuration, TLS, backups) is ever
    /// granted, whatever this says.
    pub tool_read_allow: Vec<PathBuf>,
    /// Network targets every tenant's releases may name: exact
    /// `host:port` entries, or URL prefixes (`https://host/path/`). Site
    /// endpoints, `mcp-http` servers and model endpoints that a release
    /// names must match; loopback, link-local and the appliance's own
    /// listeners only by an exact `host:port` entry. The site's own model
    /// profiles are not bound by it.
    pub network_allow: Vec<crate::domain::reach::Allowed>,
    /// More targets, for one tenant's releases each.
    pub network_allow_by_tenant:
        std::collections::BTreeMap<String, Vec<crate::domain::reach::Allowed>>,
}

impl RuntimeConfig {
    /// The allowlist that applies to `tenant`'s releases.
    pub fn network_allow_for(&self, tenant: &str) -> Vec<crate::domain::reach::Allowed> {
        let mut out = self.network_allow.clone();
        out.extend(
            self.network_allow_by_tenant
                .get(tenant)
                .into_iter()
                .flatten()
                .cloned(),
        );
        out
    }
}

/// A range of uids (`runtime.tool_uid_range`): `"FIRST-LAST"`, inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UidRange {
    /// Its first uid.
    pub first: u32,
    /// How many uids it holds.
    pub count: u32,
}

impl TryFrom<String> for UidRange {
    type Error = String;
    fn try_from(s: String) -> Result<UidRange, String> {
        let (a, b) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?} is not FIRST-LAST (such as 200000-265535)"))?;
        let first: u32 = a
            .trim()
            .parse()
            .map_err(|_| format!("{a:?} is not a uid"))?;
        let last: u32 = b
            .trim()
            .parse()
            .map_err(|_| format!("{b:?} is not a uid"))?;
        if first < 1000 || last < first || last == u32::MAX {
            return Err(format!(
                "{s:?} must be FIRST-LAST with 1000 <= FIRST <= LAST < 4294967295 (no system account's uid)"
            ));
        }
        Ok(UidRange {
            first,
            count: last - first + 1,
        })
    }
}

impl From<UidRange> for String {
    fn from(r: UidRange) -> String {
        r.to_string()
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.first + (self.count - 1))
    }
}

/// How tool processes are bound (`runtime.confinement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Confinement {
    /// A cgroup where the host has one.
    #[default]
    Auto,
    /// A cgroup, or the tool is refused.
    Cgroup,
    /// Resource limits and a process group only.
    Rlimit,
}

/// What happens where a tool cannot be confined as its lease says
/// (`runtime.when_unconfinable`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenUnconfinable {
    /// Run it with what the host has, and say so on the call.
    #[default]
    Rlimit,
    /// Fail the call, naming what the host lacks.
    Refuse,
}

/// What an attempt does when `tokensPerDay` refuses its model call
/// (`runtime.when_tokens_run_out`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenTokensRunOut {
    /// Pause until the UTC day turns or the quota allows calls again.
    #[default]
    Wait,
    /// Fail the attempt (budget), naming the quota.
    Fail,
}

/// A secret value from the configuration: it never shows in a log or in
/// `Debug` output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            default_max_corrections: 2,
            checkpoint_every_calls: 1,
            max_sub_agent_depth: 2,
            max_context_tokens: 32_000,
            input_timeout_minutes: 1440,
            heartbeat_seconds: 15,
            attempt_lease_seconds: 60,
            interrupt_grace_seconds: 60,
            return_capacity_after_seconds: 60,
            reconcile_interval_seconds: 120,
            checkpoint_retention_days: 7,
            compact_schedule: crate::worker::Cron::parse("0 3 * * *")
                .expect("the default schedule parses"),
            max_wait_seconds: 60,
            model_api_keys: std::collections::BTreeMap::new(),
            model_stream_idle_seconds: 30,
            model_outage_max_minutes: 30,
            confinement: Confinement::Auto,
            when_unconfinable: WhenUnconfinable::Rlimit,
            when_tokens_run_out: WhenTokensRunOut::Wait,
            tool_pids_max: 256,
            tool_workdir_mb: 1024,
            tool_user: "nobody".to_string(),
            tool_uid_range: None,
            tool_timeout_seconds: 300,
            tool_read_allow: Vec::new(),
            network_allow: Vec::new(),
            network_allow_by_tenant: std::collections::BTreeMap::new(),
        }
    }
}

/// What the site lets a release reach, as it stands now: the protected
/// paths and the appliance's listeners, fixed at start, and the live
/// `runtime.*` lists (`tool_read_allow`, `network_allow`,
/// `network_allow_by_tenant`). Verification at import and every call at
/// run time ask it, so a reload applies to both.
#[derive(Clone)]
pub struct SiteRules {
    protected: Arc<Vec<PathBuf>>,
    own: Arc<Vec<SocketAddr>>,
    runtime: Live<RuntimeConfig>,
}

impl SiteRules {
    /// The rules of `config`, with its live runtime keys, for an
    /// appliance listening on `own` (the address it bound, which differs
    /// from `listen` when that names port 0).
    pub fn new(config: &Config, runtime: Live<RuntimeConfig>, own: SocketAddr) -> SiteRules {
        SiteRules {
            protected: Arc::new(config.protected_paths()),
            own: Arc::new(vec![own]),
            runtime,
        }
    }

    /// The paths no tool may be granted (nor above or below them).
    pub fn protected(&self) -> &[PathBuf] {
        &self.protected
    }

    /// The rules for `tenant`'s releases now.
    pub fn reach(&self, tenant: &str) -> crate::domain::reach::SiteReach {
        let runtime = self.runtime.get();
        crate::domain::reach::SiteReach {
            protected: self.protected.to_vec(),
            read_allow: runtime.tool_read_allow.clone(),
            allow: runtime.network_allow_for(tenant),
            own: self.own.to_vec(),
        }
    }
}

/// A configuration that cannot be used, with the key and the reason.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("configuration key `{key}`{origin}: {reason}")]
pub struct ConfigError {
    /// Dotted key path, e.g. `tls.cert`.
    pub key: String,
    /// Why it was refused.
    pub reason: String,
    /// Where the value came from, e.g. ` (from AGENTBAY_LISTEN)`.
    pub origin: String,
}

impl ConfigError {
    /// An error of `key` (from `origin`, e.g. " (in FILE)").
    pub fn new(
        key: impl Into<String>,
        reason: impl Into<String>,
        origin: impl Into<String>,
    ) -> Self {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
            origin: origin.into(),
        }
    }
}

/// Values given on the command line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CliOverrides {
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--listen`.
    pub listen: Option<SocketAddr>,
}

/// The environment variable that overrides a dotted key.
pub fn env_name(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.replace('.', "__").to_uppercase())
}

impl Config {
    /// What no tool process may read: the data dir (the store, the
    /// generated keys), the configuration file, the TLS files, the
    /// backups and the log.
    pub fn protected_paths(&self) -> Vec<PathBuf> {
        let abs = |p: &PathBuf| {
            let p = if p.is_absolute() {
                p.clone()
            } else {
                std::env::current_dir().unwrap_or_default().join(p)
            };
            std::fs::canonicalize(&p).unwrap_or(p)
        };
        // The data dir holds the store, the artifacts, the generated keys,
        // the run files and the work root.
        let mut out = vec![abs(&self.data_dir)];
        if let Some(file) = &self.source.file {
            let file = abs(file);
            // The configuration's directory holds what it names (keys,
            // password files) as often as not.
            out.extend(file.parent().map(Path::to_path_buf));
            out.push(file);
        }
        out.extend(self.tls.cert.iter().chain(self.tls.key.iter()).map(abs));
        out.extend(self.backup.dir.iter().map(abs));
        out.extend(self.log.dir.iter().map(abs));
        out.sort();
        out.dedup();
        out
    }

    /// Where the store is backed up before another agentbay version's
    /// store is first opened: `backup.dir`, or without one the data
    /// directory's `backups`.
    pub fn upgrade_backup_dir(&self) -> PathBuf {
        self.backup
            .dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("backups"))
    }
}

impl Config {
    /// Loads the configuration from an optional file, the given environment
    /// variables and the command line, then validates it.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        cli: &CliOverrides,
    ) -> Result<Config, ConfigError> {
        let (mut table, file_origin) = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::new(
                        "--config",
                        format!("cannot read {}: {e}", path.display()),
                        "",
                    )
                })?;
                let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
                    ConfigError::new(
                        error_key(&e).unwrap_or_else(|| "(file)".into()),
                        e.message().to_string(),
                        format!(" (in {})", path.display()),
                    )
                })?;
                (table, format!(" (in {})", path.display()))
            }
            None => (toml::Table::new(), String::new()),
        };
        let defaults = toml::Table::try_from(Config::default()).expect("defaults serialise");
        let mut env_keys: Vec<(String, String)> = Vec::new();
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) && !RESERVED_ENV.contains(&k.as_str()))
            .collect();
        env.sort();
        for (name, value) in env {
            let key = name[ENV_PREFIX.len()..].to_lowercase().replace("__", ".");
            let origin = format!(" (from {name})");
            let converted = convert_env(&defaults, &key, &value)
                .map_err(|reason| ConfigError::new(&key, reason, &origin))?;
            set_path(&mut table, &key, converted)
                .map_err(|reason| ConfigError::new(&key, reason, &origin))?;
            env_keys.push((key, name));
        }
        // Maps merge key by key onto the defaults (an edition or node profile
        // given in the file adds to or overrides the built-in ones); every
        // other value replaces its default.
        let mut merged = defaults.clone();
        merge_tables(&mut merged, table);
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(merged))
            .map_err(|e| {
                let key = e.path().to_string();
                let origin = env_keys
                    .iter()
                    .find(|(k, _)| *k == key || key.starts_with(&format!("{k}.")))
                    .map(|(_, name)| format!(" (from {name})"))
                    .unwrap_or_else(|| file_origin.clone());
                let reason = e.into_inner().to_string();
                // serde names an unknown field in the message; point at it.
                let key = match unknown_field(&reason) {
                    Some(field) if key == "." => field,
                    Some(field) if !key.ends_with(&field) => format!("{key}.{field}"),
                    _ => key,
                };
                let reason = match MOVED.iter().find(|(old, _)| *old == key) {
                    Some((_, new)) => format!("{reason}; this key moved to {new}"),
                    None => reason,
                };
                ConfigError::new(key, reason, origin)
            })?;
        if let Some(dir) = &cli.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(listen) = cli.listen {
            config.listen = listen;
        }
        config.validate()?;
        config.source = ConfigSource {
            file: file.map(Path::to_path_buf),
            cli: cli.clone(),
        };
        Ok(config)
    }

    /// Checks ranges and combinations that types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(p) = self
            .runtime
            .tool_read_allow
            .iter()
            .find(|p| !p.is_absolute())
        {
            return Err(ConfigError::new(
                "runtime.tool_read_allow",
                format!("{} is not an absolute path", p.display()),
                "",
            ));
        }
        let range = |key: &str, value: u64, min: u64, max: u64| {
            if value < min || value > max {
                Err(ConfigError::new(
                    key,
                    format!("{value} is outside {min}..={max}"),
                    "",
                ))
            } else {
                Ok(())
            }
        };
        range(
            "auth.token_ttl_seconds",
            self.auth.token_ttl_seconds,
            60,
            86_400,
        )?;
        range(
            "auth.session_idle_minutes",
            self.auth.session_idle_minutes,
            5,
            1440,
        )?;
        range(
            "auth.session_max_hours",
            self.auth.session_max_hours,
            1,
            168,
        )?;
        range("auth.hash_memory_mb", self.auth.hash_memory_mb, 16, 4096)?;
        range(
            "auth.failures_per_name_and_source",
            self.auth.failures_per_name_and_source,
            1,
            1000,
        )?;
        range(
            "auth.failures_per_source",
            self.auth.failures_per_source,
            1,
            100_000,
        )?;
        range(
            "auth.failures_per_name",
            self.auth.failures_per_name,
            1,
            100_000,
        )?;
        range(
            "http.max_body_bytes",
            self.http.max_body_bytes as u64,
            1024,
            256 * 1024 * 1024,
        )?;
        range("http.drain_seconds", self.http.drain_seconds, 0, 600)?;
        range(
            "http.max_connections",
            self.http.max_connections as u64,
            8,
            1_000_000,
        )?;
        range(
            "http.max_connections_per_address",
            self.http.max_connections_per_address as u64,
            1,
            1_000_000,
        )?;
        range(
            "http.header_read_timeout_seconds",
            self.http.header_read_timeout_seconds,
            1,
            300,
        )?;
        range(
            "http.idle_timeout_seconds",
            self.http.idle_timeout_seconds,
            1,
            3600,
        )?;
        range(
            "http.body_read_timeout_seconds",
            self.http.body_read_timeout_seconds,
            1,
            3600,
        )?;
        range(
            "http.http2_keepalive_interval_seconds",
            self.http.http2_keepalive_interval_seconds,
            1,
            3600,
        )?;
        range(
            "http.http2_keepalive_timeout_seconds",
            self.http.http2_keepalive_timeout_seconds,
            1,
            300,
        )?;
        range("store.cache_mb", self.store.cache_mb, 8, 1024 * 1024)?;
        if self.store.backend == StoreBackend::Postgres {
            self.store.postgres.check()?;
        }
        range(
            "store.snapshot_every_mb",
            self.store.snapshot_every_mb,
            0,
            1024 * 1024,
        )?;
        let r = &self.retention;
        range("retention.payload_days", r.payload_days.into(), 1, 36_500)?;
        range("retention.history_days", r.history_days.into(), 1, 36_500)?;
        range("retention.audit_days", r.audit_days.into(), 1, 36_500)?;
        if r.payload_days > r.history_days {
            return Err(ConfigError::new(
                "retention.payload_days",
                format!(
                    "{} days is longer than retention.history_days ({}): content cannot outlive the records that refer to it",
                    r.payload_days, r.history_days
                ),
                "",
            ));
        }
        range(
            "retention.purge_interval_seconds",
            r.purge_interval_seconds,
            1,
            86_400,
        )?;
        range(
            "retention.purge_batch_records",
            r.purge_batch_records.into(),
            10,
            100_000,
        )?;
        range("retention.purge_pause_ms", r.purge_pause_ms, 0, 60_000)?;
        range(
            "backup.interval_minutes",
            self.backup.interval_minutes,
            1,
            10_080,
        )?;
        range("backup.keep", self.backup.keep.into(), 1, 100_000)?;
        range("log.keep_files", self.log.keep_files.into(), 1, 3650)?;
        if self.demo.enabled && !self.releases.trust_demo_key {
            return Err(ConfigError::new(
                "demo.enabled",
                "the demo's releases are signed with this appliance's own demo key, which releases.trust_demo_key = false does not trust: set releases.trust_demo_key = true as well, or demo.enabled = false",
                "",
            ));
        }
        let w = &self.workers;
        range(
            "workers.retry_delay_seconds",
            w.retry_delay_seconds,
            1,
            86_400,
        )?;
        range(
            "workers.retry_max_delay_seconds",
            w.retry_max_delay_seconds,
            w.retry_delay_seconds,
            86_400,
        )?;
        range("workers.retry_attempts", w.retry_attempts.into(), 0, 1000)?;
        let n = &self.notify;
        range("notify.link_hours", n.link_hours.into(), 1, 720)?;
        range("notify.max_recipients", n.max_recipients.into(), 1, 1000)?;
        range("notify.keep_days", n.keep_days.into(), 1, 3650)?;
        range(
            "notify.smtp.timeout_seconds",
            n.smtp.timeout_seconds,
            1,
            300,
        )?;
        range("notify.smtp.max_tries", n.smtp.max_tries.into(), 1, 100)?;
        if !n.console_url.is_empty() {
            let bad = |why: &str| {
                Err(ConfigError::new(
                    "notify.console_url",
                    format!("{:?} {why}", n.console_url),
                    "",
                ))
            };
            match url::Url::parse(&n.console_url) {
                Ok(u) if u.scheme() == "https" && u.host().is_some() => {}
                Ok(_) => return bad("is not an https:// address"),
                Err(e) => return bad(&format!("is not an address: {e}")),
            }
        }
        n.smtp.check()?;
        let h = &self.webhooks;
        range("webhooks.poll_seconds", h.poll_seconds, 1, 3600)?;
        range(
            "webhooks.retry_first_seconds",
            h.retry_first_seconds,
            1,
            86_400,
        )?;
        range(
            "webhooks.retry_max_seconds",
            h.retry_max_seconds,
            h.retry_first_seconds,
            604_800,
        )?;
        range("webhooks.max_tries", h.max_tries.into(), 1, 100)?;
        range("webhooks.timeout_seconds", h.timeout_seconds, 1, 300)?;
        range("webhooks.keep_days", h.keep_days.into(), 1, 3650)?;
        range(
            "webhooks.max_endpoints_per_tenant",
            h.max_endpoints_per_tenant.into(),
            1,
            10_000,
        )?;
        range("webhooks.senders", h.senders.into(), 1, 1024)?;
        range(
            "webhooks.senders_per_tenant",
            h.senders_per_tenant.into(),
            1,
            h.senders.into(),
        )?;
        match (&self.tls.cert, &self.tls.key) {
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "tls.key",
                    "tls.cert is set but tls.key is not",
                    "",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "tls.cert",
                    "tls.key is set but tls.cert is not",
                    "",
                ));
            }
            _ => {}
        }
        let endpoint = self.telemetry.otlp_endpoint.trim();
        if !endpoint.is_empty() {
            match reqwest::Url::parse(endpoint) {
                Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
                _ => {
                    return Err(ConfigError::new(
                        "telemetry.otlp_endpoint",
                        format!(
                            "{endpoint:?} is not an http(s) URL of a collector (e.g. \"http://collector.site:4318\")"
                        ),
                        "",
                    ));
                }
            }
        }
        range(
            "telemetry.otlp_queue_spans",
            self.telemetry.otlp_queue_spans.into(),
            64,
            1_000_000,
        )?;
        range(
            "telemetry.otlp_timeout_seconds",
            self.telemetry.otlp_timeout_seconds,
            1,
            300,
        )?;
        // Every directive names its level: a bare word that is not one
        // (`loud`) would read as a target to trace, and silence the rest.
        const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
        let leveled = self.log.level.split(',').all(|d| {
            let level = d.rsplit('=').next().unwrap_or_default().trim();
            LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level))
        });
        if !leveled || tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(ConfigError::new(
                "log.level",
                format!(
                    "{:?} is not a log filter: each of its comma-separated parts is a level (trace, debug, info, warn, error, off) or target=level (try \"info\" or \"agentbay=debug,info\")",
                    self.log.level
                ),
                "",
            ));
        }
        let c = &self.capacity;
        range("capacity.lease_ttl_seconds", c.lease_ttl_seconds, 5, 86_400)?;
        range("capacity.max_pass_over", c.max_pass_over.into(), 1, 1000)?;
        range(
            "capacity.expire_interval_seconds",
            c.expire_interval_seconds,
            1,
            3600,
        )?;
        range(
            "capacity.autoscale_interval_seconds",
            c.autoscale_interval_seconds,
            1,
            3600,
        )?;
        range(
            "capacity.reconcile_interval_seconds",
            c.reconcile_interval_seconds,
            1,
            86_400,
        )?;
        range("capacity.max_wait_seconds", c.max_wait_seconds, 0, 300)?;
        for (key, v, most) in [
            ("capacity.reserve_cpu", c.reserve_cpu, 1024.0),
            ("capacity.reserve_memory_gb", c.reserve_memory_gb, 65_536.0),
            ("capacity.cpu_overcommit", c.cpu_overcommit, 64.0),
        ] {
            let least = if key == "capacity.cpu_overcommit" {
                1.0
            } else {
                0.0
            };
            if !(least..=most).contains(&v) {
                return Err(ConfigError::new(
                    key,
                    format!("{v} is outside {least}..={most}"),
                    "",
                ));
            }
        }
        if !c.edition_defaults.contains_key("platform") {
            return Err(ConfigError::new(
                "capacity.edition_defaults",
                "must define the platform edition (the platform tenant uses it)",
                "",
            ));
        }
        for (name, limits) in &c.edition_defaults {
            crate::domain::TenantId::parse(name).map_err(|e| {
                ConfigError::new(format!("capacity.edition_defaults.{name}"), e.reason, "")
            })?;
            for (key, v) in [
                ("cpu_per_attempt", limits.cpu_per_attempt),
                ("memory_gb_per_attempt", limits.memory_gb_per_attempt),
            ] {
                if let Some(v) = v {
                    crate::domain::amount::Amount::parse(key, v).map_err(|e| {
                        ConfigError::new(
                            format!("capacity.edition_defaults.{name}.{key}"),
                            e.reason,
                            "",
                        )
                    })?;
                }
            }
        }
        if c.node_profiles.is_empty() {
            return Err(ConfigError::new(
                "capacity.node_profiles",
                "at least one node profile is needed",
                "",
            ));
        }
        for (name, p) in &c.node_profiles {
            for (key, v) in [("cpu", p.cpu), ("memory_gb", p.memory_gb)] {
                let ok = crate::domain::amount::Amount::parse(key, v)
                    .is_ok_and(|a| a > crate::domain::amount::Amount::ZERO);
                if !ok {
                    return Err(ConfigError::new(
                        format!("capacity.node_profiles.{name}.{key}"),
                        format!("{v} is not a positive amount"),
                        "",
                    ));
                }
            }
        }
        let r = &self.releases;
        range(
            "releases.max_bundle_bytes",
            r.max_bundle_bytes,
            1024,
            1024 * 1024 * 1024,
        )?;
        range(
            "releases.max_file_bytes",
            r.max_file_bytes,
            1024,
            r.max_bundle_bytes,
        )?;
        range("releases.max_files", r.max_files as u64, 4, 100_000)?;
        range(
            "releases.warm_interval_seconds",
            r.warm_interval_seconds,
            1,
            86_400,
        )?;
        for (i, k) in r.trusted_keys.iter().enumerate() {
            crate::releases::signing::TrustedKey::new(&k.name, &k.public_key, Vec::new()).map_err(
                |e| ConfigError::new(format!("releases.trusted_keys[{i}].public_key"), e.0, ""),
            )?;
            for t in &k.tenants {
                crate::domain::TenantId::parse(t).map_err(|e| {
                    ConfigError::new(format!("releases.trusted_keys[{i}].tenants"), e.reason, "")
                })?;
            }
        }
        let rt = &self.runtime;
        range(
            "runtime.default_max_corrections",
            rt.default_max_corrections.into(),
            0,
            20,
        )?;
        range(
            "runtime.checkpoint_every_calls",
            rt.checkpoint_every_calls.into(),
            1,
            1000,
        )?;
        range(
            "runtime.max_sub_agent_depth",
            rt.max_sub_agent_depth.into(),
            0,
            10,
        )?;
        range(
            "runtime.max_context_tokens",
            rt.max_context_tokens.into(),
            256,
            10_000_000,
        )?;
        range(
            "runtime.input_timeout_minutes",
            rt.input_timeout_minutes,
            1,
            525_600,
        )?;
        range("runtime.heartbeat_seconds", rt.heartbeat_seconds, 1, 3600)?;
        range(
            "runtime.attempt_lease_seconds",
            rt.attempt_lease_seconds,
            rt.heartbeat_seconds * 2,
            86_400,
        )?;
        range(
            "runtime.interrupt_grace_seconds",
            rt.interrupt_grace_seconds,
            1,
            86_400,
        )?;
        range(
            "runtime.return_capacity_after_seconds",
            rt.return_capacity_after_seconds,
            0,
            604_800,
        )?;
        range(
            "runtime.reconcile_interval_seconds",
            rt.reconcile_interval_seconds,
            1,
            86_400,
        )?;
        range(
            "runtime.checkpoint_retention_days",
            rt.checkpoint_retention_days.into(),
            0,
            3650,
        )?;
        range("runtime.max_wait_seconds", rt.max_wait_seconds, 0, 300)?;
        range(
            "runtime.model_outage_max_minutes",
            rt.model_outage_max_minutes,
            1,
            10_080,
        )?;
        range(
            "runtime.model_stream_idle_seconds",
            rt.model_stream_idle_seconds,
            1,
            3600,
        )?;
        crate::domain::tenant::check_region("capacity.default_region", &c.default_region)
            .map_err(|e| ConfigError::new("capacity.default_region", e.reason, ""))?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::new("data_dir", "must not be empty", ""));
        }
        Ok(())
    }
}

fn merge_tables(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_tables(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn error_key(e: &toml::de::Error) -> Option<String> {
    e.span().map(|s| format!("(at byte {})", s.start))
}

fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest[..rest.find('`')?].to_string())
}

/// Converts an environment value to the type the default has at `key`.
fn convert_env(defaults: &toml::Table, key: &str, value: &str) -> Result<toml::Value, String> {
    let mut parts = key.split('.').peekable();
    let mut table = defaults;
    let mut known_section = true;
    while let Some(part) = parts.next() {
        let last = parts.peek().is_none();
        match table.get(part) {
            Some(toml::Value::Table(t)) if !last => table = t,
            Some(toml::Value::Table(_)) => return Err("is a section; set its keys instead".into()),
            Some(existing) if last => {
                return match existing {
                    toml::Value::String(_) => Ok(toml::Value::String(value.into())),
                    toml::Value::Integer(_) => value
                        .trim()
                        .parse::<i64>()
                        .map(toml::Value::Integer)
                        .map_err(|_| format!("{value:?} is not a whole number")),
                    toml::Value::Float(_) => value
                        .trim()
                        .parse::<f64>()
                        .map(toml::Value::Float)
                        .map_err(|_| format!("{value:?} is not a number")),
                    toml::Value::Boolean(_) => match value.trim() {
                        "true" | "1" => Ok(toml::Value::Boolean(true)),
                        "false" | "0" => Ok(toml::Value::Boolean(false)),
                        other => Err(format!("{other:?} is not true or false")),
                    },
                    toml::Value::Array(_) => Ok(toml::Value::Array(
                        value
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(|s| toml::Value::String(s.into()))
                            .collect(),
                    )),
                    other => Err(format!(
                        "cannot be set from the environment ({})",
                        other.type_str()
                    )),
                };
            }
            Some(_) => return Err("is not a section".into()),
            None => {
                known_section = last;
                break;
            }
        }
    }
    if known_section {
        // An optional key without a default (a path, an edition limit): the
        // most specific type the text has; the whole configuration's
        // deserialisation then checks it.
        let v = value.trim();
        Ok(if let Ok(i) = v.parse::<i64>() {
            toml::Value::Integer(i)
        } else if let Ok(f) = v.parse::<f64>() {
            toml::Value::Float(f)
        } else if let Ok(b) = v.parse::<bool>() {
            toml::Value::Boolean(b)
        } else {
            toml::Value::String(value.into())
        })
    } else {
        Err("is not a configuration key".into())
    }
}

fn set_path(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().expect("split yields one part");
    let mut current = table;
    for part in parts {
        let entry = current
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| format!("{part} is not a section"))?;
    }
    current.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn zero_config_runs_on_the_defaults() {
        let config = Config::load(None, env(&[]), &CliOverrides::default()).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.listen.to_string(), "127.0.0.1:8443");
        assert_eq!(config.data_dir, PathBuf::from("./agentbay-data"));
    }

    #[test]
    fn file_then_env_then_cli() {
        let file = write(
            "listen = \"127.0.0.1:9000\"\ndata_dir = \"/from/file\"\n[auth]\ntoken_ttl_seconds = 300\n",
        );
        let config = Config::load(
            Some(file.path()),
            env(&[
                ("AGENTBAY_LISTEN", "127.0.0.1:9100"),
                ("AGENTBAY_AUTH__TOKEN_TTL_SECONDS", "600"),
            ]),
            &CliOverrides::default(),
        )
        .unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:9100");
        assert_eq!(config.data_dir, PathBuf::from("/from/file"));
        assert_eq!(config.auth.token_ttl_seconds, 600);

        let cli = CliOverrides {
            listen: Some("127.0.0.1:9200".parse().unwrap()),
            data_dir: Some("/from/cli".into()),
        };
        let config = Config::load(
            Some(file.path()),
            env(&[("AGENTBAY_LISTEN", "127.0.0.1:9100")]),
            &cli,
        )
        .unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:9200");
        assert_eq!(config.data_dir, PathBuf::from("/from/cli"));
    }

    #[test]
    fn unknown_keys_are_named() {
        let file = write("listen = \"127.0.0.1:9000\"\n[auth]\ntoken_ttl = 5\n");
        let err = Config::load(Some(file.path()), env(&[]), &CliOverrides::default()).unwrap_err();
        assert_eq!(err.key, "auth.token_ttl");
        assert!(err.to_string().contains("unknown field"), "{err}");

        let file = write("lisen = \"127.0.0.1:9000\"\n");
        let err = Config::load(Some(file.path()), env(&[]), &CliOverrides::default()).unwrap_err();
        assert_eq!(err.key, "lisen");

        let err = Config::load(
            None,
            env(&[("AGENTBAY_LISTN", "x")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert_eq!(err.key, "listn");
        assert!(err.to_string().contains("AGENTBAY_LISTN"), "{err}");
    }

    #[test]
    fn bad_values_are_named_with_their_origin() {
        let err = Config::load(
            None,
            env(&[("AGENTBAY_LISTEN", "not-an-address")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert_eq!(err.key, "listen");
        assert!(err.to_string().contains("AGENTBAY_LISTEN"), "{err}");

        let err = Config::load(
            None,
            env(&[("AGENTBAY_AUTH__TOKEN_TTL_SECONDS", "soon")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert_eq!(err.key, "auth.token_ttl_seconds");
        assert!(err.reason.contains("whole number"), "{err}");

        let err = Config::load(
            None,
            env(&[("AGENTBAY_AUTH__TOKEN_TTL_SECONDS", "5")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert_eq!(err.key, "auth.token_ttl_seconds");
        assert!(err.reason.contains("60..=86400"), "{err}");

        let file = write("[log]\nformat = \"xml\"\n");
        let err = Config::load(Some(file.path()), env(&[]), &CliOverrides::default()).unwrap_err();
        assert_eq!(err.key, "log.format");

        let file = write("[tls]\ncert = \"/etc/cert.pem\"\n");
        let err = Config::load(Some(file.path()), env(&[]), &CliOverrides::default()).unwrap_err();
        assert_eq!(err.key, "tls.key");
    }

    #[test]
    fn mail_leaves_the_host_protected_and_its_settings_are_named() {
        let load = |text: &str| {
            let file = write(text);
            Config::load(Some(file.path()), env(&[]), &CliOverrides::default())
        };
        // Off by default; a local relay may go without TLS.
        assert_eq!(load("").unwrap().notify.smtp.relay(), None);
        let local =
            load("[notify.smtp]\nrelay = \"127.0.0.1:2525\"\nsecurity = \"none\"\n").unwrap();
        assert_eq!(local.notify.smtp.relay(), Some(("127.0.0.1".into(), 2525)));
        let starttls = load("[notify.smtp]\nrelay = \"mail.example\"\n").unwrap();
        assert_eq!(
            starttls.notify.smtp.relay(),
            Some(("mail.example".into(), 587))
        );
        let cases = [
            (
                "[notify.smtp]\nrelay = \"mail.example:25\"\nsecurity = \"none\"\n",
                "notify.smtp.security",
                "in the clear",
            ),
            (
                "[notify.smtp]\nrelay = \"mail.example\"\npassword = \"pw\"\n",
                "notify.smtp.username",
                "name the user",
            ),
            (
                "[notify.smtp]\nrelay = \"mail.example\"\nfrom = \"not an address\"\n",
                "notify.smtp.from",
                "not a mail address",
            ),
            (
                "[notify.smtp]\nrelay = \"mail.example:port\"\n",
                "notify.smtp.relay",
                "host:port",
            ),
            (
                "[notify]\nconsole_url = \"http://bay.example\"\n",
                "notify.console_url",
                "https://",
            ),
            ("[notify]\nlink_hours = 0\n", "notify.link_hours", "1..=720"),
        ];
        for (text, key, why) in cases {
            let err = load(text).unwrap_err();
            assert_eq!(err.key, key, "{text}");
            assert!(err.reason.contains(why), "{text}: {err}");
        }
        // The password is never shown.
        let secret = load(
            "[notify.smtp]\nrelay = \"mail.example\"\nusername = \"u\"\npassword = \"hunter22\"\n",
        )
        .unwrap();
        assert!(!format!("{secret:?}").contains("hunter22"));
    }

    #[test]
    fn optional_paths_and_lists_come_from_the_environment() {
        let config = Config::load(
            None,
            env(&[
                ("AGENTBAY_TLS__CERT", "/c.pem"),
                ("AGENTBAY_TLS__KEY", "/k.pem"),
                ("AGENTBAY_TLS__EXTRA_NAMES", "appliance.local, 10.0.0.5"),
                ("AGENTBAY_CONFIG", "/ignored/here"),
            ]),
            &CliOverrides::default(),
        )
        .unwrap();
        assert_eq!(config.tls.cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(config.tls.extra_names, vec!["appliance.local", "10.0.0.5"]);
        assert_eq!(env_name("tls.extra_names"), "AGENTBAY_TLS__EXTRA_NAMES");
    }

    #[test]
    fn editions_and_profiles_merge_onto_the_defaults() {
        let file = write(
            "[capacity.edition_defaults.starter]\nconcurrent_runs = 3\n[capacity.edition_defaults.enterprise]\nconcurrent_runs = 100\n",
        );
        let config = Config::load(
            Some(file.path()),
            env(&[(
                "AGENTBAY_CAPACITY__EDITION_DEFAULTS__TEAM__CPU_PER_ATTEMPT",
                "4",
            )]),
            &CliOverrides::default(),
        )
        .unwrap();
        let editions = &config.capacity.edition_defaults;
        assert_eq!(editions["starter"].concurrent_runs, Some(3));
        assert_eq!(editions["starter"].execution_minutes_per_day, Some(600));
        assert_eq!(editions["enterprise"].concurrent_runs, Some(100));
        assert_eq!(editions["team"].cpu_per_attempt, Some(4.0));
        assert!(editions.contains_key("platform"));
        let file = write("[capacity.edition_defaults.starter]\nconcurent_runs = 3\n");
        let err = Config::load(Some(file.path()), env(&[]), &CliOverrides::default()).unwrap_err();
        assert_eq!(err.key, "capacity.edition_defaults.starter.concurent_runs");
    }

    #[test]
    fn the_network_allowlist_and_read_allowance_are_read_and_bad_entries_named() {
        let c = Config::load(
            None,
            env(&[
                (
                    "AGENTBAY_RUNTIME__NETWORK_ALLOW",
                    "tickets.site:8080, https://tools.site/mcp/",
                ),
                ("AGENTBAY_RUNTIME__TOOL_READ_ALLOW", "/srv/models"),
            ]),
            &CliOverrides::default(),
        )
        .unwrap();
        assert_eq!(c.runtime.network_allow.len(), 2);
        assert_eq!(
            c.runtime.tool_read_allow,
            vec![PathBuf::from("/srv/models")]
        );
        let file = write("[runtime.network_allow_by_tenant]\nacme = [\"db.site:5432\"]\n");
        let c = Config::load(Some(file.path()), env(&[]), &CliOverrides::default()).unwrap();
        assert_eq!(c.runtime.network_allow_for("acme").len(), 1);
        assert!(c.runtime.network_allow_for("demo").is_empty());
        let err = Config::load(
            None,
            env(&[("AGENTBAY_RUNTIME__NETWORK_ALLOW", "tickets.site")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert!(err.key.starts_with("runtime.network_allow"), "{err}");
        assert!(err.reason.contains("host:port"), "{err}");
        let err = Config::load(
            None,
            env(&[("AGENTBAY_RUNTIME__TOOL_READ_ALLOW", "models")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert_eq!(err.key, "runtime.tool_read_allow");
    }

    #[test]
    fn the_demo_needs_its_key_trusted() {
        let err = Config::load(
            None,
            env(&[("AGENTBAY_RELEASES__TRUST_DEMO_KEY", "false")]),
            &CliOverrides::default(),
        )
        .unwrap_err();
        assert_eq!(err.key, "demo.enabled");
        assert!(err.to_string().contains("releases.trust_demo_key"), "{err}");
        Config::load(
            None,
            env(&[
                ("AGENTBAY_RELEASES__TRUST_DEMO_KEY", "false"),
                ("AGENTBAY_DEMO__ENABLED", "false"),
            ]),
            &CliOverrides::default(),
        )
        .unwrap();
    }

    #[test]
    fn the_packaged_example_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/agentbay.toml");
        Config::load(Some(&path), env(&[]), &CliOverrides::default()).unwrap();
    }
}
