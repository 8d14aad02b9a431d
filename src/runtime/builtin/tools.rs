//! Tools the appliance provides itself (transport `builtin`), by name.
//! Every call goes through the attempt's policy gate before it runs.

use std::time::Duration;

use serde_json::{Value, json};

/// What a builtin tool returned: its result and a receipt.
pub struct ToolOutput {
    /// The result the model sees.
    pub result: Value,
    /// Evidence of what was done.
    pub receipt: Value,
}

/// Why a tool call failed, and what bound its process.
#[derive(Debug)]
pub struct ToolError {
    /// What went wrong, in words.
    pub message: String,
    /// What bound its process tree, and what it used (tool processes).
    pub confinement: Option<Value>,
    /// Whether it outlasted its timeout (and its process tree was killed).
    pub timed_out: bool,
}

impl From<String> for ToolError {
    fn from(message: String) -> Self {
        ToolError {
            message,
            confinement: None,
            timed_out: false,
        }
    }
}

/// Names of the builtin tools.
pub const BUILTIN_TOOLS: &[&str] = &[
    "echo", "notify", "clock", "noop", "fail", "sleep", "delegate", "ask", "escalate",
];

/// Runs a builtin tool.
pub async fn run(
    name: &str,
    arguments: &Value,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<ToolOutput, String> {
    let receipt = |what: &str| json!({"tool": name, "what": what, "at": now});
    match name {
        // Returns its arguments: a stand-in for a read-only lookup.
        "echo" => Ok(ToolOutput {
            result: json!({"echo": arguments}),
            receipt: receipt("echoed"),
        }),
        // Delivers a message to the site's operators (the appliance log).
        "notify" => {
            let message = arguments
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            tracing::info!(target: "agentbay::notify", message_bytes = message.len(), "notification delivered");
            Ok(ToolOutput {
                result: json!({"delivered": true}),
                receipt: receipt("notification delivered to the appliance log"),
            })
        }
        "clock" => Ok(ToolOutput {
            result: json!({"now": now}),
            receipt: receipt("read the clock"),
        }),
        "noop" => Ok(ToolOutput {
            result: json!({}),
            receipt: receipt("nothing"),
        }),
        "fail" => Err(arguments
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the tool failed")
            .to_string()),
        // Waits (at most a minute): for tests of interrupts during a call.
        "sleep" => {
            let ms = arguments
                .get("ms")
                .and_then(Value::as_u64)
                .unwrap_or(100)
                .min(60_000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ToolOutput {
                result: json!({"slept_ms": ms}),
                receipt: receipt("slept"),
            })
        }
        "delegate" => Err("delegate starts a child run; the loop handles it".into()),
        "ask" | "escalate" => Err(format!("{name} asks a human; the loop handles it")),
        other => Err(format!(
            "{other:?} is not a builtin tool (they are: {})",
            BUILTIN_TOOLS.join(", ")
        )),
    }
}
