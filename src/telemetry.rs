//! Logs and metrics.
//!
//! Logs go to stderr: human-readable on a terminal, one JSON object per line
//! otherwise (journald, files, collectors). With `log.dir` they go to a
//! file a day there instead (the Windows service's standard error goes
//! nowhere). Secrets never reach them: client
//! secrets and tokens are not logged anywhere, and request logs carry the
//! route, not the headers.
//!
//! Metrics are Prometheus text at `/metrics`, named after the
//! specifications' metrics with dots as underscores
//! (`connectsoft.factory.capacity.leases_active` ->
//! `connectsoft_factory_capacity_leases_active`).
//!
//! Traces leave the appliance only when `telemetry.otlp_endpoint` names
//! the site's collector: spans go there over OTLP HTTP/protobuf through a
//! batch exporter whose queue is bounded (`telemetry.otlp_queue_spans`;
//! while the collector is away newer spans are dropped, never held). They
//! are the builtin loop's GenAI spans (`invoke_agent` per attempt, `chat`
//! per model call, `execute_tool` per tool call, with the OpenTelemetry
//! GenAI conventions' attributes, `run.id`, `attempt.id` and
//! `checkpoint.sequence`) and one `request` span per API request. Content
//! is never put on a span.

use std::io::IsTerminal;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogConfig, LogFormat, TelemetryConfig};

/// Changes the level of the installed subscriber (a reload of
/// `log.level`); refuses a level that does not parse.
pub fn set_log_level(level: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
    if let Some(handle) = FILTER.get() {
        handle.reload(filter).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The reload handle of the installed subscriber's level.
static FILTER: OnceLock<
    tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>,
> = OnceLock::new();

/// Installs the global subscriber: logs, and traces to the site's
/// collector when one is configured. Later calls do nothing. Refuses a
/// `log.dir` it cannot write, naming it and the reason.
pub fn init_logging(config: &LogConfig, telemetry: &TelemetryConfig) -> Result<(), String> {
    let filter = EnvFilter::try_new(&config.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    // A file a day in `log.dir`, standard error without one.
    let writer = match &config.dir {
        Some(dir) => BoxMakeWriter::new(daily_files(dir, config.keep_files)?),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let json = match config.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => config.dir.is_some() || !std::io::stderr().is_terminal(),
    };
    let traces = otlp_layer(telemetry);
    let registry = tracing_subscriber::registry().with(filter).with(traces);
    let result = if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false)
                    .with_writer(writer),
            )
            .try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_target(false)
                    .with_ansi(config.dir.is_none())
                    .with_writer(writer),
            )
            .try_init()
    };
    // A second appliance in one process (tests) keeps the first subscriber.
    if result.is_ok() {
        let _ = FILTER.set(handle);
    }
    Ok(())
}

/// `agentbay.YYYY-MM-DD.log` in `dir`, a new one each UTC day, the newest
/// `keep` kept. A directory the appliance makes is private to the
/// service's account on Unix (0750); one that exists keeps the mode the
/// site gave it. The day's file is opened, so that an unwritable directory
/// is refused at start rather than losing the log.
fn daily_files(
    dir: &std::path::Path,
    keep: u32,
) -> Result<tracing_appender::rolling::RollingFileAppender, String> {
    let refuse = |e: &dyn std::fmt::Display| format!("log.dir {}: {e}", dir.display());
    if !dir.is_dir() {
        let mut make = std::fs::DirBuilder::new();
        make.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut make, 0o750);
        make.create(dir).map_err(|e| refuse(&e))?;
    }
    tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("agentbay")
        .filename_suffix("log")
        .max_log_files(keep as usize)
        .build(dir)
        .map_err(|e| refuse(&e))
}

/// The tracer provider exporting to the collector, when one is configured.
static TRACES: OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> = OnceLock::new();

/// The layer that turns spans into OTLP spans for the collector, when
/// `telemetry.otlp_endpoint` is set.
fn otlp_layer<S>(config: &TelemetryConfig) -> Option<impl tracing_subscriber::Layer<S>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor};
    let url = config.traces_url()?;
    let timeout = std::time::Duration::from_secs(config.otlp_timeout_seconds);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        eprintln!("telemetry.otlp_endpoint: traces are exported from the appliance's runtime only");
        return None;
    };
    crate::tls::install_crypto_provider();
    let client = match reqwest::Client::builder().timeout(timeout).build() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("telemetry.otlp_endpoint: no HTTP client for the collector: {e}");
            return None;
        }
    };
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Collector { client, runtime })
        .with_endpoint(url.clone())
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_timeout(timeout)
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("telemetry.otlp_endpoint {url}: {e}");
            return None;
        }
    };
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(config.otlp_queue_spans as usize)
                .with_scheduled_delay(std::time::Duration::from_secs(1))
                .build(),
        )
        .build();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(batch)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("agentbay");
    let _ = TRACES.set(provider);
    Some(tracing_opentelemetry::layer().with_tracer(tracer))
}

/// Exports what the batch exporter still holds (at shutdown).
pub fn flush_traces() {
    if let Some(provider) = TRACES.get()
        && let Err(e) = provider.force_flush()
    {
        tracing::warn!(error = %e, "exporting the last spans to the collector");
    }
}

/// The collector's HTTP client: the appliance's reqwest with rustls (ring),
/// so an `https` collector works as a plain one does. The batch exporter
/// runs on a thread of its own; the request runs on the appliance's tokio
/// runtime.
#[derive(Debug)]
struct Collector {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Collector {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let response = client
                .request(parts.method, parts.uri.to_string())
                .headers(parts.headers)
                .body(body)
                .send()
                .await?;
            let mut out = opentelemetry_http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                out = out.header(name, value);
            }
            Ok::<_, opentelemetry_http::HttpError>(out.body(response.bytes().await?)?)
        });
        sent.await?
    }
}

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 300.0,
                ])
                .expect("static buckets are valid")
                .build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder is installed, which agentbay
            // never does; the handle then renders an empty page.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

/// A gauge read off the appliance's state at scrape time (queues, waiting
/// decisions, Uncertain calls, disks, workers, webhooks): a series is
/// present while what it measures exists and absent once it is gone, so
/// no stale value outlives its queue or its tenant's last decision.
#[derive(Clone, Debug)]
pub struct Gauge {
    name: &'static str,
    help: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Gauge {
    /// An empty gauge family.
    pub fn new(name: &'static str, help: &'static str) -> Gauge {
        Gauge {
            name,
            help,
            samples: Vec::new(),
        }
    }

    /// Adds one series.
    pub fn set(&mut self, labels: &[(&'static str, &str)], value: f64) -> &mut Gauge {
        self.samples.push((
            labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            value,
        ));
        self
    }

    /// The series' values, for tests.
    pub fn samples(&self) -> &[(Vec<(&'static str, String)>, f64)] {
        &self.samples
    }

    /// Appends the family in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        if self.samples.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} gauge", self.name);
        for (labels, value) in &self.samples {
            out.push_str(self.name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let v = v
                        .replace('\\', "\\\\")
                        .replace('"', "\\\"")
                        .replace('\n', "\\n");
                    let _ = write!(out, "{k}=\"{v}\"");
                }
                out.push('}');
            }
            let _ = writeln!(out, " {value}");
        }
    }
}

/// Metric names used by the appliance itself.
pub mod names {
    /// HTTP and RPC requests by route and status.
    pub const HTTP_REQUESTS: &str = "agentbay_http_requests_total";
    /// Connections closed at accept because `http.max_connections` was reached.
    pub const HTTP_CONNECTIONS_REFUSED: &str = "agentbay_http_connections_refused_total";
    /// Request latency by route.
    pub const HTTP_LATENCY: &str = "agentbay_http_request_duration_seconds";
    /// Durable commits of the store.
    pub const STORE_COMMITS: &str = "agentbay_store_commits_total";
    /// Flush-and-sync rounds of the store.
    pub const STORE_FLUSHES: &str = "agentbay_store_flushes_total";
    /// Bytes the store occupies on disk.
    pub const STORE_DISK_BYTES: &str = "agentbay_store_disk_bytes";
    /// Reopens of the store that wrote a fresh page-table snapshot.
    pub const STORE_REOPENS: &str = "agentbay_store_reopens_total";
    /// Times the store's database (PostgreSQL) stopped answering and the
    /// store waited for it.
    pub const STORE_OUTAGES: &str = "agentbay_store_outages_total";
    /// Seconds the store's database has not answered (0 while it does).
    pub const STORE_UNANSWERED_SECONDS: &str = "agentbay_store_unanswered_seconds";
    /// How long the last reopen paused the store.
    pub const STORE_REOPEN_SECONDS: &str = "agentbay_store_reopen_seconds";
    /// Writes of an aggregate refused because they were derived from an
    /// older version than the stored one (table).
    pub const STORE_STALE_WRITES: &str = "agentbay_store_stale_writes_total";
    /// Records and artifacts the Purger deleted or tombstoned (`what`).
    pub const PURGED: &str = "agentbay_purge_records_total";
    /// Items due for purge that the last Purger pass left (0: caught up).
    pub const PURGE_BACKLOG: &str = "agentbay_purge_backlog";
    /// Seconds since the last verified scheduled backup.
    pub const BACKUP_AGE: &str = "agentbay_backup_age_seconds";
    /// Scheduled backups that failed.
    pub const BACKUP_FAILURES: &str = "agentbay_backup_failures_total";
    /// Tokens issued.
    pub const TOKENS_ISSUED: &str = "agentbay_auth_tokens_issued_total";
    /// Failed authentications.
    pub const AUTH_FAILURES: &str = "agentbay_auth_failures_total";
    /// Secret checks slowed or refused by the throttle, by key (`name`,
    /// `source`, `busy`).
    pub const AUTH_THROTTLED: &str = "agentbay_auth_throttled_total";
    /// `connectsoft.factory.capacity.pool_utilisation` (gauge; poolId, kind).
    pub const POOL_UTILISATION: &str = "connectsoft_factory_capacity_pool_utilisation";
    /// `connectsoft.factory.capacity.leases_active` (updown; tenant, holderKind).
    pub const LEASES_ACTIVE: &str = "connectsoft_factory_capacity_leases_active";
    /// `connectsoft.factory.capacity.lease_wait` (histogram, s; tenant, holderKind).
    pub const LEASE_WAIT: &str = "connectsoft_factory_capacity_lease_wait";
    /// `connectsoft.factory.capacity.quota_denials` (counter; tenant, limit).
    pub const QUOTA_DENIALS: &str = "connectsoft_factory_capacity_quota_denials";
    /// `connectsoft.factory.runtime.release_load_rejected` (counter; tenant, reason).
    pub const RELEASE_LOAD_REJECTED: &str = "connectsoft_factory_runtime_release_load_rejected";
    /// Pool counters found different from their leases and repaired.
    pub const ACCOUNTING_REPAIRS: &str = "agentbay_capacity_accounting_repairs_total";
    /// `connectsoft.factory.runtime.attempts_active` (updown; tenant, state).
    pub const ATTEMPTS_ACTIVE: &str = "connectsoft_factory_runtime_attempts_active";
    /// `connectsoft.factory.runtime.attempt_duration` (histogram, s; tenant, agent, outcome).
    pub const ATTEMPT_DURATION: &str = "connectsoft_factory_runtime_attempt_duration";
    /// `connectsoft.factory.runtime.calls` (counter; tenant, kind, status).
    pub const CALLS: &str = "connectsoft_factory_runtime_calls";
    /// `connectsoft.factory.runtime.corrections` (counter; tenant, agent).
    pub const CORRECTIONS: &str = "connectsoft_factory_runtime_corrections";
    /// `connectsoft.factory.runtime.checkpoints_written` (counter; tenant).
    pub const CHECKPOINTS_WRITTEN: &str = "connectsoft_factory_runtime_checkpoints_written";
    /// `connectsoft.factory.runtime.decisions_waiting` (updown; tenant, kind).
    pub const DECISIONS_WAITING: &str = "connectsoft_factory_runtime_decisions_waiting";
    /// `connectsoft.factory.runtime.uncertain_outcomes` (counter; tenant).
    pub const UNCERTAIN_OUTCOMES: &str = "connectsoft_factory_runtime_uncertain_outcomes";
    /// Tool processes started, by the mechanism that bound them.
    pub const TOOL_PROCESSES: &str = "agentbay_tool_processes_total";
    /// Tool process trees ended by a limit, by reason (oom, pids, timeout).
    pub const TOOL_KILLS: &str = "agentbay_tool_kills_total";
    /// Model tokens charged, by tenant, agent and kind (input, output,
    /// cached), as the model servers counted them.
    pub const MODEL_TOKENS: &str = "agentbay_model_tokens_total";
    /// Model calls in flight at a site model server (and turns given).
    pub const MODEL_SERVER_IN_FLIGHT: &str = "agentbay_model_server_in_flight";
    /// Attempts queued for a site model server.
    pub const MODEL_SERVER_QUEUED: &str = "agentbay_model_server_queued";
    /// How long the oldest attempt queued for a server has waited.
    pub const MODEL_SERVER_OLDEST_WAIT: &str = "agentbay_model_server_oldest_wait_seconds";
    /// Tokens of the calls a site model server answered.
    pub const MODEL_SERVER_TOKENS: &str = "agentbay_model_server_tokens_total";
    /// Whether a site model server answers (0 while it is down).
    pub const MODEL_SERVER_UP: &str = "agentbay_model_server_up";
    /// Calls to a site model server by outcome.
    pub const MODEL_SERVER_CALLS: &str = "agentbay_model_server_calls_total";
    /// Model call latency (histogram, s; tenant, agent).
    pub const MODEL_CALL_SECONDS: &str = "agentbay_model_call_seconds";
    /// Lease requests waiting in a pool's queue (pool, limit).
    pub const QUEUE_DEPTH: &str = "agentbay_capacity_queue_depth";
    /// Seconds the oldest waiting lease request has waited (pool, limit).
    pub const QUEUE_OLDEST_WAIT: &str = "agentbay_capacity_queue_oldest_wait_seconds";
    /// Seconds until a tenant's soonest waiting decision expires (tenant).
    pub const DECISION_NEXT_EXPIRY: &str = "agentbay_decision_next_expiry_seconds";
    /// Uncertain calls awaiting an operator's settlement (tenant).
    pub const UNCERTAIN_CALLS: &str = "agentbay_uncertain_calls";
    /// Age of the oldest Uncertain call awaiting settlement (tenant).
    pub const UNCERTAIN_CALL_OLDEST: &str = "agentbay_uncertain_call_oldest_seconds";
    /// Whether scheduled backups are on (1) or off (0).
    pub const BACKUP_ENABLED: &str = "agentbay_backup_enabled";
    /// Seconds between scheduled backups.
    pub const BACKUP_INTERVAL: &str = "agentbay_backup_interval_seconds";
    /// When the last verified backup was taken (or the appliance started,
    /// when none was taken since), Unix seconds.
    pub const BACKUP_LAST_SUCCESS: &str = "agentbay_backup_last_success_timestamp_seconds";
    /// 1: the last scheduled backup was written and verified; 0: it failed.
    pub const BACKUP_LAST_RESULT: &str = "agentbay_backup_last_result";
    /// Free bytes of the file system of a volume (`data`, `backups`).
    pub const DISK_FREE: &str = "agentbay_disk_free_bytes";
    /// Size in bytes of the file system of a volume (`data`, `backups`).
    pub const DISK_SIZE: &str = "agentbay_disk_size_bytes";
    /// Failed passes of a background worker (worker).
    pub const WORKER_FAILURES: &str = "agentbay_worker_failures_total";
    /// Failed passes in a row of a worker now (worker).
    pub const WORKER_CONSECUTIVE_FAILURES: &str = "agentbay_worker_consecutive_failures";
    /// Seconds a worker's next pass is past its due time (worker).
    pub const WORKER_LAG: &str = "agentbay_worker_lag_seconds";
    /// When a worker's last successful pass ended, Unix seconds (worker).
    pub const WORKER_LAST_SUCCESS: &str = "agentbay_worker_last_success_timestamp_seconds";
    /// Webhook delivery tries by outcome (delivered, retry, gave_up).
    pub const WEBHOOK_DELIVERIES: &str = "agentbay_webhook_deliveries_total";
    /// Tries of decision mails by outcome (sent, retry, gave_up).
    pub const NOTIFY_MAILS: &str = "agentbay_notify_mails_total";
    /// Webhook deliveries not yet delivered nor given up.
    pub const WEBHOOK_PENDING: &str = "agentbay_webhook_pending";
    /// Age of the oldest pending webhook delivery, in seconds.
    pub const WEBHOOK_OLDEST_PENDING: &str = "agentbay_webhook_oldest_pending_seconds";
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        names::HTTP_REQUESTS,
        "HTTP and RPC requests by route and status"
    );
    describe_counter!(
        names::HTTP_CONNECTIONS_REFUSED,
        "Connections closed at accept because http.max_connections was reached"
    );
    describe_histogram!(
        names::HTTP_LATENCY,
        metrics::Unit::Seconds,
        "Request latency by route"
    );
    describe_counter!(
        names::STORE_COMMITS,
        "Transactions made durable by the store"
    );
    describe_counter!(names::STORE_FLUSHES, "Group-commit flush-and-sync rounds");
    describe_gauge!(
        names::STORE_DISK_BYTES,
        metrics::Unit::Bytes,
        "Size of the store on disk"
    );
    describe_counter!(
        names::STORE_OUTAGES,
        "Times the store's database (PostgreSQL) stopped answering and the store waited for it"
    );
    describe_gauge!(
        names::STORE_UNANSWERED_SECONDS,
        metrics::Unit::Seconds,
        "Seconds the store's database has not answered (0 while it does)"
    );
    describe_counter!(
        names::STORE_REOPENS,
        "Reopens of the store after store.snapshot_every_mb written, so that a restart replays little"
    );
    describe_histogram!(
        names::STORE_REOPEN_SECONDS,
        metrics::Unit::Seconds,
        "How long a reopen of the store paused reads and writes"
    );
    describe_counter!(
        names::STORE_STALE_WRITES,
        "Aggregate writes refused as derived from an older version than the stored one"
    );
    describe_counter!(names::TOKENS_ISSUED, "Access tokens issued");
    describe_counter!(names::AUTH_FAILURES, "Failed authentications by reason");
    describe_counter!(
        names::AUTH_THROTTLED,
        "Secret checks delayed or refused by the throttle, by key"
    );
    describe_gauge!(
        names::MODEL_SERVER_IN_FLIGHT,
        "Model calls in flight at a site model server, with turns given and not yet taken, by server"
    );
    describe_gauge!(
        names::MODEL_SERVER_QUEUED,
        "Attempts whose next model call waits for a site model server at its limits, by server"
    );
    describe_gauge!(
        names::MODEL_SERVER_OLDEST_WAIT,
        metrics::Unit::Seconds,
        "How long the oldest attempt queued for a site model server has waited, by server"
    );
    describe_counter!(
        names::MODEL_SERVER_TOKENS,
        "Tokens (input and output) of the calls a site model server answered, by server"
    );
    describe_gauge!(
        names::MODEL_SERVER_UP,
        "1 while a site model server answers, 0 while every server of its profile is down and calls to it wait, by server"
    );
    describe_counter!(
        names::MODEL_SERVER_CALLS,
        "Calls to a site model server by outcome: answered, moved (to a fallback), failed, refused"
    );
    describe_counter!(
        names::MODEL_TOKENS,
        "Model tokens charged by tenant, agent and kind (input, output, cached)"
    );
    describe_histogram!(
        names::MODEL_CALL_SECONDS,
        metrics::Unit::Seconds,
        "Model call latency by tenant and agent"
    );
    describe_gauge!(names::POOL_UTILISATION, "Pool utilisation (0 to 1)");
    describe_gauge!(names::LEASES_ACTIVE, "Capacity leases holding capacity");
    describe_histogram!(
        names::LEASE_WAIT,
        metrics::Unit::Seconds,
        "Time from lease request to grant"
    );
    describe_counter!(names::QUOTA_DENIALS, "Leases denied or held by a quota");
    describe_gauge!(names::ATTEMPTS_ACTIVE, "Live attempts by state");
    describe_histogram!(
        names::ATTEMPT_DURATION,
        metrics::Unit::Seconds,
        "Attempt duration by outcome"
    );
    describe_counter!(names::CALLS, "Outbound calls by kind and status");
    describe_counter!(names::CORRECTIONS, "Self-corrections performed");
    describe_counter!(names::CHECKPOINTS_WRITTEN, "Checkpoints persisted");
    describe_gauge!(names::DECISIONS_WAITING, "Attempts waiting for a human");
    describe_counter!(names::UNCERTAIN_OUTCOMES, "Attempts settled as Uncertain");
    describe_counter!(
        names::TOOL_PROCESSES,
        "Tool processes started, by the mechanism that bound them (cgroup-v2, cgroup-v1, rlimit)"
    );
    describe_counter!(
        names::TOOL_KILLS,
        "Tool process trees ended by a limit, by reason (oom, pids, timeout)"
    );
    describe_gauge!(
        names::BACKUP_ENABLED,
        "Whether scheduled backups are on (1) or off (0)"
    );
    describe_gauge!(
        names::BACKUP_INTERVAL,
        metrics::Unit::Seconds,
        "Seconds between scheduled backups"
    );
    describe_gauge!(
        names::BACKUP_LAST_SUCCESS,
        metrics::Unit::Seconds,
        "When the last verified backup was taken (the start, when none since), Unix time"
    );
    describe_gauge!(
        names::BACKUP_LAST_RESULT,
        "1 when the last scheduled backup was written and verified, 0 when it failed"
    );
    describe_counter!(
        names::WORKER_FAILURES,
        "Failed passes of a background worker"
    );
    describe_counter!(
        names::WEBHOOK_DELIVERIES,
        "Webhook delivery tries by outcome (delivered, retry, gave_up)"
    );
    describe_counter!(
        names::NOTIFY_MAILS,
        "Tries of decision mails by outcome (sent, retry, gave_up)"
    );
    describe_counter!(
        names::ACCOUNTING_REPAIRS,
        "Pool counters repaired from their leases"
    );
}

/// The free and the total bytes of the file system that holds `path`.
#[cfg(unix)]
pub fn disk_space(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `s` is written by statvfs
    // before it is read, only when it succeeds.
    let s = unsafe {
        if libc::statvfs(c.as_ptr(), s.as_mut_ptr()) != 0 {
            return None;
        }
        s.assume_init()
    };
    let unit = s.f_frsize as u64;
    Some((s.f_bavail as u64 * unit, s.f_blocks as u64 * unit))
}

/// The free and the total bytes of the volume that holds `path`.
#[cfg(windows)]
pub fn disk_space(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::windows::ffi::OsStrExt;
    let wide: Vec<u16> = path.as_os_str().encode_wide().chain(Some(0)).collect();
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: `wide` is NUL-terminated; the out pointers are valid u64s.
    let ok = unsafe {
        windows_sys::Win32::Storage::FileSystem::GetDiskFreeSpaceExW(
            wide.as_ptr(),
            &mut free,
            &mut total,
            std::ptr::null_mut(),
        )
    };
    (ok != 0).then_some((free, total))
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn log_dir_keeps_the_mode_of_a_directory_the_site_made() {
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        super::daily_files(&shared, 2).unwrap();
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&shared), 0o1777);
        let made = root.path().join("made/logs");
        super::daily_files(&made, 2).unwrap();
        assert_eq!(mode(&made), 0o750);
    }
}
