//! The store on PostgreSQL: the same keys and values as sled's, in one
//! table.
//!
//! # Layout
//!
//! - `agentbay_kv(tree text, key bytea, value bytea)`, primary key
//!   `(tree, key)`: one row per sled key, `tree` the [`Table`]'s name.
//!   bytea compares bytewise and then by length, which is sled's order, so
//!   every range and prefix scan is a range of the primary key, read in
//!   pages (`key > last ... LIMIT n`) from either end.
//! - `agentbay_leader(id, node, url, fingerprint, epoch, expires_at,
//!   signature)`: which appliance is active (row 1), where it is reached,
//!   the epoch it took, and until when its lease runs, on the database's
//!   clock. An appliance opening the store takes the row with a new epoch
//!   if it is free, expired or its own, and renews it a fifth of a lease
//!   apart (a quarter of a second apart after a renewal failed). It stops committing once a lease has passed, less a margin,
//!   since its last renewal was sent, so it has stopped before the row can
//!   expire on the database's clock and a standby take it. `signature` is
//!   the pair key's over node, URL, fingerprint and epoch
//!   ([`PairKey::sign_leader`]): a standby believes only a row its pair
//!   signed (where it forwards, which certificate it pins), and the active
//!   appliance renews only the row exactly as it wrote it, so one that
//!   someone with the database's password rewrote makes it stand down.
//! - `agentbay_layout(version)`: the version of this SQL layout, so a
//!   later one can migrate it. The store's own schema version and format
//!   marker are rows of the `meta` tree, as on sled.
//!
//! # Writes
//!
//! The group commit is the same as on sled (`commit.rs`): one writer runs
//! the transactions, and its groups are readable only once committed, so
//! the writer keeps them in memory until then. The flusher commits every
//! group that queued up during the last commit as ONE PostgreSQL
//! transaction: a check that this appliance's epoch still holds the leader
//! row (`FOR SHARE`, so a takeover waits for the commit in flight, and
//! every later commit of a deposed appliance is refused), then one upsert
//! of every written key and one delete of every removed key.
//!
//! # Riding out a restart
//!
//! A PostgreSQL restart or failover is shorter than the leader lease, and
//! the appliance keeps its role through it: a query or a commit that finds
//! the database not answering (its connection closed or refused, the
//! server starting up or shutting down, a read-only server after a
//! failover, no answer in time) is tried again, on a new connection, until
//! it is answered or the lease is lost ([`PgEngine::ride_out`]). A commit
//! is tried again whole: it writes every key's value and removes every
//! removed key, and this appliance is the only writer while its epoch
//! holds the row, so a commit whose reply was lost and that did commit
//! writes the same values again; one that did not commits now. Only when
//! the lease is lost does a commit fail, and then the store stops (the
//! outcome is unknown; the writes are answered as not durable), as a
//! failed sync does on sled, and the appliance stands down. Meanwhile the
//! store says since when the database has not answered ([`Reach`]), so
//! that requests that need it are told to come back, and what counts a
//! client's silence against it waits until clients could renew.
//! Event numbers stay the writer's own counter, gapless, and a number
//! reused by a deposed writer cannot commit: its fence fails first.
//!
//! # Reads
//!
//! Readers run on any thread, in sync code, often on the application's
//! async workers. Their queries run on the store's own small runtime,
//! and the caller waits on a plain channel (handing its worker's other
//! tasks on, `block_in_place`); each statement sees every committed
//! transaction whole. A point read needs no query when the key is known
//! as committed: while this appliance holds the store it is the only
//! writer, so its commits and the answers it got tell what PostgreSQL
//! holds (see [`Committed`]). Scans always ask PostgreSQL.
//!
//! Partitioning grains across several active appliances later would give
//! each partition its own leader row (`id` = partition) and fence each
//! group with the rows of the partitions it writes; the key layout already
//! starts with the tenant.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_postgres::{Client, Statement};

use super::kv::{KvBulk, KvEngine, KvRead, Pair, Reach, Rows, Sink};
use super::tx::Writes;
use super::{StoreError, Table};
use crate::domain::cluster::{Node, PairKey, Untrusted};

/// The SQL layout this binary creates and reads: 2 signs the leader row.
const LAYOUT: i32 = 2;

/// Connections readers share (each pipelines its queries).
const READERS: usize = 4;

/// The fence of every commit: this appliance's epoch still holds the
/// leader row, locked `FOR SHARE` until the commit ends, so a takeover
/// waits for the commit in flight and every later one is refused.
const FENCE: &str =
    "SELECT 1 FROM agentbay_leader WHERE id = 1 AND node = $1 AND epoch = $2 FOR SHARE";

/// Every written key of a commit, in one statement.
const UPSERT: &str = "INSERT INTO agentbay_kv (tree, key, value)
     SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])
     ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value";

/// A commit's written keys, by column: tables, keys, values.
type Upserts = (Vec<&'static str>, Vec<Vec<u8>>, Vec<Vec<u8>>);

/// A commit's removed keys, by column: tables, keys.
type Deletes = (Vec<&'static str>, Vec<Vec<u8>>);

/// Every removed key of a commit, in one statement.
const DELETE: &str = "DELETE FROM agentbay_kv USING unnest($1::text[], $2::bytea[]) AS d(tree, key)
     WHERE agentbay_kv.tree = d.tree AND agentbay_kv.key = d.key";

/// Longest a query or a commit waits for PostgreSQL: an unreachable
/// server (a partition drops packets, it does not refuse them) fails the
/// call instead of hanging its caller.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// The first and the longest pause before a query the database did not
/// answer is tried again.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// How soon a renewal of the leader lease that failed is tried again.
const RENEW_RETRY: Duration = Duration::from_millis(250);

/// Rows a scan reads per query, first and at most.
const FIRST_PAGE: i64 = 64;
const MAX_PAGE: i64 = 1024;

/// How the store reaches PostgreSQL.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// A libpq connection string or URL (`postgresql://user@host/db`).
    pub url: String,
    /// PEM file of the CA that signed the server's certificate, for TLS.
    pub ca_file: Option<PathBuf>,
    /// This appliance's name in the leader row.
    pub node: String,
    /// Where clients and the other appliances reach this one.
    pub advertise: String,
    /// SHA-256 fingerprint of this appliance's TLS certificate.
    pub fingerprint: String,
    /// How long a leader's lease runs without renewal.
    pub lease: Duration,
    /// The key the pair shares (`pair.key` in the data directory); the
    /// store does not open without it.
    pub pair: Option<PairKey>,
}

impl PgOptions {
    /// How long before its lease ends, by its own clock, an active
    /// appliance stops committing.
    fn margin(&self) -> Duration {
        (self.lease / 5).max(Duration::from_secs(1))
    }
}

impl PgOptions {
    /// The database in words, without a password.
    pub fn describe(&self) -> String {
        match self.url.parse::<tokio_postgres::Config>() {
            Ok(c) => {
                let hosts: Vec<String> = c
                    .get_hosts()
                    .iter()
                    .map(|h| match h {
                        tokio_postgres::config::Host::Tcp(name) => name.clone(),
                        #[cfg(unix)]
                        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                    })
                    .collect();
                format!(
                    "database {} on {}",
                    c.get_dbname().unwrap_or("(default)"),
                    hosts.join(",")
                )
            }
            Err(_) => "an unreadable connection string".into(),
        }
    }
}

/// The Unix-socket directory a connection string connects through, if
/// any of its hosts is one (a path, as libpq takes `host=/run/postgresql`).
pub fn unix_socket(url: &str) -> Option<String> {
    let c = url.parse::<tokio_postgres::Config>().ok()?;
    c.get_hosts().iter().find_map(|h| match h {
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(path) => Some(path.display().to_string()),
        _ => None,
    })
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The server's own words when it sent any (`Display` says only
        // "db error").
        let words = match e.as_db_error() {
            Some(db) => format!("PostgreSQL: {}", db.message()),
            None => format!("PostgreSQL: {e}"),
        };
        if not_answering(&e) {
            StoreError::Unreachable(words)
        } else {
            StoreError::Engine(words)
        }
    }
}

/// Whether `e` says the database does not answer now, rather than that
/// what was asked is wrong: the connection closed or could not be made
/// (but not a certificate or a password refused), or the server is
/// shutting down, starting up, read-only after a failover, out of
/// connections, or broke a transaction off it may run again.
fn not_answering(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    if let Some(code) = e.code() {
        return code.code().starts_with("08")
            || [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::READ_ONLY_SQL_TRANSACTION,
                SqlState::TOO_MANY_CONNECTIONS,
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::LOCK_NOT_AVAILABLE,
            ]
            .contains(code);
    }
    if e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            // TLS refusals reach here as I/O errors too: a certificate
            // the site does not trust is not an outage.
            return io
                .get_ref()
                .is_none_or(|inner| inner.downcast_ref::<rustls::Error>().is_none());
        }
        source = inner.source();
    }
    false
}

/// Whether the database answers, as the queries and renewals found it
/// (see [`Reach`]).
#[derive(Default)]
struct Answers {
    /// Whether it did not answer last: queries that find it answering
    /// take no lock while it does.
    down: AtomicBool,
    /// Since when it has not answered and why, and when it last answered
    /// again after how long (`role_left` is the engine's to say).
    seen: Mutex<Reach>,
}

impl Answers {
    fn not_answering(&self, why: &str) {
        let mut seen = self.seen.lock();
        match seen.down.as_mut() {
            Some((_, last)) => why.clone_into(last),
            None => {
                tracing::warn!(error = %why, "store: PostgreSQL does not answer; this appliance keeps its role and waits while its leader lease runs");
                metrics::counter!(crate::telemetry::names::STORE_OUTAGES).increment(1);
                seen.down = Some((Instant::now(), why.to_string()));
            }
        }
        self.down.store(true, Ordering::Release);
    }

    fn answered(&self) {
        if !self.down.load(Ordering::Acquire) {
            return;
        }
        let mut seen = self.seen.lock();
        if let Some((since, _)) = seen.down.take() {
            let after = since.elapsed();
            tracing::info!(
                after_ms = after.as_millis() as u64,
                "store: PostgreSQL answers again; what waited for it goes on"
            );
            seen.back = Some((Instant::now(), after));
        }
        self.down.store(false, Ordering::Release);
    }
}

/// The store's own runtime: every connection's task runs on it, and sync
/// callers wait for their query on a channel.
struct Runtime(Option<tokio::runtime::Runtime>);

impl Runtime {
    fn new() -> Result<Runtime, StoreError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("store-postgres")
            .enable_all()
            .build()
            .map(|rt| Runtime(Some(rt)))
            .map_err(StoreError::io("starting the store's PostgreSQL runtime"))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("runtime until dropped").handle()
    }

    /// Runs `f` on the store's runtime and waits for it, from any thread
    /// but the runtime's own, for [`ANSWER_WITHIN`] at most.
    fn block<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.block_within(ANSWER_WITHIN, f)
    }

    /// [`Runtime::block`], waiting `within` at most.
    fn block_within<T: Send + 'static>(
        &self,
        within: Duration,
        f: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle().spawn(async move {
            let _ = tx.send(tokio::time::timeout(within, f).await);
        });
        let answer = Runtime::waiting(|| rx.recv());
        match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(StoreError::Unreachable(format!(
                "PostgreSQL did not answer within {} s",
                within.as_secs()
            ))),
            Err(_) => Err(StoreError::Closed),
        }
    }

    /// Waits `pause` from any thread but the runtime's own.
    fn pause(&self, pause: Duration) {
        Runtime::waiting(|| std::thread::sleep(pause));
    }

    /// Runs `wait`, which blocks. A caller on a worker of a
    /// multi-threaded runtime (a request, a grain) hands its worker's
    /// other tasks on meanwhile, so one wait never stalls them.
    fn waiting<T>(wait: impl FnOnce() -> T) -> T {
        let on_worker = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if on_worker {
            tokio::task::block_in_place(wait)
        } else {
            wait()
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Dropping a runtime inside async code panics; the store may be
        // dropped there.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Connects once, with TLS through rustls when the URL asks for it.
async fn connect(options: &PgOptions, role: &str) -> Result<Client, StoreError> {
    let mut config: tokio_postgres::Config = options.url.parse().map_err(|e| {
        StoreError::Engine(format!(
            "store.postgres.url is not a connection string: {e}"
        ))
    })?;
    config.application_name(format!("agentbay:{}:{role}", options.node));
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    config.keepalives_idle(Duration::from_secs(5));
    // A hung appliance inside a commit holds the leader row FOR SHARE:
    // the server ends its session after 5 s idle in the transaction, so a
    // standby's takeover waits that long at most; and a takeover waiting
    // on a commit in flight gives up after 3 s and tries again.
    //
    // The store reads and writes by primary key only. A plan that
    // PostgreSQL caches for a prepared statement while the table is still
    // small (a sequential scan, a hash join against the whole table)
    // stays, and would then scan every record each time: sequential scans
    // are off, so every plan goes through the key. A commit's statements
    // carry a batch whose size varies, so the writer plans them for each
    // batch.
    let mut settings = String::from(
        "-c idle_in_transaction_session_timeout=5000 -c lock_timeout=3000 -c enable_seqscan=off",
    );
    if role == "write" {
        settings.push_str(" -c plan_cache_mode=force_custom_plan");
    }
    config.options(&settings);
    #[cfg(target_os = "linux")]
    config.tcp_user_timeout(ANSWER_WITHIN);
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(options)?);
    let (client, connection) = config.connect(tls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "store: a PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// rustls with the site's CA (none: TLS refuses every server).
fn tls_config(options: &PgOptions) -> Result<rustls::ClientConfig, StoreError> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(path) = &options.ca_file {
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                StoreError::Engine(format!(
                    "store.postgres.ca_file {}: not a PEM certificate file ({e})",
                    path.display()
                ))
            })?;
        for cert in certs {
            roots.add(cert).map_err(|e| {
                StoreError::Engine(format!("store.postgres.ca_file {}: {e}", path.display()))
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Engine(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A connection and the statements prepared on it: a statement is
/// prepared once, and every later use is one round trip.
struct Conn {
    client: Client,
    prepared: Mutex<std::collections::HashMap<String, Statement>>,
}

impl Conn {
    fn new(client: Client) -> Conn {
        Conn {
            client,
            prepared: Mutex::new(std::collections::HashMap::new()),
        }
    }

    async fn prepared(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.prepared.lock().get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.prepared
            .lock()
            .insert(sql.to_string(), statement.clone());
        Ok(statement)
    }
}

impl std::ops::Deref for Conn {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

/// Connections that reconnect when PostgreSQL went away.
struct Pool {
    options: PgOptions,
    slots: Vec<Mutex<Option<Arc<Conn>>>>,
    next: AtomicUsize,
}

impl Pool {
    fn new(options: PgOptions, size: usize) -> Pool {
        Pool {
            options,
            slots: (0..size).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// A live connection, connecting a slot again when its connection
    /// closed.
    fn client(&self, rt: &Runtime) -> Result<Arc<Conn>, StoreError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[i].lock();
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        let options = self.options.clone();
        let client = Arc::new(Conn::new(
            rt.block(async move { connect(&options, "read").await })?,
        ));
        *slot = Some(client.clone());
        Ok(client)
    }
}

/// The engine (see the module's words).
pub(super) struct PgEngine {
    rt: Runtime,
    readers: Pool,
    /// The flusher's connection, for commits.
    writer: Mutex<Option<Arc<Conn>>>,
    options: PgOptions,
    /// The epoch this appliance holds the leader row with.
    epoch: i64,
    /// The signature it wrote into the row with it.
    signature: String,
    /// False once a renewal or a commit found the row taken, or the lease
    /// ran out unrenewed; never true again.
    leading: Arc<AtomicBool>,
    /// When the last renewal that succeeded was sent.
    renewed: Arc<Mutex<Instant>>,
    /// Whether PostgreSQL answers.
    answers: Arc<Answers>,
    /// What is committed, by key (see [`Committed`]).
    committed: Mutex<Committed>,
}

/// Values as PostgreSQL holds them, known without asking: while this
/// appliance holds the store it is the only writer (every commit is
/// fenced by its epoch), so what it committed is what PostgreSQL holds.
/// Commits enter their writes once PostgreSQL confirmed them, before
/// anyone is answered and before the writer stops reading them from its
/// own overlay of groups in flight; a reader that asked PostgreSQL keeps the answer
/// only when no commit ended while it asked, so an older value never
/// replaces a newer one. Emptied when a commit fails (the store stops).
#[derive(Default)]
struct Committed {
    known: Known,
    /// Commits ended so far (confirmed or failed).
    commits: u64,
}

/// Values by key. Bounded: past [`Known::MAX_BYTES`] it starts again
/// empty.
struct Known {
    /// By table position, then key.
    values: Vec<std::collections::HashMap<Vec<u8>, Option<Vec<u8>>>>,
    bytes: usize,
}

impl Default for Known {
    fn default() -> Known {
        Known {
            values: vec![Default::default(); Table::ALL.len()],
            bytes: 0,
        }
    }
}

impl Known {
    const MAX_BYTES: usize = 64 * 1024 * 1024;

    fn get(&self, table: Table, key: &[u8]) -> Option<&Option<Vec<u8>>> {
        self.values[table.position()].get(key)
    }

    fn clear(&mut self) {
        self.values.iter_mut().for_each(|t| t.clear());
        self.bytes = 0;
    }

    fn put(&mut self, table: Table, key: Vec<u8>, value: Option<Vec<u8>>) {
        let size = key.len() + value.as_ref().map_or(0, Vec::len) + 64;
        if self.bytes + size > Self::MAX_BYTES {
            self.clear();
        }
        self.bytes += size;
        self.values[table.position()].insert(key, value);
    }
}

impl PgEngine {
    /// Connects, creates the layout if the database has none, and takes
    /// the leader row. Refused while another appliance's lease runs.
    pub fn open(options: PgOptions) -> Result<PgEngine, StoreError> {
        let Some(key) = options.pair.clone() else {
            return Err(StoreError::Engine(format!(
                "the PostgreSQL store needs the key its appliances share, {} in the data directory: run `agentbay cluster init` on the first appliance and copy the file it writes to the same place on the others (owned by the account the appliance runs as, mode 0600)",
                super::datadir::PAIR_KEY_FILE
            )));
        };
        let rt = Runtime::new()?;
        let sent = Instant::now();
        let (writer, taken) = {
            let options = options.clone();
            rt.block(async move {
                let mut client = connect(&options, "write").await?;
                create_layout(&client).await?;
                let taken = take_leadership(&mut client, &options, &key).await?;
                Ok::<_, StoreError>((client, taken))
            })?
        };
        let (epoch, signature) = taken.map_err(|(active, untrusted)| StoreError::Standby {
            active: Box::new(active),
            untrusted,
        })?;
        let leading = Arc::new(AtomicBool::new(true));
        let engine = PgEngine {
            readers: Pool::new(options.clone(), READERS),
            rt,
            writer: Mutex::new(Some(Arc::new(Conn::new(writer)))),
            options,
            epoch,
            signature,
            leading,
            renewed: Arc::new(Mutex::new(sent)),
            answers: Arc::new(Answers::default()),
            committed: Mutex::new(Committed::default()),
        };
        engine.renew_in_background();
        tracing::info!(
            node = %engine.options.node,
            epoch,
            "store: on PostgreSQL, active with a new epoch"
        );
        Ok(engine)
    }

    /// Renews the lease a fifth of it apart, and soon again after a
    /// renewal failed; a renewal that finds the row taken stops further
    /// commits (they would fail their fence anyway).
    fn renew_in_background(&self) {
        let options = self.options.clone();
        let (epoch, leading, renewed) = (self.epoch, self.leading.clone(), self.renewed.clone());
        let (signature, answers) = (self.signature.clone(), self.answers.clone());
        let every = options.lease / 5;
        self.rt.handle().spawn(async move {
            let mut client: Option<Client> = None;
            let mut wait = every;
            while leading.load(Ordering::Acquire) {
                tokio::time::sleep(wait).await;
                wait = RENEW_RETRY.min(every);
                let sent = Instant::now();
                let attempt = async {
                    if client.as_ref().is_none_or(Client::is_closed) {
                        client = Some(connect(&options, "lease").await?);
                    }
                    let c = client.as_ref().expect("connected above");
                    // Only the row exactly as this appliance wrote it.
                    let renewed = c
                        .execute(
                            "UPDATE agentbay_leader SET expires_at = now() + make_interval(secs => $3)
                             WHERE id = 1 AND node = $1 AND epoch = $2
                               AND url = $4 AND fingerprint = $5 AND signature = $6",
                            &[
                                &options.node,
                                &epoch,
                                &options.lease.as_secs_f64(),
                                &options.advertise,
                                &options.fingerprint,
                                &signature,
                            ],
                        )
                        .await?;
                    let found = if renewed == 0 { Some(leader(c).await?) } else { None };
                    Ok::<_, StoreError>(found)
                };
                // A renewal that hangs is a renewal that failed.
                match tokio::time::timeout(every, attempt).await {
                    Ok(Ok(Some((found, signature)))) => {
                        let taken = options
                            .pair
                            .as_ref()
                            .is_some_and(|k| k.is_takeover(epoch, &found, &signature));
                        if taken {
                            tracing::error!(
                                epoch,
                                by = %found.node,
                                "store: another appliance of the pair took over the PostgreSQL store; this one no longer commits"
                            );
                        } else {
                            tracing::error!(
                                epoch,
                                node = %found.node,
                                found_epoch = found.epoch,
                                url = %found.url,
                                fingerprint = %found.fingerprint,
                                "store: the leader row was rewritten by someone other than this appliance (not a takeover its pair signed): this appliance stands down and no longer commits; check who holds the database's credentials"
                            );
                        }
                        leading.store(false, Ordering::Release);
                    }
                    Ok(Ok(None)) => {
                        *renewed.lock() = sent;
                        answers.answered();
                        wait = every;
                    }
                    Ok(Err(e)) => {
                        client = None;
                        if let StoreError::Unreachable(why) = &e {
                            answers.not_answering(why);
                        }
                        tracing::warn!(error = %e, "store: renewing the leader lease failed");
                    }
                    Err(_) => {
                        client = None;
                        answers.not_answering("renewing the leader lease timed out");
                        tracing::warn!("store: renewing the leader lease timed out");
                    }
                }
            }
        });
    }

    /// Whether this appliance may still commit: it holds the row, and its
    /// lease has not run out by its own clock (less the margin).
    fn check_leading(&self) -> Result<(), StoreError> {
        if !self.leading.load(Ordering::Acquire) {
            return Err(self.deposed());
        }
        let since = self.renewed.lock().elapsed();
        if since + self.options.margin() >= self.options.lease {
            self.leading.store(false, Ordering::Release);
            tracing::error!(
                epoch = self.epoch,
                unrenewed_ms = since.as_millis() as u64,
                "store: the leader lease could not be renewed in time; this appliance no longer commits"
            );
            return Err(self.deposed());
        }
        Ok(())
    }

    fn client(&self) -> Result<Arc<Conn>, StoreError> {
        self.readers.client(&self.rt)
    }

    /// How much longer this appliance keeps its role without a renewal.
    fn role_left(&self) -> Option<Duration> {
        self.leading.load(Ordering::Acquire).then(|| {
            self.options
                .lease
                .saturating_sub(self.options.margin())
                .saturating_sub(self.renewed.lock().elapsed())
        })
    }

    /// Runs `op` until PostgreSQL answers it (see the module's words):
    /// again, after a pause, while it does not answer and this appliance
    /// keeps its role; its answer, or its error once the role is lost.
    fn ride_out<T>(&self, mut op: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut pause = RETRY_FIRST;
        loop {
            match op() {
                Err(StoreError::Unreachable(why)) => {
                    self.answers.not_answering(&why);
                    if self.check_leading().is_err() {
                        return Err(StoreError::Unreachable(why));
                    }
                    self.rt.pause(pause);
                    pause = (pause * 2).min(RETRY_MAX);
                }
                answer => {
                    if answer.is_ok() {
                        self.answers.answered();
                    }
                    return answer;
                }
            }
        }
    }

    /// Fills an empty store in one transaction, all or nothing: `fill`
    /// hands every record to the sink it is given (a restore, a move from
    /// sled); an error from it leaves the database as it was.
    pub fn load(
        &self,
        fill: impl FnOnce(&mut Sink<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let loaded = self.load_in_one_transaction(fill);
        self.forget_committed();
        loaded
    }

    /// Forgets what readers knew of committed values: written around the
    /// writer (a fill, a bulk write), PostgreSQL is asked again.
    fn forget_committed(&self) {
        let mut committed = self.committed.lock();
        committed.commits += 1;
        committed.known.clear();
    }

    fn load_in_one_transaction(
        &self,
        fill: impl FnOnce(&mut Sink<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        if !self.is_empty()? {
            return Err(StoreError::Engine(format!(
                "the PostgreSQL store ({}) already holds records; only an empty one is filled",
                self.options.describe()
            )));
        }
        let client = self
            .writer
            .lock()
            .take()
            .ok_or_else(|| StoreError::Engine("the PostgreSQL connection is gone".into()))?;
        let run = |sql: &'static str| {
            let client = client.clone();
            self.rt
                .block(async move { Ok(client.batch_execute(sql).await?) })
        };
        run("BEGIN")?;
        let mut batch: Vec<(Table, Vec<u8>, Vec<u8>)> = Vec::new();
        let send = |batch: &mut Vec<(Table, Vec<u8>, Vec<u8>)>| -> Result<(), StoreError> {
            if batch.is_empty() {
                return Ok(());
            }
            let rows = std::mem::take(batch);
            let trees: Vec<&str> = rows.iter().map(|(t, _, _)| t.name()).collect();
            let keys: Vec<Vec<u8>> = rows.iter().map(|(_, k, _)| k.clone()).collect();
            let values: Vec<Vec<u8>> = rows.into_iter().map(|(_, _, v)| v).collect();
            let client = client.clone();
            self.rt.block(async move {
                client
                    .execute(
                        "INSERT INTO agentbay_kv (tree, key, value)
                         SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])",
                        &[&trees, &keys, &values],
                    )
                    .await?;
                Ok(())
            })
        };
        let filled = fill(&mut |table, key, value| {
            batch.push((table, key, value));
            if batch.len() >= 1000 {
                send(&mut batch)?;
            }
            Ok(())
        });
        let filled = filled.and_then(|()| send(&mut batch));
        match filled.and_then(|()| run("COMMIT")) {
            Ok(()) => {
                *self.writer.lock() = Some(client);
                Ok(())
            }
            Err(e) => {
                let _ = run("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Whether the database holds no record yet (a new store).
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        let client = self.client()?;
        self.rt.block(async move {
            let row = client
                .query_one(
                    "SELECT NOT EXISTS (SELECT 1 FROM agentbay_kv ORDER BY tree, key LIMIT 1)",
                    &[],
                )
                .await?;
            Ok(row.get(0))
        })
    }

    /// One page of `table` between the bounds, ascending or not.
    fn page(
        &self,
        table: Table,
        lo: &Bound<Vec<u8>>,
        hi: &Bound<Vec<u8>>,
        ascending: bool,
        limit: i64,
    ) -> Result<Vec<Pair>, StoreError> {
        let mut sql = String::from("SELECT key, value FROM agentbay_kv WHERE tree = $1");
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for (bound, below, at_or_below) in [(lo, ">", ">="), (hi, "<", "<=")] {
            let (op, key) = match bound {
                Bound::Included(k) => (at_or_below, k),
                Bound::Excluded(k) => (below, k),
                Bound::Unbounded => continue,
            };
            keys.push(key.clone());
            sql.push_str(&format!(" AND key {op} ${}", keys.len() + 1));
        }
        sql.push_str(if ascending {
            " ORDER BY key ASC"
        } else {
            " ORDER BY key DESC"
        });
        sql.push_str(&format!(" LIMIT {limit}"));
        let name = table.name();
        let (sql, keys) = (Arc::new(sql), Arc::new(keys));
        self.ride_out(|| {
            let client = self.client()?;
            let (sql, keys) = (sql.clone(), keys.clone());
            self.rt.block(async move {
                let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&name];
                for k in keys.iter() {
                    params.push(k);
                }
                let statement = client.prepared(&sql).await?;
                let rows = client.query(&statement, &params).await?;
                Ok(rows
                    .into_iter()
                    .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
                    .collect())
            })
        })
    }

    /// Commits `writes` in one transaction, fenced by the epoch, riding
    /// out a restart of PostgreSQL (see the module's words).
    fn commit(
        &self,
        writes: BTreeMap<(Table, Vec<u8>), Option<Vec<u8>>>,
    ) -> Result<(), StoreError> {
        let mut upsert = Upserts::default();
        let mut delete = Deletes::default();
        for ((table, key), value) in writes {
            match value {
                Some(v) => {
                    upsert.0.push(table.name());
                    upsert.1.push(key);
                    upsert.2.push(v);
                }
                None => {
                    delete.0.push(table.name());
                    delete.1.push(key);
                }
            }
        }
        let (upsert, delete) = (Arc::new(upsert), Arc::new(delete));
        self.ride_out(|| self.commit_once(upsert.clone(), delete.clone()))
    }

    /// One try of [`PgEngine::commit`].
    fn commit_once(&self, upsert: Arc<Upserts>, delete: Arc<Deletes>) -> Result<(), StoreError> {
        self.check_leading()?;
        let mut guard = self.writer.lock();
        let client = match guard.take().filter(|c| !c.is_closed()) {
            Some(c) => c,
            None => {
                let options = self.options.clone();
                Arc::new(Conn::new(
                    self.rt
                        .block(async move { connect(&options, "write").await })?,
                ))
            }
        };
        let (node, epoch) = (self.options.node.clone(), self.epoch);
        let conn = client.clone();
        let outcome = self.rt.block(async move {
            let client = conn;
            let outcome = async {
                let fence = client.prepared(FENCE).await?;
                let upsert_sql = client.prepared(UPSERT).await?;
                let delete_sql = client.prepared(DELETE).await?;
                // One round trip for the transaction's statements, and one
                // for its end: they are sent together, and the fence is
                // looked at before COMMIT or ROLLBACK is.
                let begin = client.batch_execute("BEGIN");
                let fence_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&node, &epoch];
                let fenced = client.query(&fence, &fence_params);
                let upserted = async {
                    if upsert.0.is_empty() {
                        return Ok(0);
                    }
                    client
                        .execute(&upsert_sql, &[&upsert.0, &upsert.1, &upsert.2])
                        .await
                };
                let deleted = async {
                    if delete.0.is_empty() {
                        return Ok(0);
                    }
                    client.execute(&delete_sql, &[&delete.0, &delete.1]).await
                };
                let ((), fenced, _, _) = futures::try_join!(begin, fenced, upserted, deleted)?;
                if fenced.is_empty() {
                    client.batch_execute("ROLLBACK").await?;
                    return Ok(false);
                }
                client.batch_execute("COMMIT").await?;
                Ok::<_, tokio_postgres::Error>(true)
            }
            .await;
            Ok(outcome)
        })?;
        match outcome {
            Ok(true) => {
                *guard = Some(client);
                Ok(())
            }
            Ok(false) => {
                self.leading.store(false, Ordering::Release);
                Err(self.deposed())
            }
            // The connection is dropped: a transaction left open on it ends
            // with it.
            Err(e) => Err(e.into()),
        }
    }

    fn deposed(&self) -> StoreError {
        StoreError::Engine(format!(
            "this appliance no longer holds the PostgreSQL store with epoch {}: another appliance took over, or the lease ran out unrenewed",
            self.epoch
        ))
    }

    /// One write outside the group commit.
    fn write_one(&self, table: Table, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        let client = self.client()?;
        let (name, key, value) = (table.name(), key.to_vec(), value.map(<[u8]>::to_vec));
        let written = self.rt.block(async move {
            match value {
                Some(v) => {
                    client
                        .execute(
                            "INSERT INTO agentbay_kv (tree, key, value) VALUES ($1, $2, $3)
                             ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value",
                            &[&name, &key, &v],
                        )
                        .await?
                }
                None => {
                    client
                        .execute(
                            "DELETE FROM agentbay_kv WHERE tree = $1 AND key = $2",
                            &[&name, &key],
                        )
                        .await?
                }
            };
            Ok(())
        });
        self.forget_committed();
        written
    }
}

/// Creates the tables if the database has none, and checks the layout.
async fn create_layout(client: &Client) -> Result<(), StoreError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS agentbay_layout (
                 id int PRIMARY KEY CHECK (id = 1),
                 version int NOT NULL);
             CREATE TABLE IF NOT EXISTS agentbay_kv (
                 tree text COLLATE \"C\" NOT NULL,
                 key bytea NOT NULL,
                 value bytea NOT NULL,
                 PRIMARY KEY (tree, key)) WITH (fillfactor = 80);
             CREATE TABLE IF NOT EXISTS agentbay_leader (
                 id int PRIMARY KEY,
                 node text NOT NULL,
                 url text NOT NULL,
                 fingerprint text NOT NULL,
                 epoch bigint NOT NULL,
                 expires_at timestamptz NOT NULL,
                 signature text NOT NULL DEFAULT '');
             INSERT INTO agentbay_leader (id, node, url, fingerprint, epoch, expires_at)
                 VALUES (1, '', '', '', 0, '-infinity') ON CONFLICT DO NOTHING;",
        )
        .await?;
    client
        .execute(
            "INSERT INTO agentbay_layout VALUES (1, $1) ON CONFLICT DO NOTHING",
            &[&LAYOUT],
        )
        .await?;
    let found: i32 = client
        .query_one("SELECT version FROM agentbay_layout WHERE id = 1", &[])
        .await?
        .get(0);
    if found > LAYOUT {
        return Err(StoreError::Engine(format!(
            "the PostgreSQL store's layout is version {found}, newer than this agentbay's ({LAYOUT})"
        )));
    }
    if found < 2 {
        // Layout 1 → 2: the leader row is signed. An unsigned row is
        // believed by no appliance of this version; it is taken once free.
        client
            .batch_execute(
                "ALTER TABLE agentbay_leader ADD COLUMN IF NOT EXISTS signature text NOT NULL DEFAULT '';
                 UPDATE agentbay_layout SET version = 2 WHERE id = 1 AND version < 2;",
            )
            .await?;
    }
    Ok(())
}

/// Takes the leader row with a new epoch if it is free, expired or this
/// node's own (its name and its address: a restart takes it back at once,
/// a second appliance given the same name by mistake does not), signed
/// with the pair key: `Ok` is the epoch and the signature. `Err` names the
/// appliance whose lease runs, and why its row is not to be believed, if
/// it is not.
async fn take_leadership(
    client: &mut Client,
    options: &PgOptions,
    key: &PairKey,
) -> Result<Result<(i64, String), (Node, Option<Untrusted>)>, StoreError> {
    let tx = client.transaction().await?;
    let row = tx
        .query_one(
            "SELECT epoch, (expires_at < now() OR node = '' OR (node = $1 AND url = $2))
             FROM agentbay_leader WHERE id = 1 FOR UPDATE",
            &[&options.node, &options.advertise],
        )
        .await?;
    let (epoch, free): (i64, bool) = (row.get(0), row.get(1));
    if !free {
        tx.rollback().await?;
        let (active, signature) = leader(client).await?;
        let untrusted = key.check_leader(&active, &signature).err();
        return Ok(Err((active, untrusted)));
    }
    let mine = Node {
        node: options.node.clone(),
        url: options.advertise.clone(),
        fingerprint: options.fingerprint.clone(),
        epoch: epoch + 1,
    };
    let signature = key.sign_leader(&mine);
    tx.execute(
        "UPDATE agentbay_leader
         SET node = $1, url = $2, fingerprint = $3, epoch = $4, signature = $5,
             expires_at = now() + make_interval(secs => $6)
         WHERE id = 1",
        &[
            &mine.node,
            &mine.url,
            &mine.fingerprint,
            &mine.epoch,
            &signature,
            &options.lease.as_secs_f64(),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(Ok((mine.epoch, signature)))
}

/// The appliance the leader row names, and the row's signature.
async fn leader(client: &Client) -> Result<(Node, String), StoreError> {
    let row = client
        .query_one(
            "SELECT node, url, fingerprint, epoch, signature FROM agentbay_leader WHERE id = 1",
            &[],
        )
        .await?;
    Ok((
        Node {
            node: row.get(0),
            url: row.get(1),
            fingerprint: row.get(2),
            epoch: row.get(3),
        },
        row.get(4),
    ))
}

impl PgEngine {
    /// A point read, from what is known as committed or else from
    /// PostgreSQL. A reader keeps PostgreSQL's answer only when no commit
    /// ended while it asked; the writer always does, since no group in
    /// flight writes a key it reads beneath its overlay.
    fn read_through(
        &self,
        table: Table,
        key: &[u8],
        writer: bool,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        // Only while this appliance holds the store is what it committed
        // the last word; once it lost the store, PostgreSQL is asked.
        let leading = self.check_leading().is_ok();
        let commits = {
            let committed = self.committed.lock();
            if leading && let Some(known) = committed.known.get(table, key) {
                return Ok(known.clone());
            }
            committed.commits
        };
        let name = table.name();
        let value = self.ride_out(|| {
            let client = self.client()?;
            let owned = key.to_vec();
            self.rt.block(async move {
                let statement = client
                    .prepared("SELECT value FROM agentbay_kv WHERE tree = $1 AND key = $2")
                    .await?;
                let row = client.query_opt(&statement, &[&name, &owned]).await?;
                Ok(row.map(|r| r.get::<_, Vec<u8>>(0)))
            })
        })?;
        let mut committed = self.committed.lock();
        if leading && (writer || committed.commits == commits) {
            committed.known.put(table, key.to_vec(), value.clone());
        }
        Ok(value)
    }
}

impl KvRead for PgEngine {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.read_through(table, key, false)
    }

    fn range(&self, table: Table, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Rows<'_> {
        Box::new(Scan {
            engine: self,
            table,
            lo: start.map(<[u8]>::to_vec),
            hi: end.map(<[u8]>::to_vec),
            front: VecDeque::new(),
            back: VecDeque::new(),
            done: false,
            page: FIRST_PAGE,
        })
    }
}

/// A scan in pages from either end. `lo..hi` is what no page has read
/// yet; `front` holds keys below it ascending, `back` keys above it
/// descending.
struct Scan<'a> {
    engine: &'a PgEngine,
    table: Table,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    front: VecDeque<Pair>,
    back: VecDeque<Pair>,
    /// Nothing is left between `lo` and `hi`.
    done: bool,
    page: i64,
}

impl Scan<'_> {
    /// Reads the next page from one end; `Ok(false)` when none is left.
    fn fill(&mut self, ascending: bool) -> Result<bool, StoreError> {
        if self.done {
            return Ok(false);
        }
        let rows = self
            .engine
            .page(self.table, &self.lo, &self.hi, ascending, self.page)?;
        if (rows.len() as i64) < self.page {
            self.done = true;
        }
        self.page = (self.page * 4).min(MAX_PAGE);
        let Some((last, _)) = rows.last() else {
            return Ok(false);
        };
        if ascending {
            self.lo = Bound::Excluded(last.clone());
            self.front.extend(rows);
        } else {
            self.hi = Bound::Excluded(last.clone());
            self.back.extend(rows);
        }
        Ok(true)
    }
}

impl Iterator for Scan<'_> {
    type Item = Result<Pair, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.front.is_empty() {
            match self.fill(true) {
                Ok(true) => {}
                Ok(false) => return self.back.pop_back().map(Ok),
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        self.front.pop_front().map(Ok)
    }
}

impl DoubleEndedIterator for Scan<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.back.is_empty() {
            match self.fill(false) {
                Ok(true) => {}
                Ok(false) => return self.front.pop_back().map(Ok),
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        self.back.pop_front().map(Ok)
    }
}

/// However it ends (a clean stop, a failed start, a command that only
/// moved or restored the store), an engine that still holds the store gives
/// it up, so that another appliance need not wait for the lease.
impl Drop for PgEngine {
    fn drop(&mut self) {
        self.release();
    }
}

impl KvBulk for PgEngine {
    fn put(&self, table: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.write_one(table, key, Some(value))
    }

    fn remove(&self, table: Table, key: &[u8]) -> Result<(), StoreError> {
        self.write_one(table, key, None)
    }

    /// Each write committed on its own.
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl KvEngine for PgEngine {
    fn reader(&self) -> &dyn KvRead {
        self
    }

    fn visible_when_durable(&self) -> bool {
        true
    }

    fn writer_get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.read_through(table, key, true)
    }

    /// Nothing is readable before its commit: the writer reads the group
    /// from its overlay until then.
    fn apply(&self, _number: u64, writes: Writes) -> Result<Option<Arc<Writes>>, StoreError> {
        Ok(Some(Arc::new(writes)))
    }

    fn make_durable(&self, pending: &[Arc<Writes>]) -> Result<(), StoreError> {
        let mut merged = BTreeMap::new();
        for writes in pending {
            for (position, key, value) in writes.iter() {
                merged.insert((Table::ALL[position], key.to_vec()), value.clone());
            }
        }
        if merged.is_empty() {
            return Ok(());
        }
        let outcome = self.commit(merged);
        let mut committed = self.committed.lock();
        committed.commits += 1;
        match &outcome {
            Ok(()) => {
                for writes in pending {
                    for (position, key, value) in writes.iter() {
                        committed
                            .known
                            .put(Table::ALL[position], key.to_vec(), value.clone());
                    }
                }
            }
            Err(_) => {
                // The store stops; nothing it knew is to be trusted.
                committed.known.clear();
            }
        }
        outcome
    }

    fn health(&self) -> Result<(), String> {
        self.check_leading().map_err(|e| e.to_string())
    }

    fn reach(&self) -> Reach {
        Reach {
            role_left: self.role_left(),
            ..self.answers.seen.lock().clone()
        }
    }

    fn leadership(&self) -> Option<Node> {
        Some(Node {
            node: self.options.node.clone(),
            url: self.options.advertise.clone(),
            fingerprint: self.options.fingerprint.clone(),
            epoch: self.epoch,
        })
    }

    /// Ends the lease at once, so that a standby takes over without
    /// waiting for it to run out.
    fn release(&self) {
        if !self.leading.swap(false, Ordering::AcqRel) {
            return;
        }
        let Some(client) = self.writer.lock().clone().filter(|c| !c.is_closed()) else {
            return;
        };
        let (node, epoch) = (self.options.node.clone(), self.epoch);
        // Briefly: a store that cannot reach PostgreSQL lets the lease run
        // out instead.
        let released = self.rt.block_within(Duration::from_secs(2), async move {
            Ok(client
                .execute(
                    "UPDATE agentbay_leader SET expires_at = '-infinity'
                     WHERE id = 1 AND node = $1 AND epoch = $2",
                    &[&node, &epoch],
                )
                .await?)
        });
        if let Err(e) = released {
            tracing::warn!(error = %e, "store: the leader lease was not released; a standby waits for it to run out");
        }
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        let client = self.client()?;
        self.rt.block(async move {
            let row = client
                .query_one("SELECT pg_total_relation_size('agentbay_kv')", &[])
                .await?;
            Ok(row.get::<_, i64>(0).max(0) as u64)
        })
    }

    #[cfg(test)]
    fn damage(&self, table: Table, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        self.write_one(table, key, value)
    }
}
