//! MCP tools: the servers a release declares (rmcp's client), either run
//! as stdio child processes for the attempt that uses them, or reached over
//! streamable HTTP on the site. A connection starts on the attempt's first
//! call and is closed when the attempt's loop ends, is interrupted, or the
//! appliance stops (a child is killed when its handle is dropped).

use std::collections::HashMap;

use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use super::tools::ToolOutput;
use crate::domain::attempt::CallFence;

/// The MCP servers of one attempt, by command line.
#[derive(Default)]
pub struct McpServers {
    servers: tokio::sync::Mutex<HashMap<Vec<String>, RunningService<RoleClient, ()>>>,
}

impl McpServers {
    /// Calls `tool` on the server started with `command` (stdio).
    pub async fn call_stdio(
        &self,
        command: &[String],
        tool: &str,
        arguments: &Value,
        fence: &CallFence,
    ) -> Result<ToolOutput, String> {
        let Some((program, args)) = command.split_first() else {
            return Err("the tool declares no command".into());
        };
        let mut servers = self.servers.lock().await;
        if !servers.contains_key(command) {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args).kill_on_drop(true);
            let transport = TokioChildProcess::new(cmd)
                .map_err(|e| format!("MCP server {program} could not start: {e}"))?;
            let client = ()
                .serve(transport)
                .await
                .map_err(|e| format!("MCP server {program} did not initialise: {e}"))?;
            servers.insert(command.to_vec(), client);
        }
        let client = servers.get(command).expect("started above");
        call(client, program, "mcp-stdio", tool, arguments, fence).await
    }

    /// Calls `tool` on the server at `url` (streamable HTTP).
    pub async fn call_http(
        &self,
        url: &str,
        tool: &str,
        arguments: &Value,
        fence: &CallFence,
    ) -> Result<ToolOutput, String> {
        let key = vec!["http".to_string(), url.to_string()];
        let mut servers = self.servers.lock().await;
        if !servers.contains_key(&key) {
            let transport = StreamableHttpClientTransport::from_uri(url.to_string());
            let client = ()
                .serve(transport)
                .await
                .map_err(|e| format!("MCP server {url} did not initialise: {e}"))?;
            servers.insert(key.clone(), client);
        }
        let client = servers.get(&key).expect("connected above");
        call(client, url, "mcp-http", tool, arguments, fence).await
    }

    /// Stops every server.
    pub async fn close(&self) {
        let servers: Vec<_> = self.servers.lock().await.drain().collect();
        for (_, server) in servers {
            let _ = server.cancel().await;
        }
    }
}

async fn call(
    client: &RunningService<RoleClient, ()>,
    server: &str,
    transport: &str,
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
        .map_err(|e| format!("MCP tool {tool} on {server} failed: {e}"))?;
    let content = serde_json::to_value(&result.content).unwrap_or(Value::Null);
    if result.is_error == Some(true) {
        return Err(format!("MCP tool {tool} reported an error: {content}"));
    }
    Ok(ToolOutput {
        result: json!({"content": content, "structured": result.structured_content}),
        receipt: json!({"schema": "tool-invocation-v1", "transport": transport, "server": server, "tool": tool}),
    })
}
