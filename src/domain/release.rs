//! Releases: the manifest of a release bundle, and the LoadedRelease this
//! appliance keeps of it.
//!
//! A release arrives as a bundle (a directory or a `.tar.gz`): a
//! `manifest.json`, a `signature.json`, and the content files the manifest
//! lists, each with its SHA-256. The manifest hash is the SHA-256 of the
//! manifest's canonical JSON (keys sorted, no insignificant whitespace); the
//! publisher signs those canonical bytes with Ed25519. The manifest holds
//! every content file's hash, so the signature covers the whole release.
//!
//! A LoadedRelease is this appliance's verdict on a bundle: Verified against
//! its adapter and checkpoint format (the contents are then in the artifact
//! store by hash) or Rejected with the reason. Its lifecycle — Published,
//! Deprecated, Revoked — decides whether it may be dispatched and what
//! happens to the attempts already running it (the in-flight policy).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::amount::Amount;
use super::error::{DomainError, FieldError};
use super::events::{EventPayload, NewEvent};
use super::ids::TenantId;

/// The manifest format this appliance reads.
pub const MANIFEST_SCHEMA: &str = "agentbay.release/v1";

/// Execution adapters this appliance runs, and their versions.
pub const SUPPORTED_ADAPTERS: &[(AdapterKind, &str)] =
    &[(AdapterKind::Builtin, "1"), (AdapterKind::External, "1")];
/// Checkpoint formats this appliance can write and resume from.
pub const SUPPORTED_CHECKPOINT_FORMATS: &[u32] = &[1];

/// The adapter version string this appliance verifies against, e.g.
/// `builtin/1+checkpoint/1`.
pub fn adapter_version(kind: AdapterKind) -> String {
    let version = SUPPORTED_ADAPTERS
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or("?", |(_, v)| v);
    let formats: Vec<String> = SUPPORTED_CHECKPOINT_FORMATS
        .iter()
        .map(|f| f.to_string())
        .collect();
    format!(
        "{}/{version}+checkpoint/{}",
        kind.as_str(),
        formats.join(",")
    )
}

/// Who runs the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AdapterKind {
    /// The appliance runs it.
    Builtin,
    /// A local agent process runs it over RPC.
    External,
}

impl AdapterKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            AdapterKind::Builtin => "builtin",
            AdapterKind::External => "external",
        }
    }
}

/// How risky a tool call is.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SideEffectClass {
    /// Reads only.
    Read,
    /// Writes the attempt's own workspace.
    WorkspaceWrite,
    /// Writes something others share.
    SharedWrite,
    /// Reaches a system outside the site.
    External,
    /// Touches production.
    Production,
}

impl SideEffectClass {
    /// Every class, least to most risky.
    pub const ALL: [SideEffectClass; 5] = [
        SideEffectClass::Read,
        SideEffectClass::WorkspaceWrite,
        SideEffectClass::SharedWrite,
        SideEffectClass::External,
        SideEffectClass::Production,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffectClass::Read => "read",
            SideEffectClass::WorkspaceWrite => "workspace-write",
            SideEffectClass::SharedWrite => "shared-write",
            SideEffectClass::External => "external",
            SideEffectClass::Production => "production",
        }
    }

    /// Shared-write and above are gated: a checkpoint comes before them.
    pub fn is_gated(self) -> bool {
        self >= SideEffectClass::SharedWrite
    }
}

/// Orders two release versions: parts separated by `.` or `-` compare as
/// numbers when both are numbers (`1.10` after `1.9`), else as text.
pub fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &'_ str| {
        v.split(['.', '-', '+'])
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
    };
    let (a, b) = (parts(a), parts(b));
    for (x, y) in a.iter().zip(&b) {
        let order = match (x.parse::<u64>(), y.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => x.cmp(y),
        };
        if order.is_ne() {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

/// What the policy says of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyRule {
    /// Go ahead.
    Allow,
    /// Ask a human first.
    RequireApproval,
    /// Never.
    Deny,
}

impl PolicyRule {
    /// The rule when the adapter asks approval of the call itself: an
    /// allowed call waits for a reviewer; approval or denial stay.
    pub fn with_approval_asked(self) -> Self {
        match self {
            PolicyRule::Allow => PolicyRule::RequireApproval,
            stricter => stricter,
        }
    }
}

/// How a tool is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolTransport {
    /// An MCP server started as a child process (stdio).
    McpStdio,
    /// An MCP server on the site, over streamable HTTP.
    McpHttp,
    /// A tool the appliance provides.
    Builtin,
}

/// A file of the bundle and its hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRef {
    /// Path inside the bundle, `/`-separated, relative.
    pub path: String,
    /// `sha256:<hex>` of the file.
    pub sha256: String,
}

/// A skill file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SkillRef {
    /// Skill id, unique in the release.
    pub id: String,
    /// Path inside the bundle.
    pub path: String,
    /// `sha256:<hex>` of the file.
    pub sha256: String,
}

/// The adapter a release needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdapterSpec {
    /// builtin | external.
    pub kind: AdapterKind,
    /// Adapter protocol version.
    pub version: String,
}

/// The model a release uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelProfile {
    /// Profile id.
    pub id: String,
    /// `scripted` (replays the responses file) or `openai-compatible`.
    pub kind: ModelKind,
    /// For openai-compatible: base URL of the chat-completions API on the
    /// site, e.g. `http://llm.local:8080/v1`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// For openai-compatible: the model name.
    #[serde(default)]
    pub model: Option<String>,
    /// For openai-compatible: the name of an API key in the appliance's
    /// configuration (`[models.api_keys]`), never the key itself.
    #[serde(default)]
    pub api_key_ref: Option<String>,
    /// For scripted: the responses to replay.
    #[serde(default)]
    pub responses: Option<FileRef>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Most tokens per response.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Seconds one model call may take.
    #[serde(default)]
    pub timeout_seconds: Option<u32>,
}

/// Kinds of model profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// Fixed responses from the bundle, for demos and tests.
    Scripted,
    /// An OpenAI-compatible chat-completions server on the site.
    OpenaiCompatible,
}

/// The policy revision: side-effect class (and tool) -> rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// Revision label.
    pub revision: String,
    /// A rule per side-effect class; classes not listed: read and
    /// workspace-write allowed, the gated ones require approval.
    #[serde(default)]
    pub side_effects: BTreeMap<SideEffectClass, PolicyRule>,
    /// Rules for single tools, over their class's rule.
    #[serde(default)]
    pub tools: BTreeMap<String, PolicyRule>,
    /// Tools whose proposed arguments a reviewer may change when
    /// approving a call: the call then made is the one with the changed
    /// arguments, and no other.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub editable: BTreeSet<String>,
    /// Who is expected to answer the release's decisions when the asker
    /// names no one: `role:Reviewer` or `user:alice`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignee: Option<crate::domain::access::Assignee>,
}

impl Policy {
    /// Whether a reviewer may change the arguments of a call of `tool`
    /// when approving it.
    pub fn allows_edit(&self, tool: &str) -> bool {
        self.editable.contains(tool)
    }

    /// Why a call of `tool` with class `class` is refused, when the policy
    /// denies it.
    pub fn denial(&self, tool: &str, class: SideEffectClass) -> Option<String> {
        (self.rule(tool, class) == PolicyRule::Deny).then(|| {
            format!(
                "policy revision {} denies tool {tool} (side-effect class {})",
                self.revision,
                class.as_str()
            )
        })
    }

    /// The rule for a call of `tool` with class `class`.
    pub fn rule(&self, tool: &str, class: SideEffectClass) -> PolicyRule {
        if let Some(rule) = self.tools.get(tool) {
            return *rule;
        }
        self.side_effects
            .get(&class)
            .copied()
            .unwrap_or(if class.is_gated() {
                PolicyRule::RequireApproval
            } else {
                PolicyRule::Allow
            })
    }
}

/// A tool the release may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolDescriptor {
    /// Tool id, unique in the release (what the model calls).
    pub id: String,
    /// What it is for, shown to the model.
    #[serde(default)]
    pub description: String,
    /// How risky its calls are.
    pub side_effect_class: SideEffectClass,
    /// How it is reached.
    pub transport: ToolTransport,
    /// JSON Schema of its input.
    pub input_schema: Value,
    /// mcp-stdio: the command and its arguments.
    #[serde(default)]
    pub command: Vec<String>,
    /// mcp-http: the server URL on the site.
    #[serde(default)]
    pub url: Option<String>,
    /// The tool's name on its MCP server or among the built-ins, when it
    /// differs from `id`.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether a call needs a sandbox capacity lease first.
    #[serde(default)]
    pub needs_sandbox: bool,
    /// Whether its process needs the internet: its sandbox lease asks for
    /// an egress pool (placement refuses it elsewhere), and only then does
    /// the process get the host's network.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_egress: bool,
    /// Seconds one call may take (default `runtime.tool_timeout_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// CPUs of its sandbox lease (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Amount>,
    /// Memory of its sandbox lease, GB (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<Amount>,
    /// Endpoints on the site (`host:port`) its process reaches without
    /// internet egress: through the appliance, at `127.0.0.1:<port>` in
    /// its own network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub site_endpoints: Vec<String>,
    /// Paths its process reads beyond the system's directories and the
    /// release's own files (a model's weights, the site's reference data):
    /// absolute, granted only inside what the site allows
    /// (`runtime.tool_read_allow`), never at, above or below a protected
    /// path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_paths: Vec<String>,
}

impl ToolDescriptor {
    /// Its site endpoints as `(host, port)`, each named on failure.
    pub fn endpoints(&self) -> Result<Vec<(String, u16)>, String> {
        self.site_endpoints
            .iter()
            .map(|e| {
                let (host, port) = e
                    .rsplit_once(':')
                    .filter(|(h, _)| !h.is_empty())
                    .ok_or_else(|| {
                        format!("tool {}: site endpoint {e:?} is not host:port", self.id)
                    })?;
                let port =
                    port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                        format!("tool {}: site endpoint {e:?} has no port", self.id)
                    })?;
                Ok((host.trim_matches(['[', ']']).to_string(), port))
            })
            .collect()
    }
}

/// Budgets of one attempt of the release (AttemptLimits), the maxima a run
/// may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttemptLimits {
    /// Active minutes: time the attempt spent Running or waiting for a
    /// tool or model call, not time spent waiting for capacity, for a
    /// human, for a delegated child run, or paused. The attempt page shows
    /// this clock beside the wall clock.
    pub max_minutes: u32,
    /// Model calls.
    pub max_model_calls: u32,
    /// Tool calls.
    pub max_tool_calls: u32,
    /// Tokens of context.
    pub max_context_tokens: u32,
    /// Depth of sub-agent delegation.
    pub max_sub_agent_depth: u32,
    /// Tokens (input and output, as the model servers count them) of all
    /// the attempt's model calls; 0: no budget. A model call that would
    /// pass it (the tokens used plus the context it declares) is not made
    /// and the attempt ends TimedOut (budget).
    #[serde(default)]
    pub max_total_tokens: u64,
}

impl Default for AttemptLimits {
    fn default() -> Self {
        AttemptLimits {
            max_minutes: 30,
            max_model_calls: 50,
            max_tool_calls: 100,
            max_context_tokens: 32_000,
            max_sub_agent_depth: 2,
            max_total_tokens: 0,
        }
    }
}

/// What a run of the release may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Contract {
    /// Upper bounds of a run's limits.
    #[serde(default)]
    pub limits: AttemptLimits,
    /// Self-corrections per attempt.
    #[serde(default)]
    pub max_corrections: Option<u32>,
    /// Attempts per step before the run fails.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// CPU and memory of an attempt's capacity lease.
    #[serde(default = "default_cpu")]
    pub cpu: f64,
    /// Memory, GB.
    #[serde(default = "default_memory")]
    pub memory_gb: f64,
    /// Retry a failure of the agent's own code (class `agent`) like a
    /// passing one; by default such a bug fails the run at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retry_agent_failures: bool,
}

fn default_attempts() -> u32 {
    3
}
fn default_cpu() -> f64 {
    1.0
}
fn default_memory() -> f64 {
    1.0
}

impl Default for Contract {
    fn default() -> Self {
        Contract {
            limits: AttemptLimits::default(),
            max_corrections: None,
            max_attempts: default_attempts(),
            cpu: default_cpu(),
            memory_gb: default_memory(),
            retry_agent_failures: false,
        }
    }
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_SCHEMA`].
    pub schema: String,
    /// The release, e.g. `triage-1.2.0`.
    pub release_id: String,
    /// The tenant it is for.
    pub tenant_id: TenantId,
    /// The agent it releases.
    pub agent_id: String,
    /// Its version.
    pub version: String,
    /// The adapter it needs.
    pub adapter: AdapterSpec,
    /// The checkpoint format its adapter writes.
    pub checkpoint_format: u32,
    /// The model.
    pub model_profile: ModelProfile,
    /// The policy revision.
    pub policy: Policy,
    /// The tools it may call (its closure).
    #[serde(default)]
    pub tools: Vec<ToolDescriptor>,
    /// JSON Schema the result must satisfy.
    pub output_contract: FileRef,
    /// The workflow definition.
    pub workflow: FileRef,
    /// The agent's instructions.
    pub instructions: FileRef,
    /// Skill files.
    #[serde(default)]
    pub skills: Vec<SkillRef>,
    /// Budgets and retries.
    #[serde(default)]
    pub contract: Contract,
    /// Files its tools use (scripts, data): each attempt's tools find them
    /// read in the `release/` directory of their working directory, as
    /// signed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_files: Vec<FileRef>,
    /// JSON Schema a run's input must satisfy: a run whose input does not
    /// is refused before it is made, and the console builds its submit
    /// form from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
}

impl Manifest {
    /// Every content file the manifest lists, with its role.
    pub fn files(&self) -> Vec<(&'static str, &str, &str)> {
        let mut out = vec![
            (
                "instructions",
                self.instructions.path.as_str(),
                self.instructions.sha256.as_str(),
            ),
            (
                "workflow",
                self.workflow.path.as_str(),
                self.workflow.sha256.as_str(),
            ),
            (
                "outputContract",
                self.output_contract.path.as_str(),
                self.output_contract.sha256.as_str(),
            ),
        ];
        if let Some(r) = &self.model_profile.responses {
            out.push(("modelResponses", r.path.as_str(), r.sha256.as_str()));
        }
        for s in &self.skills {
            out.push(("skill", s.path.as_str(), s.sha256.as_str()));
        }
        for f in &self.tool_files {
            out.push(("toolFile", f.path.as_str(), f.sha256.as_str()));
        }
        out
    }

    /// Checks what types cannot: ids, hashes, paths, duplicates,
    /// references, transports. Errors name the field.
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.schema != MANIFEST_SCHEMA {
            return Err(FieldError::new(
                "schema",
                format!(
                    "{:?} is not {MANIFEST_SCHEMA:?}, the manifest format this appliance reads",
                    self.schema
                ),
            ));
        }
        check_release_id(&self.release_id)?;
        check_name("agentId", &self.agent_id)?;
        check_name("version", &self.version)?;
        check_name("modelProfile.id", &self.model_profile.id)?;
        check_name("policy.revision", &self.policy.revision)?;
        let mut paths = BTreeSet::new();
        for (role, path, sha) in self.files() {
            check_path(&format!("{role} path"), path)?;
            check_sha(&format!("{role} {path} sha256"), sha)?;
            if !paths.insert(path) {
                return Err(FieldError::new("files", format!("{path} is listed twice")));
            }
        }
        let mut ids = BTreeSet::new();
        for (i, s) in self.skills.iter().enumerate() {
            check_name(&format!("skills[{i}].id"), &s.id)?;
            if !ids.insert(&s.id) {
                return Err(FieldError::new(
                    format!("skills[{i}].id"),
                    format!("duplicate skill id {:?}", s.id),
                ));
            }
        }
        let mut tools = BTreeSet::new();
        for (i, t) in self.tools.iter().enumerate() {
            let field = |f: &str| format!("tools[{i}].{f}");
            check_name(&field("id"), &t.id)?;
            if !tools.insert(t.id.as_str()) {
                return Err(FieldError::new(
                    field("id"),
                    format!("duplicate tool id {:?}", t.id),
                ));
            }
            check_schema(&field("inputSchema"), &t.input_schema)?;
            match t.transport {
                ToolTransport::McpStdio if t.command.is_empty() => {
                    return Err(FieldError::new(
                        field("command"),
                        "an mcp-stdio tool needs the command that starts its server",
                    ));
                }
                ToolTransport::McpStdio
                    if t.site_endpoints.len() > crate::domain::reach::MAX_SITE_ENDPOINTS =>
                {
                    return Err(FieldError::new(
                        field("siteEndpoints"),
                        format!(
                            "{} endpoints; a tool may name at most {}",
                            t.site_endpoints.len(),
                            crate::domain::reach::MAX_SITE_ENDPOINTS
                        ),
                    ));
                }
                ToolTransport::McpHttp => {
                    let url = t.url.as_deref().unwrap_or("");
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(FieldError::new(
                            field("url"),
                            format!("{url:?} is not an http(s) URL"),
                        ));
                    }
                }
                _ => {}
            }
        }
        if let Some(schema) = &self.input_schema {
            check_schema("inputSchema", schema)?;
        }
        for (i, t) in self.tools.iter().enumerate() {
            for (j, p) in t.read_paths.iter().enumerate() {
                let path = std::path::Path::new(p);
                if !path.is_absolute()
                    || path.components().any(|c| {
                        matches!(
                            c,
                            std::path::Component::ParentDir | std::path::Component::CurDir
                        )
                    })
                {
                    return Err(FieldError::new(
                        format!("tools[{i}].readPaths[{j}]"),
                        format!("{p:?} is not an absolute path without . or .."),
                    ));
                }
            }
        }
        for tool in &self.policy.editable {
            if !tools.contains(tool.as_str()) {
                return Err(FieldError::new(
                    format!("policy.editable.{tool}"),
                    "names a tool the release does not declare",
                ));
            }
        }
        for tool in self.policy.tools.keys() {
            if !tools.contains(tool.as_str()) {
                return Err(FieldError::new(
                    format!("policy.tools.{tool}"),
                    "names a tool the release does not declare",
                ));
            }
        }
        let m = &self.model_profile;
        match m.kind {
            ModelKind::Scripted if m.responses.is_none() => {
                return Err(FieldError::new(
                    "modelProfile.responses",
                    "a scripted profile needs its responses file",
                ));
            }
            // The endpoint is a default: the site may map the profile id
            // to its own model server (and must, when there is none).
            ModelKind::OpenaiCompatible => {
                if let Some(url) = m.endpoint.as_deref() {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(FieldError::new(
                            "modelProfile.endpoint",
                            format!("{url:?} is not an http(s) URL"),
                        ));
                    }
                    if m.model.as_deref().unwrap_or("").is_empty() {
                        return Err(FieldError::new(
                            "modelProfile.model",
                            "is required with an endpoint",
                        ));
                    }
                }
            }
            _ => {}
        }
        let c = &self.contract;
        if c.max_attempts == 0 || c.max_attempts > 20 {
            return Err(FieldError::new(
                "contract.maxAttempts",
                format!("{} is outside 1..=20", c.max_attempts),
            ));
        }
        if !(c.cpu > 0.0 && c.cpu <= 1000.0 && c.memory_gb > 0.0 && c.memory_gb <= 10_000.0) {
            return Err(FieldError::new(
                "contract",
                "cpu and memoryGb must be positive",
            ));
        }
        Ok(())
    }
}

/// Refuses a schema that is not a JSON Schema object a validator takes.
fn check_schema(field: &str, schema: &Value) -> Result<(), FieldError> {
    if !schema.is_object() {
        return Err(FieldError::new(field, "must be a JSON Schema object"));
    }
    jsonschema::validator_for(schema)
        .map(|_| ())
        .map_err(|e| FieldError::new(field, format!("is not a usable JSON Schema: {e}")))
}

fn check_release_id(id: &str) -> Result<(), FieldError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            "releaseId",
            format!(
                "{id:?} must be 1 to 128 characters of a-z, 0-9, '-' and '.', starting with a letter or digit"
            ),
        ))
    }
}

/// Checks a release id given on a path.
pub fn parse_release_id(id: &str) -> Result<String, FieldError> {
    check_release_id(id).map(|()| id.to_string())
}

/// Checks a release or agent id: 1 to 128 letters, digits, `-`, `_`, `.`.
pub(crate) fn check_name(field: &str, v: &str) -> Result<(), FieldError> {
    let ok = !v.is_empty()
        && v.len() <= 128
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("{v:?} must be 1 to 128 characters of letters, digits, '-', '_' and '.'"),
        ))
    }
}

fn check_sha(field: &str, v: &str) -> Result<(), FieldError> {
    let hex = v.strip_prefix("sha256:").unwrap_or("");
    if hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("{v:?} is not sha256:<64 lowercase hex digits>"),
        ))
    }
}

/// Checks a path inside a bundle: relative, `/`-separated, no `..`, no
/// empty or `.` parts, no backslash or control characters, at most 255
/// bytes and 16 levels.
pub fn check_path(field: &str, path: &str) -> Result<(), FieldError> {
    let bad = |why: &str| Err(FieldError::new(field, format!("{path:?} {why}")));
    if path.is_empty() {
        return bad("is empty");
    }
    if path.len() > 255 {
        return bad("is longer than 255 bytes");
    }
    if path.starts_with('/') || path.contains(':') {
        return bad("is absolute; paths in a bundle are relative");
    }
    if path.contains('\\') || path.chars().any(|c| c.is_control()) {
        return bad("contains a backslash or a control character");
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() > 16 {
        return bad("is nested more than 16 levels deep");
    }
    if parts.contains(&"..") {
        return bad("climbs out of the bundle with '..'");
    }
    if parts.iter().any(|p| p.is_empty() || *p == ".") {
        return bad("has an empty or '.' component");
    }
    Ok(())
}

/// The canonical JSON of a value: object keys sorted, no whitespace.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    fn write(v: &Value, out: &mut Vec<u8>) {
        match v {
            Value::Object(map) => {
                out.push(b'{');
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(
                        serde_json::to_string(k)
                            .expect("strings serialise")
                            .as_bytes(),
                    );
                    out.push(b':');
                    write(&map[k.as_str()], out);
                }
                out.push(b'}');
            }
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write(item, out);
                }
                out.push(b']');
            }
            other => out.extend_from_slice(
                serde_json::to_string(other)
                    .expect("scalars serialise")
                    .as_bytes(),
            ),
        }
    }
    let mut out = Vec::new();
    write(value, &mut out);
    out
}

/// Whether the release can be loaded and verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum LoadState {
    /// Signature, hashes and compatibility checked; usable.
    Verified,
    /// Everything checks but its signer is not trusted here (unknown,
    /// revoked, or not allowed for the tenant); `reason` says which. Kept
    /// with its contents, never dispatched, and Verified again once its
    /// key is trusted.
    Untrusted,
    /// Refused; `reason` says why. Never dispatched.
    Rejected,
}

impl LoadState {
    /// As shown.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadState::Verified => "Verified",
            LoadState::Untrusted => "Untrusted",
            LoadState::Rejected => "Rejected",
        }
    }
}

/// Where the release is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum Lifecycle {
    /// Current.
    Published,
    /// Superseded: finish or drain what runs.
    Deprecated,
    /// Withdrawn: never dispatched again.
    Revoked,
}

/// What happens to attempts running a release when it is deprecated or
/// revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum InFlightPolicy {
    /// Running attempts finish; (for a deprecation) new runs are still
    /// dispatched.
    Finish,
    /// Running attempts finish; no new run is dispatched.
    Drain,
    /// Running attempts are interrupted; no new run is dispatched.
    Interrupt,
}

impl fmt::Display for InFlightPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InFlightPolicy::Finish => "finish",
            InFlightPolicy::Drain => "drain",
            InFlightPolicy::Interrupt => "interrupt",
        })
    }
}

/// What the appliance verified of a release, and its state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadedRelease {
    /// The release.
    pub release_id: String,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Its agent.
    pub agent_id: String,
    /// Its version.
    pub version: String,
    /// SHA-256 of the canonical manifest.
    pub manifest_hash: String,
    /// The adapter and checkpoint format it was verified against
    /// (`builtin/1+checkpoint/1`).
    pub adapter_version: String,
    /// The adapter it needs.
    pub adapter: AdapterKind,
    /// Artifact references by role: manifest, instructions, workflow,
    /// outputContract, policy, modelProfile, toolDescriptors, skill:<id>, ...
    pub content_refs: BTreeMap<String, String>,
    /// Verified or Rejected.
    pub state: LoadState,
    /// Why it was rejected.
    pub reason: Option<String>,
    /// Published, Deprecated or Revoked.
    pub lifecycle: Lifecycle,
    /// Set when deprecated or revoked.
    pub in_flight_policy: Option<InFlightPolicy>,
    /// The publisher key that signed it (key id), and its name if trusted.
    pub signer: Option<String>,
    /// When it was last verified (or rejected).
    pub verified_at: DateTime<Utc>,
    /// When the bundle was imported.
    pub imported_at: DateTime<Utc>,
    /// Who imported it.
    pub imported_by: String,
    /// The set of trusted keys it was verified under.
    #[serde(default)]
    pub trust_fingerprint: String,
    /// The number of the stored state this value is (0: not stored yet);
    /// the store numbers every write and refuses one derived from an older
    /// state (a re-verification must never undo a revocation).
    #[serde(default = "crate::domain::stored_before_versions")]
    pub revision: u64,
}

impl LoadedRelease {
    /// Why it is as it is, in words: why it is not verified, what its
    /// retirement does to runs, that a later copy (`refused`, the newest
    /// refused import of its id) was refused while it stayed; otherwise
    /// how it was verified.
    pub fn why(&self, refused: Option<&super::trust::ReleaseVerdict>) -> String {
        if let Some(reason) = &self.reason {
            return reason.clone();
        }
        let mut words = Vec::new();
        if self.lifecycle != Lifecycle::Published {
            let policy = match self.in_flight_policy {
                Some(InFlightPolicy::Finish) => {
                    "running attempts finish, new runs are still dispatched"
                }
                Some(InFlightPolicy::Drain) | None => {
                    "running attempts finish, no new run is dispatched"
                }
                Some(InFlightPolicy::Interrupt) => {
                    "running attempts were interrupted, no new run is dispatched"
                }
            };
            words.push(format!("{:?}: {policy}", self.lifecycle));
        }
        if let Some(v) = refused.filter(|v| v.at > self.imported_at) {
            words.push(format!(
                "a copy imported {} by {} was refused ({}: {}); this one stays {}",
                v.at.format("%Y-%m-%d %H:%M:%S UTC"),
                v.by,
                v.state.as_str().to_lowercase(),
                v.reason.as_deref().unwrap_or(""),
                self.state.as_str()
            ));
        }
        if words.is_empty() {
            format!(
                "signature, content hashes and compatibility checked; signed by {}",
                self.signer.as_deref().unwrap_or("?")
            )
        } else {
            words.join("; ")
        }
    }
}

/// Payload of `execution.releases.v1.release-loaded`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseLoaded<'a> {
    /// The release.
    pub release_id: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Its manifest hash.
    pub manifest_hash: &'a str,
    /// What it was verified against.
    pub adapter_version: &'a str,
}

impl EventPayload for ReleaseLoaded<'_> {
    const TOPIC: &'static str = "execution.releases.v1.release-loaded";
}

/// Payload of `execution.releases.v1.release-load-rejected`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseLoadRejected<'a> {
    /// The release.
    pub release_id: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Why, naming the file, hashes, signer or version.
    pub reason: &'a str,
    /// What it was checked against.
    pub adapter_version: &'a str,
}

impl EventPayload for ReleaseLoadRejected<'_> {
    const TOPIC: &'static str = "execution.releases.v1.release-load-rejected";
}

/// Payload of `execution.releases.v1.release-lifecycle-changed`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseLifecycleChanged<'a> {
    /// The release.
    pub release_id: &'a str,
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// Deprecated or Revoked.
    pub lifecycle: Lifecycle,
    /// What happens to running attempts.
    pub in_flight_policy: InFlightPolicy,
}

impl EventPayload for ReleaseLifecycleChanged<'_> {
    const TOPIC: &'static str = "execution.releases.v1.release-lifecycle-changed";
}

/// What the rule between a stored release and any state written over it
/// reads of the stored one.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredRelease {
    /// The release.
    pub release_id: String,
    /// Its stored version.
    #[serde(default = "crate::domain::stored_before_versions")]
    pub revision: u64,
    /// Its lifecycle.
    pub lifecycle: Lifecycle,
}

impl StoredRelease {
    /// A release's lifecycle only moves forward (Published, Deprecated,
    /// Revoked), so nothing brings a withdrawn release back.
    pub fn check_successor(&self, next: &LoadedRelease) -> Result<(), String> {
        let rank = |l: Lifecycle| match l {
            Lifecycle::Published => 0,
            Lifecycle::Deprecated => 1,
            Lifecycle::Revoked => 2,
        };
        if rank(next.lifecycle) < rank(self.lifecycle) {
            return Err(format!(
                "release {} is {:?}; it cannot become {:?} again",
                self.release_id, self.lifecycle, next.lifecycle
            ));
        }
        Ok(())
    }
}

impl LoadedRelease {
    /// The event that announces a verification or rejection.
    pub fn load_event(&self, now: DateTime<Utc>) -> NewEvent {
        match self.state {
            LoadState::Verified => NewEvent::new(
                &self.tenant_id,
                now,
                &ReleaseLoaded {
                    release_id: &self.release_id,
                    tenant_id: &self.tenant_id,
                    manifest_hash: &self.manifest_hash,
                    adapter_version: &self.adapter_version,
                },
            ),
            LoadState::Untrusted | LoadState::Rejected => NewEvent::new(
                &self.tenant_id,
                now,
                &ReleaseLoadRejected {
                    release_id: &self.release_id,
                    tenant_id: &self.tenant_id,
                    reason: self.reason.as_deref().unwrap_or(""),
                    adapter_version: &self.adapter_version,
                },
            ),
        }
    }

    /// Whether it is verified again when what it was verified against
    /// changes: Verified and Untrusted releases. A Rejected one stays
    /// Rejected (its contents did not match what was signed, or it was
    /// refused at import and kept no contents).
    pub fn reverifiable(&self) -> bool {
        self.state != LoadState::Rejected && !self.content_refs.is_empty()
    }

    /// Deprecates a published release.
    pub fn deprecate(
        &mut self,
        policy: InFlightPolicy,
        now: DateTime<Utc>,
    ) -> Result<NewEvent, DomainError> {
        match self.lifecycle {
            Lifecycle::Published => {}
            Lifecycle::Deprecated if self.in_flight_policy == Some(policy) => {}
            Lifecycle::Deprecated => {}
            Lifecycle::Revoked => {
                return Err(DomainError::FailedPrecondition(format!(
                    "release {} is revoked; it cannot be deprecated",
                    self.release_id
                )));
            }
        }
        self.lifecycle = Lifecycle::Deprecated;
        self.in_flight_policy = Some(policy);
        Ok(self.lifecycle_event(now))
    }

    /// Revokes a release. `finish` lets running attempts end but no new run
    /// starts; revocation never deletes the contents attempts loaded.
    pub fn revoke(
        &mut self,
        policy: InFlightPolicy,
        now: DateTime<Utc>,
    ) -> Result<NewEvent, DomainError> {
        if self.lifecycle == Lifecycle::Revoked && self.in_flight_policy == Some(policy) {
            return Ok(self.lifecycle_event(now));
        }
        self.lifecycle = Lifecycle::Revoked;
        self.in_flight_policy = Some(policy);
        Ok(self.lifecycle_event(now))
    }

    fn lifecycle_event(&self, now: DateTime<Utc>) -> NewEvent {
        NewEvent::new(
            &self.tenant_id,
            now,
            &ReleaseLifecycleChanged {
                release_id: &self.release_id,
                tenant_id: &self.tenant_id,
                lifecycle: self.lifecycle,
                in_flight_policy: self.in_flight_policy.unwrap_or(InFlightPolicy::Finish),
            },
        )
    }

    /// Whether a new run may be dispatched, and why not.
    pub fn dispatchable(&self) -> Result<(), DomainError> {
        match self.state {
            LoadState::Rejected => {
                return Err(DomainError::FailedPrecondition(format!(
                    "release {} was rejected at load and cannot be dispatched: {}",
                    self.release_id,
                    self.reason.as_deref().unwrap_or("no reason recorded")
                )));
            }
            LoadState::Untrusted => {
                return Err(DomainError::FailedPrecondition(format!(
                    "release {} is untrusted and cannot be dispatched until its publisher key is trusted: {}",
                    self.release_id,
                    self.reason.as_deref().unwrap_or("no reason recorded")
                )));
            }
            LoadState::Verified => {}
        }
        match (self.lifecycle, self.in_flight_policy) {
            (Lifecycle::Revoked, _) => Err(DomainError::FailedPrecondition(format!(
                "release {} is revoked and cannot be dispatched",
                self.release_id
            ))),
            (Lifecycle::Deprecated, Some(InFlightPolicy::Drain | InFlightPolicy::Interrupt)) => {
                Err(DomainError::FailedPrecondition(format!(
                    "release {} is deprecated with in-flight policy {}; it takes no new runs",
                    self.release_id,
                    self.in_flight_policy.unwrap_or(InFlightPolicy::Drain)
                )))
            }
            _ => Ok(()),
        }
    }
}

/// Checks that this appliance can run the manifest's adapter and resume its
/// checkpoints. The reason names the version asked and the ones offered.
pub fn check_compatibility(manifest: &Manifest) -> Result<(), String> {
    let offered: Vec<String> = SUPPORTED_ADAPTERS
        .iter()
        .map(|(k, v)| format!("{} {v}", k.as_str()))
        .collect();
    if !SUPPORTED_ADAPTERS
        .iter()
        .any(|(k, v)| *k == manifest.adapter.kind && *v == manifest.adapter.version)
    {
        return Err(format!(
            "adapter {} {} is not supported by this appliance (it runs {})",
            manifest.adapter.kind.as_str(),
            manifest.adapter.version,
            offered.join(", ")
        ));
    }
    if !SUPPORTED_CHECKPOINT_FORMATS.contains(&manifest.checkpoint_format) {
        return Err(format!(
            "checkpoint format {} is not supported by this appliance (it reads {:?})",
            manifest.checkpoint_format, SUPPORTED_CHECKPOINT_FORMATS
        ));
    }
    Ok(())
}

/// The steps of a release's workflow (`workflow.json`: `{"steps": [{"id":
/// ...}]}`); one step named after the agent when it declares none.
pub fn workflow_steps(workflow: &[u8], agent_id: &str) -> Vec<String> {
    let names: Vec<String> = serde_json::from_slice::<Value>(workflow)
        .ok()
        .and_then(|v| v.get("steps").and_then(Value::as_array).cloned())
        .map(|steps| {
            steps
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    s.get("id")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("step-{}", i + 1))
                })
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        vec![agent_id.to_string()]
    } else {
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn site_endpoints_are_host_and_port_or_named_refusals() {
        let tool = |endpoints: Value| -> ToolDescriptor {
            serde_json::from_value(json!({
                "id": "lookup", "sideEffectClass": "read", "transport": "mcp-stdio",
                "inputSchema": {}, "command": ["lookup"], "siteEndpoints": endpoints,
            }))
            .unwrap()
        };
        assert_eq!(
            tool(json!(["tickets.site:8080", "[::1]:9000"]))
                .endpoints()
                .unwrap(),
            vec![
                ("tickets.site".to_string(), 8080),
                ("::1".to_string(), 9000)
            ]
        );
        let err = tool(json!(["tickets.site"])).endpoints().unwrap_err();
        assert!(
            err.contains("not host:port") && err.contains("lookup"),
            "{err}"
        );
        let err = tool(json!(["tickets.site:http"])).endpoints().unwrap_err();
        assert!(err.contains("has no port"), "{err}");
        // Absent, it is not written: manifests without it hash as before.
        let plain = tool(json!([]));
        assert!(
            !serde_json::to_string(&plain)
                .unwrap()
                .contains("siteEndpoints")
        );
    }

    #[test]
    fn canonical_json_sorts_keys_and_drops_whitespace() {
        let a: Value = serde_json::from_str(r#"{ "b": 1, "a": {"d": [1, 2], "c": "x"} }"#).unwrap();
        assert_eq!(
            canonical_json(&a),
            br#"{"a":{"c":"x","d":[1,2]},"b":1}"#.to_vec()
        );
        let b = json!({"a": {"d": [1, 2], "c": "x"}, "b": 1});
        assert_eq!(canonical_json(&a), canonical_json(&b));
    }

    #[test]
    fn canonical_form_of_a_float_reparses_to_itself() {
        // Found by fuzzing: a float printed by the canonical writer must
        // parse back to the same value, or a signed manifest hash drifts.
        let v: Value = serde_json::from_str(r#"{"memoryGb": 0.977777777777777775}"#).unwrap();
        let once = canonical_json(&v);
        let again = canonical_json(&serde_json::from_slice(&once).unwrap());
        assert_eq!(once, again, "{}", String::from_utf8_lossy(&once));
    }

    #[test]
    fn paths_that_leave_the_bundle_are_refused() {
        assert!(check_path("p", "skills/triage.md").is_ok());
        for bad in [
            "../etc/passwd",
            "/etc/passwd",
            "a/../../b",
            "C:\\x",
            "a//b",
            "./a",
            "a\\b",
            "",
        ] {
            assert!(check_path("p", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn policy_defaults_gate_the_risky_classes() {
        let p = Policy {
            revision: "r1".into(),
            side_effects: [(SideEffectClass::External, PolicyRule::Deny)].into(),
            tools: [("deploy".to_string(), PolicyRule::RequireApproval)].into(),
            editable: Default::default(),
            assignee: None,
        };
        assert_eq!(p.rule("search", SideEffectClass::Read), PolicyRule::Allow);
        assert_eq!(
            p.rule("write", SideEffectClass::SharedWrite),
            PolicyRule::RequireApproval
        );
        assert_eq!(p.rule("mail", SideEffectClass::External), PolicyRule::Deny);
        assert_eq!(
            p.rule("deploy", SideEffectClass::Read),
            PolicyRule::RequireApproval
        );
        // An adapter asking approval makes an allowed call wait, and
        // never loosens a denial.
        let asked = |tool, class| p.rule(tool, class).with_approval_asked();
        assert_eq!(
            asked("search", SideEffectClass::Read),
            PolicyRule::RequireApproval
        );
        assert_eq!(asked("mail", SideEffectClass::External), PolicyRule::Deny);
    }
}
