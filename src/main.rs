//! The `agentbay` command: parse, configure, log, hand over.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use agentbay::app::Clocks;
use agentbay::config::{CliOverrides, Config, LogConfig};
use agentbay::{app, control, telemetry};
use clap::{Args, Parser, Subcommand};

// The store's writer, the flusher and the request workers all allocate
// small buffers on every write; glibc's allocator serialises them on its
// arena locks (measured: a tenth of the capacity path's time in
// `__lll_lock_wait_private`). Built without transparent huge pages: with
// them, mimalloc's first arena alone held 46 MB resident in an idle
// appliance.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// agentbay: an on-prem runtime for AI agents.
///
/// Every setting can come from a TOML file (--config), from AGENTBAY_*
/// environment variables, or from flags; flags win over the environment,
/// which wins over the file. With none at all, `agentbay serve` runs on
/// https://127.0.0.1:8443 with its data in ./agentbay-data.
#[derive(Parser)]
#[command(name = "agentbay", version = version_line(), about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `0.1.0 (store schema 8)`: what `--version` and `agentbay version` print
/// after the name.
fn version_line() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        format!(
            "{} (store schema {})",
            env!("CARGO_PKG_VERSION"),
            agentbay::store::SCHEMA_VERSION
        )
    })
}

#[derive(Args, Clone)]
struct Common {
    /// TOML configuration file.
    #[arg(long, env = "AGENTBAY_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory (store, certificate, run files). Environment:
    /// AGENTBAY_DATA_DIR. Default: ./agentbay-data.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the appliance: HTTPS API, RPC, event stream and console.
    Serve {
        #[command(flatten)]
        common: Common,
        /// Address to listen on. Environment: AGENTBAY_LISTEN. Default:
        /// 127.0.0.1:8443.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Run on a clock that only Admin/AdvanceClock moves (tests).
        #[arg(long, hide = true)]
        manual_clock: bool,
        /// Run on a manual clock standing at TIME (RFC 3339) at the start
        /// (tests that serve a store written at a known time).
        #[arg(long, hide = true, value_name = "TIME")]
        manual_clock_at: Option<chrono::DateTime<chrono::Utc>>,
        /// Run as the Windows service the MSI installs (Windows only).
        #[arg(long)]
        windows_service: bool,
    },
    /// Create the data directory, the certificate and the bootstrap
    /// PlatformAdmin credential (printed once), without serving.
    Init {
        #[command(flatten)]
        common: Common,
        /// The address the appliance serves on, for the sign-in and token
        /// lines it prints (as `serve --listen`). Environment:
        /// AGENTBAY_LISTEN. Default: 127.0.0.1:8443.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Print the credential as JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Write a consistent backup of the store and the certificate to FILE,
    /// through the running appliance or, when none runs, directly.
    #[command(args_conflicts_with_subcommands = true)]
    Backup {
        #[command(flatten)]
        common: Common,
        /// Backup file to create.
        file: Option<PathBuf>,
        #[command(subcommand)]
        command: Option<BackupCommand>,
    },
    /// Replace the token signing key (the appliance must be stopped):
    /// every bearer token issued before stops working; clients get new ones
    /// with their unchanged credentials.
    RotateTokenKey {
        #[command(flatten)]
        common: Common,
    },
    /// Give back the disk space of deleted records: rewrite the store into
    /// fresh files (the appliance must be stopped). Safe against a crash at
    /// any moment: the old files go only once the new ones are complete.
    Compact {
        #[command(flatten)]
        common: Common,
    },
    /// Check the store (the appliance must be stopped): every record reads
    /// back as this version's type, and every index entry, count, artifact
    /// reference and the audit chain is what the records make. Exit status
    /// 1 when something is wrong. Opening a store an earlier version wrote
    /// migrates it, after a backup (README, "Upgrading").
    Check {
        #[command(flatten)]
        common: Common,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move the store between backends (the appliance must be stopped).
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Fill an empty data directory from a backup FILE (and, with
    /// store.backend = "postgres", an empty PostgreSQL store).
    Restore {
        #[command(flatten)]
        common: Common,
        /// Backup file to read.
        file: PathBuf,
    },
    /// Manage console users (works whether or not the appliance runs).
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Manage client credentials (works whether or not the appliance runs).
    Client {
        #[command(subcommand)]
        command: ClientCommand,
    },
    /// Register tenants (PlatformAdmin tasks; work whether or not the
    /// appliance runs).
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Register projects of tenants.
    Project {
        #[command(subcommand)]
        command: ProjectCommand,
    },
    /// Trust and revoke release publisher keys (PlatformAdmin tasks; work
    /// whether or not the appliance runs). Every change verifies the stored
    /// releases again at once.
    Trust {
        #[command(subcommand)]
        command: TrustCommand,
    },
    /// Map model profile ids to the site's model servers (PlatformAdmin
    /// tasks, through the running appliance).
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// Sign, verify and import release bundles (works offline).
    Release {
        #[command(subcommand)]
        command: ReleaseCommand,
    },
    /// Operate on runs through the running appliance.
    Run {
        #[command(subcommand)]
        command: RunCommand,
    },
    /// Check and export the audit trail (who did what, from where).
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Make the running appliance read its configuration again (as
    /// SIGHUP does) and say what took effect and what needs a restart.
    Reload {
        #[command(flatten)]
        common: Common,
    },
    /// Appliances sharing one PostgreSQL store (README, "Beyond one
    /// machine: an active/standby pair on PostgreSQL").
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Print the version and the store schema version.
    Version,
    /// The process tool processes are forked by: started by `serve`, with
    /// a socket as its standard input. Not for people.
    #[command(name = "tool-spawner", hide = true)]
    ToolSpawner,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Make the key the appliances of a pair share (`pair.key` in the data
    /// directory, 0600), on the first appliance; copy the file to the same
    /// place on the others before they start. A standby believes only a
    /// leader row signed with it, and forwards with it.
    Init {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Subcommand)]
enum ReleaseCommand {
    /// Generate an Ed25519 publisher key pair: OUT.key (private) and OUT.pub.
    Keygen {
        /// Path prefix of the two files.
        #[arg(long)]
        out: PathBuf,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
    /// Sign a bundle directory: writes its signature.json.
    Sign {
        /// The bundle directory (with manifest.json).
        dir: PathBuf,
        /// The publisher's private key (PEM).
        #[arg(long)]
        key: PathBuf,
        /// Fill in every file's sha256 in manifest.json before signing.
        #[arg(long)]
        update_hashes: bool,
    },
    /// Verify a bundle (directory or .tar.gz) and print the report; exits
    /// non-zero when it is rejected.
    Verify {
        /// Configuration whose trusted keys apply.
        #[arg(long, env = "AGENTBAY_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
        /// The bundle.
        bundle: PathBuf,
        /// Also trust this public key file (repeatable).
        #[arg(long = "trust", value_name = "PUBFILE")]
        trust: Vec<PathBuf>,
    },
    /// Import a bundle into the appliance (running or not).
    Import {
        #[command(flatten)]
        common: Common,
        /// The bundle (directory or .tar.gz).
        bundle: PathBuf,
    },
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Map (or re-point) a profile id: the next model call goes there.
    Put {
        #[command(flatten)]
        common: Common,
        /// The profile id releases name (modelProfile.id).
        profile: String,
        /// Base URL of an OpenAI-compatible API, e.g. http://llm:8080/v1.
        #[arg(long)]
        endpoint: String,
        /// A server a call moves to when the one before cannot serve now
        /// (connection refused, no answer in time, 429, 502, 503, 504);
        /// repeat it for more, in order (at most 4).
        #[arg(long = "fallback", value_name = "URL")]
        fallbacks: Vec<String>,
        /// Calls its server takes at once, from every caller together
        /// (its slots); more wait in a queue fair between tenants.
        #[arg(long)]
        max_concurrent: Option<u32>,
        /// Calls its server takes a minute.
        #[arg(long)]
        requests_per_minute: Option<u32>,
        /// Tokens (input and output) its server takes a minute.
        #[arg(long)]
        tokens_per_minute: Option<u32>,
        /// The model name the server is asked for.
        #[arg(long)]
        model: String,
        /// Name of a key under [runtime.model_api_keys].
        #[arg(long)]
        api_key_ref: Option<String>,
        /// Seconds one call may take (default 120).
        #[arg(long)]
        timeout_seconds: Option<u32>,
        /// Only for this tenant (default: every tenant).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// List the site's model profiles.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Remove a profile: calls fall back to the platform's, then to the
    /// release's own endpoint.
    Delete {
        #[command(flatten)]
        common: Common,
        /// The profile id.
        profile: String,
        /// The tenant's profile (default: the platform's).
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Subcommand)]
enum RunCommand {
    /// Start a new run from a checkpoint of a finished attempt (the source
    /// run is unchanged). Calls whose effect the attempt confirmed after
    /// the checkpoint are not issued again unless named with --reissue.
    Rerun {
        #[command(flatten)]
        common: Common,
        /// The finished attempt.
        attempt_id: String,
        /// The tenant the attempt belongs to.
        #[arg(long)]
        tenant: String,
        /// The checkpoint's sequence (default: the attempt's last).
        #[arg(long)]
        checkpoint: Option<u32>,
        /// The release to run (default: the source run's); the same agent,
        /// the same or a newer version.
        #[arg(long)]
        release: Option<String>,
        /// A confirmed call (id) to issue again on purpose (repeat for
        /// several).
        #[arg(long = "reissue", value_name = "CALL_ID")]
        reissue: Vec<String>,
    },
    /// Take a run away for review: one .tar.gz with its timeline,
    /// attempts, calls with their content, checkpoints, decisions, the
    /// release's verdicts and every artifact, a manifest of every file's
    /// sha256 and a page that opens offline (through the running appliance).
    Export {
        #[command(flatten)]
        common: Common,
        /// The run.
        run_id: String,
        /// The tenant the run belongs to (default: the platform's).
        #[arg(long)]
        tenant: Option<String>,
        /// Where to write it (default: run-<id>.tar.gz here).
        #[arg(long, short = 'o', value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Check the audit trail's hash chain: says how many records it
    /// checked, the head hash to keep elsewhere, and where a break is
    /// (exit status 1). Through the running appliance or, when none runs,
    /// directly.
    Verify {
        #[command(flatten)]
        common: Common,
        /// Print JSON instead of words.
        #[arg(long)]
        json: bool,
        /// The first record's sequence, as noted elsewhere: a kept chain
        /// that starts later fails the check (records were cut).
        #[arg(long, value_name = "SEQUENCE")]
        expect_first: Option<u64>,
        /// A head hash noted elsewhere: the check fails unless a kept
        /// record has it.
        #[arg(long, value_name = "HASH")]
        expect_head: Option<String>,
    },
    /// Write audit records, newest first, as CSV or JSON.
    Export {
        #[command(flatten)]
        common: Common,
        /// `csv` or `json`.
        #[arg(long, default_value = "csv", value_parser = ["csv", "json"])]
        format: String,
        /// At or after: a day (YYYY-MM-DD) or an RFC 3339 time.
        #[arg(long)]
        from: Option<String>,
        /// Up to: a day, which it includes whole, or an RFC 3339 time.
        #[arg(long)]
        to: Option<String>,
        /// The actor contains this.
        #[arg(long)]
        actor: Option<String>,
        /// The action (`quota.set`) or its noun (`user`).
        #[arg(long)]
        action: Option<String>,
        /// The target contains this.
        #[arg(long)]
        target: Option<String>,
        /// One tenant's records (default: every tenant's).
        #[arg(long)]
        tenant: Option<String>,
        /// Where to write them (default: standard output).
        #[arg(long, short = 'o', value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum TrustCommand {
    /// Trust a publisher key (new, revoked before, or with new tenants):
    /// releases it signed become Verified.
    Add {
        #[command(flatten)]
        common: Common,
        /// A name for people.
        #[arg(long)]
        name: String,
        /// The public key file `agentbay release keygen` wrote (OUT.pub).
        #[arg(long, value_name = "PUBFILE")]
        public_key_file: PathBuf,
        /// A tenant it may sign for (repeat for several; none for any).
        /// A key already trusted gets these tenants added to its scope,
        /// under the same name.
        #[arg(long = "tenant", value_name = "TENANT")]
        tenants: Vec<String>,
        /// Replace what a trusted key had: its name and exactly these
        /// tenants (none: any tenant).
        #[arg(long)]
        replace: bool,
    },
    /// List trusted and revoked publisher keys.
    List {
        #[command(flatten)]
        common: Common,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a publisher key: releases it signed become Untrusted.
    Revoke {
        #[command(flatten)]
        common: Common,
        /// The key id (`ed25519:...`, see `agentbay trust list`).
        key_id: String,
        /// Why (recorded with the revocation).
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Register a tenant or change its edition and residency.
    Put {
        #[command(flatten)]
        common: Common,
        /// Tenant id (a-z, 0-9, '-').
        tenant: String,
        /// Edition: starter, team, platform, or one from the configuration.
        #[arg(long)]
        edition: String,
        /// Name shown to people.
        #[arg(long)]
        name: Option<String>,
        /// A region the tenant's work may run in (repeat for several; none
        /// for any region).
        #[arg(long = "region", value_name = "REGION")]
        regions: Vec<String>,
        /// Days artifacts (prompts, responses, tool payloads, outputs) are
        /// kept after their run ended; 0 inherits `retention.payload_days`.
        /// Not given (nor --history-days): the tenant keeps its overrides.
        #[arg(long, value_name = "DAYS")]
        payload_days: Option<u32>,
        /// Days finished runs, leases, minutes and events are kept; 0
        /// inherits `retention.history_days`.
        #[arg(long, value_name = "DAYS")]
        history_days: Option<u32>,
    },
    /// List tenants.
    List {
        #[command(flatten)]
        common: Common,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ProjectCommand {
    /// Register a project of a tenant.
    Put {
        #[command(flatten)]
        common: Common,
        /// The tenant.
        tenant: String,
        /// Project id (a-z, 0-9, '-').
        project: String,
        /// Name shown to people.
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Copy the stopped appliance's store to the other backend, verified
    /// table by table (record counts and SHA-256); then set
    /// store.backend to it. The target must hold no store yet; the source
    /// is left as it was.
    Migrate {
        #[command(flatten)]
        common: Common,
        /// The backend to move to: `postgres` (store.postgres.url) or
        /// `sled` (the data directory).
        #[arg(long, value_enum)]
        to: MigrateTo,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A backend to move the store to.
#[derive(Clone, Copy, clap::ValueEnum)]
enum MigrateTo {
    Sled,
    Postgres,
}

#[derive(Subcommand)]
enum BackupCommand {
    /// Check a backup FILE as the scheduled backups do: every byte against
    /// its checksum, and that the store it restores opens (in a scratch
    /// directory beside the file, removed afterwards).
    Verify {
        /// Backup file to check.
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create a console user; a generated password is printed once.
    Create {
        #[command(flatten)]
        common: Common,
        /// Tenant the user acts in.
        #[arg(long)]
        tenant: String,
        /// Sign-in name, unique across the appliance.
        #[arg(long)]
        username: String,
        /// Role to hold (repeat for several): Requester, Reviewer, Operator,
        /// WorkspaceAdmin, PlatformAdmin (platform tenant only), Observer.
        #[arg(long = "role", required = true, value_name = "ROLE")]
        roles: Vec<String>,
        /// Name shown to people.
        #[arg(long, default_value = "")]
        name: String,
        /// Read the password from this file instead of generating one: a
        /// text file whose first line is the password (at least 12
        /// characters; the line break and any further lines are ignored),
        /// so that it never appears on a command line.
        #[arg(long)]
        password_file: Option<PathBuf>,
        /// Where mail reaches the user: decisions waiting for it are told
        /// there ([notify.smtp]).
        #[arg(long)]
        email: Option<String>,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Set or clear a user's mail address, where decisions waiting for it
    /// are told ([notify.smtp]).
    SetEmail {
        #[command(flatten)]
        common: Common,
        /// The user's tenant.
        #[arg(long)]
        tenant: String,
        /// The user name.
        username: String,
        /// The address; empty ("") to clear it.
        email: String,
    },
    /// List console users (never their password hashes).
    List {
        #[command(flatten)]
        common: Common,
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Disable a user: it cannot sign in and its sessions end.
    Disable {
        #[command(flatten)]
        common: Common,
        /// The user's tenant.
        #[arg(long)]
        tenant: String,
        /// The user name.
        username: String,
    },
    /// Enable a disabled user: it may sign in again.
    Enable {
        #[command(flatten)]
        common: Common,
        /// The user's tenant.
        #[arg(long)]
        tenant: String,
        /// The user name.
        username: String,
    },
    /// Reset a user's password (a generated one is printed once); its
    /// sessions end.
    ResetPassword {
        #[command(flatten)]
        common: Common,
        /// The user's tenant.
        #[arg(long)]
        tenant: String,
        /// The user name.
        username: String,
        /// Read the new password from this file instead of generating one:
        /// a text file whose first line is the password (at least 12
        /// characters; the line break and any further lines are ignored).
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ClientCommand {
    /// Create a credential; its secret is printed once.
    #[command(after_help = agentbay::domain::access::scope_help())]
    Create {
        #[command(flatten)]
        common: Common,
        /// Tenant the client acts for.
        #[arg(long)]
        tenant: String,
        /// Scope to grant (repeat for several), e.g. factory.capacity.lease;
        /// every scope is listed below.
        #[arg(long = "scope", required = true, value_name = "SCOPE")]
        scopes: Vec<String>,
        /// What the client is for.
        #[arg(long, default_value = "")]
        description: String,
        /// Print {"client_id": ..., "client_secret": ...} for scripts.
        #[arg(long)]
        json: bool,
    },
    /// List credentials (never their secrets).
    List {
        #[command(flatten)]
        common: Common,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a credential; its tokens stop working at once.
    Revoke {
        #[command(flatten)]
        common: Common,
        /// The client id.
        client_id: String,
    },
}

fn load(common: &Common, listen: Option<SocketAddr>) -> anyhow::Result<Config> {
    let cli = CliOverrides {
        data_dir: common.data_dir.clone(),
        listen,
    };
    Ok(Config::load(
        common.config.as_deref(),
        std::env::vars(),
        &cli,
    )?)
}

/// Hands the process to the Windows Service Control Manager.
#[cfg(windows)]
async fn run_windows_service(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || agentbay::winservice::run(config, runtime)).await?
}

#[cfg(not(windows))]
async fn run_windows_service(_: Config) -> anyhow::Result<()> {
    anyhow::bail!("--windows-service runs only on Windows; use systemd (packaging/debian) here")
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

async fn execute(command: Command) -> anyhow::Result<()> {
    // Every command but the release tools (which write the user's bundles
    // and public keys) touches a data directory or writes a backup: what it
    // creates is private, whatever the umask it was started with.
    if !matches!(
        command,
        Command::Release {
            command: ReleaseCommand::Keygen { .. }
                | ReleaseCommand::Sign { .. }
                | ReleaseCommand::Verify { .. }
        } | Command::Version
    ) {
        agentbay::store::datadir::private_files();
    }
    match command {
        Command::Serve {
            common,
            listen,
            manual_clock,
            manual_clock_at,
            windows_service,
        } => {
            let config = load(&common, listen)?;
            telemetry::init_logging(&config.log, &config.telemetry).map_err(anyhow::Error::msg)?;
            if windows_service {
                return run_windows_service(config).await;
            }
            let clocks = match (manual_clock_at, manual_clock) {
                (Some(at), _) => Clocks::manual_at(at),
                (None, true) => Clocks::manual_at(chrono::Utc::now()),
                (None, false) => Clocks::system(),
            };
            let result = app::run(config, clocks, shutdown_signal()).await;
            telemetry::flush_traces();
            result
        }
        Command::Init {
            common,
            listen,
            json,
        } => {
            let config = load(&common, listen)?;
            quiet_logging(&config);
            control::init(&config, json).await
        }
        Command::Backup {
            command: Some(BackupCommand::Verify { file }),
            ..
        } => {
            let scratch = file
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."))
                .to_path_buf();
            let summary = agentbay::store::scheduled::verify(&file, &scratch)?;
            println!(
                "{}: verified: checksum matches, {} records and {} files, the store opens (schema version {})",
                file.display(),
                summary.records,
                summary.files,
                summary.schema_version
            );
            Ok(())
        }
        Command::Backup { common, file, .. } => {
            let config = load(&common, None)?;
            quiet_logging(&config);
            let Some(file) = file else {
                anyhow::bail!(
                    "agentbay backup FILE writes a backup; agentbay backup verify FILE checks one"
                );
            };
            control::backup(&config, &file).await
        }
        Command::Check { common, json } => {
            let config = load(&common, None)?;
            quiet_logging(&config);
            let local = app::open_local(&config).map_err(|e| match e {
                agentbay::store::StoreError::InUse { .. } => anyhow::anyhow!(
                    "{e}; stop the appliance first (systemctl stop agentbay): the check reads the whole store while nothing writes"
                ),
                e => e.into(),
            })?;
            let check = app::check_store(&local.store)?;
            local.store.close()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&check)?);
            } else {
                let records: usize = check.records.values().sum();
                println!(
                    "store {} (schema {}): {records} records in {} tables read back",
                    local.datadir.store_path().display(),
                    check.schema_version,
                    check.records.len()
                );
                for (table, n) in &check.records {
                    println!("  {table:<20} {n}");
                }
                for problem in &check.problems {
                    println!("problem: {problem}");
                }
                if check.problems.is_empty() {
                    println!(
                        "consistent: every index entry, count, artifact reference and the audit chain is what the records make"
                    );
                }
            }
            if check.problems.is_empty() {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        Command::Compact { common } => {
            let config = load(&common, None)?;
            quiet_logging(&config);
            let dir = agentbay::store::DataDir::open(&config.data_dir).map_err(|e| match e {
                agentbay::store::StoreError::InUse { .. } => anyhow::anyhow!(
                    "{e}; stop the appliance first (systemctl stop agentbay): compaction rewrites the store's files"
                ),
                e => e.into(),
            })?;
            let (before, after) = dir.compact()?;
            println!(
                "store compacted: {:.1} MiB -> {:.1} MiB on disk ({})",
                before as f64 / 1_048_576.0,
                after as f64 / 1_048_576.0,
                dir.store_path().display()
            );
            Ok(())
        }
        Command::RotateTokenKey { common } => {
            let config = load(&common, None)?;
            quiet_logging(&config);
            control::rotate_token_key(&config).await
        }
        Command::Store {
            command: StoreCommand::Migrate { common, to, json },
        } => {
            let config = load(&common, None)?;
            quiet_logging(&config);
            let to = match to {
                MigrateTo::Sled => agentbay::config::StoreBackend::Sled,
                MigrateTo::Postgres => agentbay::config::StoreBackend::Postgres,
            };
            control::migrate_store(&config, to, json)
        }
        Command::Restore { common, file } => {
            let config = load(&common, None)?;
            quiet_logging(&config);
            control::restore(&config, &file).await
        }
        Command::Client { command } => match command {
            ClientCommand::Create {
                common,
                tenant,
                scopes,
                description,
                json,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::client_create(&config, &tenant, &scopes, &description, json).await
            }
            ClientCommand::List { common, json } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::client_list(&config, json).await
            }
            ClientCommand::Revoke { common, client_id } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::client_revoke(&config, &client_id).await
            }
        },
        Command::User { command } => match command {
            UserCommand::Create {
                common,
                tenant,
                username,
                roles,
                name,
                password_file,
                email,
                json,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                let password = password_file.map(|f| read_password(&f)).transpose()?;
                control::user_create(
                    &config,
                    control::NewUserArgs {
                        tenant: &tenant,
                        username: &username,
                        roles: &roles,
                        name: &name,
                        password,
                        email,
                    },
                    json,
                )
                .await
            }
            UserCommand::SetEmail {
                common,
                tenant,
                username,
                email,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::user_set_email(&config, &tenant, &username, &email).await
            }
            UserCommand::List {
                common,
                tenant,
                json,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::user_list(&config, tenant.as_deref(), json).await
            }
            UserCommand::Disable {
                common,
                tenant,
                username,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::user_disable(&config, &tenant, &username).await
            }
            UserCommand::Enable {
                common,
                tenant,
                username,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::user_enable(&config, &tenant, &username).await
            }
            UserCommand::ResetPassword {
                common,
                tenant,
                username,
                password_file,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                let password = password_file.map(|f| read_password(&f)).transpose()?;
                control::user_reset_password(&config, &tenant, &username, password).await
            }
        },
        Command::Model { command } => {
            let (common, action) = match command {
                ModelCommand::Put {
                    common,
                    profile,
                    endpoint,
                    fallbacks,
                    max_concurrent,
                    requests_per_minute,
                    tokens_per_minute,
                    model,
                    api_key_ref,
                    timeout_seconds,
                    tenant,
                } => (
                    common,
                    control::ModelAction::Put(
                        agentbay::proto::agentbay::admin::v1::PutModelProfileRequest {
                            profile_id: profile,
                            tenant_id: tenant.unwrap_or_default(),
                            endpoint,
                            fallback_endpoints: fallbacks,
                            max_concurrent: max_concurrent.unwrap_or(0),
                            requests_per_minute: requests_per_minute.unwrap_or(0),
                            tokens_per_minute: tokens_per_minute.unwrap_or(0),
                            model,
                            api_key_ref: api_key_ref.unwrap_or_default(),
                            timeout_seconds: timeout_seconds.unwrap_or(0),
                            ..Default::default()
                        },
                    ),
                ),
                ModelCommand::List { common } => (common, control::ModelAction::List),
                ModelCommand::Delete {
                    common,
                    profile,
                    tenant,
                } => (
                    common,
                    control::ModelAction::Delete(
                        agentbay::proto::agentbay::admin::v1::DeleteModelProfileRequest {
                            profile_id: profile,
                            tenant_id: tenant.unwrap_or_default(),
                            ..Default::default()
                        },
                    ),
                ),
            };
            let config = load(&common, None)?;
            quiet_logging(&config);
            control::model_profiles(&config, action).await
        }
        Command::Run { command } => match command {
            RunCommand::Rerun {
                common,
                attempt_id,
                tenant,
                checkpoint,
                release,
                reissue,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::rerun(
                    &config,
                    agentbay::proto::agentbay::runs::v1::RerunFromCheckpointRequest {
                        attempt_id,
                        checkpoint_sequence: checkpoint.unwrap_or(0),
                        release_id: release.unwrap_or_default(),
                        reissue_call_ids: reissue,
                        tenant_id: tenant,
                        ..Default::default()
                    },
                )
                .await
            }
            RunCommand::Export {
                common,
                run_id,
                tenant,
                out,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::run_export(&config, &run_id, tenant.as_deref(), out.as_deref()).await
            }
        },
        Command::Trust { command } => match command {
            TrustCommand::Add {
                common,
                name,
                public_key_file,
                tenants,
                replace,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                let public = std::fs::read_to_string(&public_key_file)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", public_key_file.display()))?;
                control::trust_add(&config, &name, public.trim(), &tenants, replace).await
            }
            TrustCommand::List { common, json } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::trust_list(&config, json).await
            }
            TrustCommand::Revoke {
                common,
                key_id,
                reason,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::trust_revoke(&config, &key_id, &reason).await
            }
        },
        Command::Tenant { command } => match command {
            TenantCommand::Put {
                common,
                tenant,
                edition,
                name,
                regions,
                payload_days,
                history_days,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                let retention = (payload_days.is_some() || history_days.is_some()).then(|| {
                    agentbay::domain::retention::RetentionOverride {
                        payload_days: payload_days.filter(|d| *d > 0),
                        history_days: history_days.filter(|d| *d > 0),
                    }
                });
                control::tenant_put(
                    &config,
                    &tenant,
                    &edition,
                    name.as_deref(),
                    &regions,
                    retention,
                )
                .await
            }
            TenantCommand::List { common, json } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::tenant_list(&config, json).await
            }
        },
        Command::Project { command } => match command {
            ProjectCommand::Put {
                common,
                tenant,
                project,
                name,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::project_put(&config, &tenant, &project, name.as_deref()).await
            }
        },
        Command::Release { command } => match command {
            ReleaseCommand::Keygen { out, force } => control::release_keygen(&out, force),
            ReleaseCommand::Sign {
                dir,
                key,
                update_hashes,
            } => control::release_sign(&dir, &key, update_hashes),
            ReleaseCommand::Verify {
                config,
                bundle,
                trust,
            } => {
                let config = Config::load(
                    config.as_deref(),
                    std::env::vars(),
                    &CliOverrides::default(),
                )?;
                quiet_logging(&config);
                if control::release_verify(&config, &bundle, &trust)? {
                    Ok(())
                } else {
                    std::process::exit(1)
                }
            }
            ReleaseCommand::Import { common, bundle } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                control::release_import(&config, &bundle).await
            }
        },
        Command::Cluster {
            command: ClusterCommand::Init { common },
        } => {
            let config = load(&common, None)?;
            let key = agentbay::store::datadir::create_pair_key(&config.data_dir)?;
            let path = config
                .data_dir
                .join(agentbay::store::datadir::PAIR_KEY_FILE);
            println!("made the pair key {} (id {})", path.display(), key.id());
            println!(
                "copy it to the same place on every other appliance of the pair, readable only by the account agentbay runs as, e.g."
            );
            println!(
                "  install -m 600 -o agentbay -g agentbay pair.key {}",
                path.display()
            );
            println!(
                "a standby shows the id of the key it holds in /readyz (pairKey); it must be {}",
                key.id()
            );
            Ok(())
        }
        Command::Audit { command } => match command {
            AuditCommand::Verify {
                common,
                json,
                expect_first,
                expect_head,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                let expect = agentbay::domain::audit::Expect::new(expect_first, expect_head)?;
                control::audit_verify(&config, json, &expect).await
            }
            AuditCommand::Export {
                common,
                format,
                from,
                to,
                actor,
                action,
                target,
                tenant,
                out,
            } => {
                let config = load(&common, None)?;
                quiet_logging(&config);
                let query: Vec<(&str, String)> = [
                    ("from", from),
                    ("to", to),
                    ("actor", actor),
                    ("action", action),
                    ("target", target),
                    ("tenant", tenant),
                ]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect();
                control::audit_export(&config, &query, format == "csv", out.as_deref()).await
            }
        },
        Command::Reload { common } => {
            let config = load(&common, None)?;
            quiet_logging(&config);
            control::reload(&config).await
        }
        Command::Version => {
            println!("agentbay {}", version_line());
            Ok(())
        }
        Command::ToolSpawner => {
            anyhow::bail!("the tool spawner is started by `agentbay serve`, not by hand")
        }
    }
}

/// Administrative commands print their results; the log only says what
/// went wrong.
fn quiet_logging(config: &Config) {
    telemetry::init_logging(
        &LogConfig {
            level: "warn".into(),
            format: config.log.format,
            ..LogConfig::default()
        },
        &agentbay::config::TelemetryConfig::default(),
    )
    .expect("standard error needs no setup");
}

fn main() -> ExitCode {
    // Tool processes are forked by this very binary, run as the tool
    // spawner.
    #[cfg(unix)]
    agentbay::runtime::confine::spawner::set_program(std::path::Path::new("/proc/self/exe"));
    // The tool spawner (one thread, no async runtime: it forks) serves
    // before anything is parsed: every process it makes ahead is a copy
    // of it, and each undoes what the spawner touched when it execs its
    // tool, while other tools start.
    #[cfg(unix)]
    if std::env::args_os()
        .skip(1)
        .eq([agentbay::runtime::confine::spawner::SUBCOMMAND])
    {
        return agentbay::runtime::confine::spawner::serve();
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // What the command line changes in the store directly is audited as
    // done by the machine's account that ran it; the appliance itself
    // (serve) audits each request as its own.
    let result = if matches!(cli.command, Command::Serve { .. }) {
        runtime.block_on(execute(cli.command))
    } else {
        let account = ["USER", "LOGNAME", "USERNAME"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
            .unwrap_or_else(|| "unknown".into());
        let origin = agentbay::domain::audit::Origin {
            actor: format!("the appliance's owner (agentbay command line, account {account})"),
            address: "local".into(),
            via: agentbay::domain::audit::Via::Cli,
        };
        runtime.block_on(agentbay::acting::scope(origin, execute(cli.command)))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The first line of a `--password-file`: passwords stay off command lines.
fn read_password(path: &std::path::Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--password-file {}: {e}", path.display()))?
        .lines()
        .next()
        .unwrap_or_default()
        .to_string())
}
