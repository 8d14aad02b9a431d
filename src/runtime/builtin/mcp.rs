//! MCP tools: the servers a release declares (rmcp's client), either run
//! as stdio child processes, or reached over streamable HTTP on the site.
//!
//! A stdio server is a tool process: it starts through the confinement
//! layer, bound to the lease it runs under. A tool's server serves every
//! call of the attempt under the attempt's own lease, from the attempt's
//! first call until its loop ends (or the appliance stops); a sandboxed
//! tool (`needsSandbox`) gets a server of its own for each call, under the
//! call's sandbox lease, and its process tree is killed when the call ends,
//! before the lease is given back. A call that outlasts its timeout has its
//! server's process tree killed.

use std::collections::HashMap;
#[cfg(unix)]
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
#[cfg(not(unix))]
use rmcp::transport::TokioChildProcess;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use super::tools::{ToolError, ToolOutput};
use super::words::in_words;
use crate::config::RuntimeConfig;
use crate::domain::amount::Amount;
use crate::domain::attempt::CallFence;
#[cfg(unix)]
use crate::runtime::confine::{Cage, Confiner, Request};

/// What a tool's process may use: its lease's resources and network.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// CPUs.
    pub cpu: Amount,
    /// Memory, GB.
    pub memory_gb: Amount,
    /// Whether the lease allows internet egress.
    pub egress: bool,
}

impl Bounds {
    /// What a capacity lease grants.
    pub fn of(lease: &crate::domain::capacity::CapacityLease) -> Bounds {
        Bounds {
            cpu: lease.cpu,
            memory_gb: lease.memory_gb,
            egress: lease.internet_egress,
        }
    }
}

/// What the site lets a stdio server's process reach beyond its lease:
/// site endpoints (with the addresses the appliance connects to) and read
/// paths, each already allowed.
#[derive(Clone, Copy)]
pub struct Reach<'a> {
    /// `(host, port, addresses)`.
    pub endpoints: &'a [crate::domain::reach::SiteEndpoint],
    /// Paths it may read.
    pub read_paths: &'a [std::path::PathBuf],
}

/// A started server and the cage of its process tree.
struct Server {
    client: RunningService<RoleClient, ()>,
    #[cfg(unix)]
    cage: Option<Cage>,
    #[cfg(windows)]
    job: Option<crate::runtime::jobobject::Job>,
}

impl Server {
    fn confinement(&self) -> Option<Value> {
        #[cfg(unix)]
        {
            self.cage
                .as_ref()
                .map(|c| serde_json::to_value(c.report()).expect("serialises"))
        }
        #[cfg(windows)]
        {
            self.job.as_ref().map(|j| j.report())
        }
        #[cfg(not(any(unix, windows)))]
        {
            Some(
                json!({"mechanism": "none", "why": "tool processes are not confined on this platform"}),
            )
        }
    }

    fn kill(&self, why: &str) {
        #[cfg(unix)]
        if let Some(c) = &self.cage {
            c.kill(why);
        }
        #[cfg(windows)]
        if let Some(j) = &self.job {
            j.kill(why);
        }
        let _ = why;
    }
}

/// The MCP servers of one attempt, by command line.
pub struct McpServers {
    servers: tokio::sync::Mutex<HashMap<Vec<String>, Server>>,
    #[cfg(unix)]
    confiner: Arc<Confiner>,
    #[cfg_attr(not(unix), allow(dead_code))]
    attempt: String,
}

impl McpServers {
    /// The servers of `attempt` (none started yet).
    #[cfg(unix)]
    pub fn new(confiner: Arc<Confiner>, attempt: String) -> McpServers {
        McpServers {
            servers: Default::default(),
            confiner,
            attempt,
        }
    }

    /// The servers of `attempt` (none started yet).
    #[cfg(not(unix))]
    pub fn new(attempt: String) -> McpServers {
        McpServers {
            servers: Default::default(),
            attempt,
        }
    }

    /// Starts the server of `command` under `bounds`.
    async fn start(
        &self,
        command: &[String],
        bounds: Bounds,
        reach: &Reach<'_>,
        config: &RuntimeConfig,
    ) -> Result<Server, ToolError> {
        let Some(program) = command.first() else {
            return Err("the tool declares no command".to_string().into());
        };
        // A tool process starts through the confinement layer, forked by
        // the tool spawner; its standard input and output are the
        // transport.
        #[cfg(unix)]
        let (transport, cage) = {
            let workdir = self
                .confiner
                .workdir(&self.attempt, config)
                .map_err(|e| format!("no working directory for the tool: {e}"))?;
            let request = Request {
                argv: command,
                cpu: bounds.cpu,
                memory_gb: bounds.memory_gb,
                egress: bounds.egress,
                workdir: &workdir,
                endpoints: reach.endpoints,
                read_paths: reach.read_paths,
            };
            let (tool, cage) = self
                .confiner
                .start(&request, config)
                .await
                .map_err(|e| format!("MCP server {program} could not start: {e}"))?;
            ((tool.stdout, tool.stdin), cage)
        };
        #[cfg(windows)]
        let job = crate::runtime::jobobject::Job::new(
            bounds.cpu,
            (bounds.memory_gb.as_f64() * 1024.0 * 1024.0 * 1024.0) as u64,
            config.tool_pids_max,
        )?;
        #[cfg(not(unix))]
        let transport = {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(&command[1..]).kill_on_drop(true);
            let transport = TokioChildProcess::new(cmd)
                .map_err(|e| format!("MCP server {program} could not start: {e}"))?;
            #[cfg(windows)]
            if let Some(pid) = transport.id() {
                job.assign(pid)?;
            }
            let _ = (reach, config);
            transport
        };
        #[cfg(not(any(unix, windows)))]
        let _ = bounds;
        let client = ().serve(transport).await.map_err(|e| ToolError {
            message: format!("MCP server {program} did not initialise: {}", in_words(&e)),
            #[cfg(unix)]
            confinement: Some(serde_json::to_value(cage.report()).expect("serialises")),
            #[cfg(windows)]
            confinement: Some(job.report()),
            #[cfg(not(any(unix, windows)))]
            confinement: None,
            timed_out: false,
        })?;
        Ok(Server {
            client,
            #[cfg(unix)]
            cage: Some(cage),
            #[cfg(windows)]
            job: Some(job),
        })
    }

    /// Calls `tool` on the server started with `command` (stdio): the
    /// attempt's server under `bounds`, or with `dedicated` one of the
    /// call's own, ended with the call.
    #[allow(clippy::too_many_arguments)]
    pub async fn call_stdio(
        &self,
        command: &[String],
        tool: &str,
        arguments: &Value,
        fence: &CallFence,
        bounds: Bounds,
        reach: &Reach<'_>,
        dedicated: bool,
        timeout: Duration,
        config: &RuntimeConfig,
    ) -> Result<ToolOutput, ToolError> {
        let program = command.first().cloned().unwrap_or_default();
        let call = |server| {
            timed(
                server,
                &program,
                "mcp-stdio",
                tool,
                arguments,
                fence,
                timeout,
            )
        };
        if dedicated {
            let server = self.start(command, bounds, reach, config).await?;
            let out = call(&server).await;
            let _ = server.client.cancel().await;
            return out;
        }
        let mut servers = self.servers.lock().await;
        if !servers.contains_key(command) {
            let server = self.start(command, bounds, reach, config).await?;
            servers.insert(command.to_vec(), server);
        }
        let out = call(servers.get(command).expect("started above")).await;
        if out.as_ref().is_err_and(|e| e.timed_out) {
            // Its process tree is gone: the next call starts it again.
            if let Some(s) = servers.remove(command) {
                let _ = s.client.cancel().await;
            }
        }
        out
    }

    /// Calls `tool` on the server at `url` (streamable HTTP), connecting
    /// with `client` when no session is open yet.
    pub async fn call_http(
        &self,
        url: &str,
        client: reqwest::Client,
        tool: &str,
        arguments: &Value,
        fence: &CallFence,
        timeout: Duration,
    ) -> Result<ToolOutput, ToolError> {
        let key = vec!["http".to_string(), url.to_string()];
        let mut servers = self.servers.lock().await;
        if !servers.contains_key(&key) {
            let transport = StreamableHttpClientTransport::with_client(
                client,
                StreamableHttpClientTransportConfig::with_uri(url.to_string()),
            );
            let client = ()
                .serve(transport)
                .await
                .map_err(|e| format!("MCP server {url} did not initialise: {}", in_words(&e)))?;
            servers.insert(
                key.clone(),
                Server {
                    client,
                    #[cfg(unix)]
                    cage: None,
                    #[cfg(windows)]
                    job: None,
                },
            );
        }
        let server = servers.get(&key).expect("connected above");
        timed(server, url, "mcp-http", tool, arguments, fence, timeout).await
    }

    /// Puts the release's own files in the attempt's working directory,
    /// under `release/`, unless they are there already.
    pub fn put_release_files(
        &self,
        files: Vec<(String, Vec<u8>)>,
        config: &RuntimeConfig,
    ) -> std::io::Result<()> {
        #[cfg(unix)]
        {
            let dir = self
                .confiner
                .workdir(&self.attempt, config)?
                .join("release");
            if dir.exists() {
                return Ok(());
            }
            let partial = dir.with_extension("partial");
            let _ = std::fs::remove_dir_all(&partial);
            use std::os::unix::fs::PermissionsExt;
            // Readable by the tool's account whatever the umask; its
            // working directory is its own, and so is this copy.
            let mode = |p: &std::path::Path, m: u32| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
            };
            std::fs::create_dir_all(&partial)?;
            mode(&partial, 0o755)?;
            for (path, bytes) in files {
                // Paths were checked at import: relative, inside the bundle.
                let target = partial.join(&path);
                let mut made = partial.clone();
                for part in std::path::Path::new(&path)
                    .parent()
                    .into_iter()
                    .flat_map(|p| p.iter())
                {
                    made.push(part);
                    if !made.exists() {
                        std::fs::create_dir(&made)?;
                        mode(&made, 0o755)?;
                    }
                }
                std::fs::write(&target, bytes)?;
                mode(&target, 0o644)?;
            }
            std::fs::rename(&partial, &dir)
        }
        #[cfg(not(unix))]
        {
            let _ = (files, config);
            Ok(())
        }
    }

    /// Stops every server, their process trees with them (the next call
    /// starts its server again).
    pub async fn stop(&self) {
        let servers: Vec<_> = self.servers.lock().await.drain().collect();
        for (_, server) in servers {
            let _ = server.client.cancel().await;
        }
    }

    /// Stops every server and removes the attempt's working directory.
    pub async fn close(&self) {
        self.stop().await;
        #[cfg(unix)]
        self.confiner.remove_workdir(&self.attempt);
    }
}

/// One call, bounded by `timeout`: past it the server's process tree is
/// killed and the call fails saying so.
async fn timed(
    server: &Server,
    name: &str,
    transport: &str,
    tool: &str,
    arguments: &Value,
    fence: &CallFence,
    timeout: Duration,
) -> Result<ToolOutput, ToolError> {
    let answer =
        tokio::time::timeout(timeout, call(&server.client, name, tool, arguments, fence)).await;
    let mut out = match answer {
        Ok(out) => out.map_err(ToolError::from),
        Err(_) => {
            server.kill("timeout");
            Err(ToolError {
                message: format!(
                    "MCP tool {tool} on {name} timed out after {} s; its process tree was killed",
                    timeout.as_secs()
                ),
                confinement: None,
                timed_out: true,
            })
        }
    };
    let confinement = server.confinement();
    if let (Err(e), Some(c)) = (&mut out, &confinement) {
        // Name the limit that ended it.
        match c["killedBy"].as_str() {
            Some("oom") => {
                e.message = format!(
                    "{}; its process tree was killed by its memory limit ({} bytes)",
                    e.message, c["memoryBytes"]
                )
            }
            Some("pids") => {
                e.message = format!(
                    "{}; it reached its process limit ({})",
                    e.message, c["pids"]
                )
            }
            _ => {}
        }
    }
    match &mut out {
        Ok(o) => {
            o.receipt["transport"] = json!(transport);
            if let Some(c) = confinement {
                o.receipt["confinement"] = c;
            }
        }
        Err(e) => e.confinement = confinement,
    }
    out
}

async fn call(
    client: &RunningService<RoleClient, ()>,
    server: &str,
    tool: &str,
    arguments: &Value,
    fence: &CallFence,
) -> Result<ToolOutput, String> {
    let mut params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(arguments.as_object().cloned().unwrap_or_default());
    params.meta = Some(RequestMetaObject::from(fence.meta()));
    let result = client
        .call_tool(params)
        .await
        .map_err(|e| format!("MCP tool {tool} on {server} failed: {}", in_words(&e)))?;
    let content = serde_json::to_value(&result.content).unwrap_or(Value::Null);
    if result.is_error == Some(true) {
        return Err(format!("MCP tool {tool} reported an error: {content}"));
    }
    Ok(ToolOutput {
        result: json!({"content": content, "structured": result.structured_content}),
        receipt: json!({"schema": "tool-invocation-v1", "server": server, "tool": tool}),
    })
}
