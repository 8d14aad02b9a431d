//! Model calls of the builtin adapter: an OpenAI-compatible chat
//! completions client for the model servers sites run offline (llama.cpp
//! server, vLLM, Ollama), and a scripted model that replays the responses
//! written in the release, for demos and tests.

use std::time::{Duration, Instant};

use super::words::in_words;
use crate::domain::attempt::CallFence;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::domain::release::{ModelKind, ModelProfile};

/// A tool call the model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// The model's id for the call (answers refer to it).
    pub id: String,
    /// The tool id.
    pub tool: String,
    /// Its arguments.
    pub arguments: Value,
}

/// What the model answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelReply {
    /// Text (the final answer when there are no tool calls).
    pub content: Option<String>,
    /// Tools to call.
    pub tool_calls: Vec<ToolCall>,
    /// Prompt tokens, as the server counted them.
    pub input_tokens: u32,
    /// Completion tokens.
    pub output_tokens: u32,
    /// Prompt tokens the server answered from its cache.
    #[serde(default)]
    pub cached_tokens: u32,
    /// The model that answered.
    pub model: String,
    /// Milliseconds the call took.
    pub latency_ms: u64,
    /// Which of a profile's servers answered, when another was tried
    /// first (not part of the answer: the receipt's `servedBy` says it).
    #[serde(skip)]
    pub route: Option<String>,
}

impl ModelReply {
    /// The tokens the ledger charges for this answer.
    pub fn usage(&self) -> crate::domain::usage::TokenUsage {
        crate::domain::usage::TokenUsage::call(
            self.input_tokens.into(),
            self.output_tokens.into(),
            self.cached_tokens.into(),
        )
    }
}

/// Why a model call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// Worth trying again (timeout, connection refused, 429, 5xx).
    #[error("{0}")]
    Transient(String),
    /// Not worth trying again (4xx, a malformed answer, no script left).
    #[error("{0}")]
    Fatal(String),
    /// No server of the profile could serve now (each refused the
    /// connection, sent nothing in time, or answered 429, 502, 503 or
    /// 504): a site profile's server is marked down and the call waits
    /// for it; a release's own endpoint is tried again as a transient
    /// failure.
    #[error("{0}")]
    Unavailable(String),
}

/// A model the builtin adapter can call.
pub enum Model {
    /// Replays recorded responses by turn.
    Scripted {
        /// The responses.
        responses: Vec<Value>,
    },
    /// An OpenAI-compatible profile whose release carries no endpoint and
    /// that the site maps to none: every call fails and says so.
    Unmapped {
        /// The profile id.
        profile: String,
    },
    /// An OpenAI-compatible `/chat/completions` endpoint, or a site
    /// profile's servers in the order a call tries them.
    OpenAi {
        /// Base URLs, e.g. `http://127.0.0.1:8080/v1`: the first, then
        /// each a call moves to when the one before cannot serve now.
        endpoints: Vec<String>,
        /// The server as failures name it to the tenant: the release's
        /// own endpoint (the release names it), or a site profile (whose
        /// address is the site's, not the tenant's).
        server: String,
        /// Model name.
        model: String,
        /// Bearer key, if the server wants one (never logged).
        api_key: Option<String>,
        /// Per-call timeout.
        timeout: Duration,
        /// Longest a streamed answer may go without a byte.
        idle: Duration,
        /// Whether the server is the site's (a site profile's): its
        /// address is then never in what the tenant reads.
        site: bool,
        /// Sampling temperature.
        temperature: Option<f64>,
        /// Completion budget.
        max_tokens: Option<u32>,
    },
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Model::Scripted { responses } => write!(f, "Scripted({} responses)", responses.len()),
            Model::Unmapped { profile } => write!(f, "Unmapped({profile})"),
            Model::OpenAi {
                endpoints, model, ..
            } => write!(f, "OpenAi({endpoints:?}, {model})"),
        }
    }
}

impl Model {
    /// The model of a release's profile. `responses` is the release's
    /// `modelResponses` file (scripted profiles); `api_key` the configured
    /// key the profile refers to.
    pub fn of(
        profile: &ModelProfile,
        responses: Option<&[u8]>,
        api_key: Option<String>,
        idle: Duration,
    ) -> Result<Model, String> {
        match profile.kind {
            ModelKind::Scripted => {
                let doc: Value = serde_json::from_slice(responses.unwrap_or(b"[]"))
                    .map_err(|e| format!("the scripted responses are not JSON: {e}"))?;
                let list = doc
                    .get("responses")
                    .cloned()
                    .unwrap_or(doc)
                    .as_array()
                    .cloned()
                    .ok_or("the scripted responses are not a list")?;
                Ok(Model::Scripted { responses: list })
            }
            ModelKind::OpenaiCompatible if profile.endpoint.is_none() => Ok(Model::Unmapped {
                profile: profile.id.clone(),
            }),
            ModelKind::OpenaiCompatible => {
                let endpoint = profile
                    .endpoint
                    .clone()
                    .unwrap_or_default()
                    .trim_end_matches('/')
                    .to_string();
                Ok(Model::OpenAi {
                    server: endpoint.clone(),
                    endpoints: vec![endpoint],
                    model: profile.model.clone().unwrap_or_default(),
                    api_key,
                    timeout: Duration::from_secs(profile.timeout_seconds.unwrap_or(120).into()),
                    idle,
                    site: false,
                    temperature: profile.temperature,
                    max_tokens: profile.max_tokens,
                })
            }
        }
    }

    /// The model a site profile points at, with the release's sampling
    /// settings.
    pub fn site(
        site: &crate::domain::model_profile::SiteModelProfile,
        release: &ModelProfile,
        api_key: Option<String>,
        idle: Duration,
    ) -> Model {
        Model::OpenAi {
            endpoints: site.servers(),
            server: format!("of site model profile {}", site.profile_id),
            model: site.model.clone(),
            api_key,
            timeout: Duration::from_secs(site.timeout_seconds.into()),
            idle,
            site: true,
            temperature: release.temperature,
            max_tokens: release.max_tokens,
        }
    }

    /// One chat completion. `turn` is the number of model answers the
    /// attempt has observed (the scripted model's position).
    pub async fn complete(
        &self,
        http: &reqwest::Client,
        messages: &[Value],
        tools: &[Value],
        turn: u32,
        fence: &CallFence,
        sink: Option<&crate::runtime::text::TextSink>,
    ) -> Result<ModelReply, ModelError> {
        let started = Instant::now();
        match self {
            Model::Unmapped { profile } => Err(ModelError::Fatal(format!(
                "model profile {profile} has no endpoint in the release and none on this site: `agentbay model put {profile} --endpoint URL --model NAME` maps it"
            ))),
            Model::Scripted { responses } => {
                let Some(r) = responses.get(turn as usize) else {
                    return Err(ModelError::Fatal(format!(
                        "the scripted model has {} responses and was asked for response {}",
                        responses.len(),
                        turn + 1
                    )));
                };
                let tool_calls = r
                    .get("toolCalls")
                    .and_then(Value::as_array)
                    .map(|calls| {
                        calls
                            .iter()
                            .enumerate()
                            .map(|(i, c)| ToolCall {
                                id: format!("call-{turn}-{i}"),
                                tool: c
                                    .get("tool")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_string(),
                                arguments: c.get("arguments").cloned().unwrap_or(json!({})),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let content = r.get("content").and_then(Value::as_str).map(str::to_string);
                let prompt: usize = messages.iter().map(|m| m.to_string().len()).sum();
                // A response may say what its server counted (`usage`, as
                // an OpenAI answer does); else the sizes are estimated.
                let (input, output, cached) = match r.get("usage") {
                    Some(u) => usage_of(u),
                    None => (
                        (prompt / 4) as u32,
                        content.as_deref().map(super::context::tokens).unwrap_or(0),
                        0,
                    ),
                };
                Ok(ModelReply {
                    output_tokens: output,
                    content,
                    tool_calls,
                    input_tokens: input,
                    cached_tokens: cached,
                    model: "scripted".into(),
                    latency_ms: started.elapsed().as_millis() as u64,
                    route: None,
                })
            }
            Model::OpenAi {
                endpoints,
                server,
                model,
                api_key,
                timeout,
                idle,
                site,
                temperature,
                max_tokens,
            } => {
                let mut body = json!({"model": model, "messages": messages});
                if !tools.is_empty() {
                    body["tools"] = Value::Array(tools.to_vec());
                }
                if let Some(t) = temperature {
                    body["temperature"] = json!(t);
                }
                if let Some(m) = max_tokens {
                    body["max_tokens"] = json!(m);
                }
                let ask = Ask {
                    http,
                    body: &body,
                    api_key: api_key.as_deref(),
                    timeout: *timeout,
                    idle: *idle,
                    site: *site,
                    fence,
                    sink,
                };
                // A server that cannot serve now passes the call to the
                // next; one that answered anything else is the answer.
                let mut moves: Vec<String> = Vec::new();
                // Whether a server that could not serve may have had the
                // request (it sent nothing in time): then the call is not
                // known unmade, and is tried again by today's rules.
                let mut reached = false;
                let n = endpoints.len();
                for (i, endpoint) in endpoints.iter().enumerate() {
                    let name = if n > 1 {
                        format!("{} of {n} {server}", i + 1)
                    } else {
                        server.clone()
                    };
                    let after = |text: String| match moves.is_empty() {
                        true => text,
                        false => format!("{text}, after {}", moves.join("; ")),
                    };
                    match ask.once(endpoint, &name).await {
                        Ok(v) => {
                            let mut reply = parse_chat(&v, turn, started)?;
                            if !moves.is_empty() {
                                reply.route = Some(after(format!("server {} of {n}", i + 1)));
                            }
                            return Ok(reply);
                        }
                        Err(Failed::CannotServeNow(why, timed_out)) if i + 1 < n => {
                            reached |= timed_out;
                            moves.push(format!("server {} could not serve ({why})", i + 1));
                        }
                        Err(Failed::CannotServeNow(why, timed_out)) => {
                            let why = after(format!("model server {name} could not serve: {why}"));
                            return Err(if reached || timed_out {
                                ModelError::Transient(why)
                            } else {
                                ModelError::Unavailable(why)
                            });
                        }
                        Err(Failed::Transient(e)) => return Err(ModelError::Transient(after(e))),
                        Err(Failed::Fatal(e)) => return Err(ModelError::Fatal(after(e))),
                    }
                }
                Err(ModelError::Fatal(format!(
                    "model {server} has no server to ask"
                )))
            }
        }
    }
}

/// One chat completion request, as each server of a profile is asked it.
struct Ask<'a> {
    http: &'a reqwest::Client,
    body: &'a Value,
    api_key: Option<&'a str>,
    timeout: Duration,
    idle: Duration,
    site: bool,
    fence: &'a CallFence,
    /// Where the answer's text goes as it arrives.
    sink: Option<&'a crate::runtime::text::TextSink>,
}

/// Why one server did not answer.
enum Failed {
    /// It says it cannot serve now and the request did not start there:
    /// the connection was refused or not made, nothing came back before
    /// the timeout, or it answered 429, 502, 503 or 504. The next server
    /// of the profile is asked. With whether it timed out (the request
    /// may have reached it).
    CannotServeNow(String, bool),
    /// It may have started the request, or failed it (500, a broken-off
    /// answer): tried again by the attempt's rules, not moved.
    Transient(String),
    /// The request is wrong for it (400, 401, 403, context too long) or
    /// its answer is not one: never moved.
    Fatal(String),
}

impl Ask<'_> {
    /// Asks the server at `endpoint` (`name`: what failures call it) for
    /// a streamed answer, so that a long answer is seen arriving and a
    /// stalled one is given up on after `idle`, not only after the whole
    /// timeout (the usage comes in the last chunk); a server that refuses
    /// streaming (400 naming it) is asked again without. Its answer as
    /// JSON.
    async fn once(&self, endpoint: &str, name: &str) -> Result<Value, Failed> {
        let mut streamed = self.body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        match self.send(endpoint, name, &streamed).await {
            Err(Failed::Fatal(why)) if why.contains("with 400") && why.contains("stream") => {
                self.send(endpoint, name, self.body).await
            }
            other => other,
        }
    }

    async fn send(&self, endpoint: &str, name: &str, body: &Value) -> Result<Value, Failed> {
        let mut request = self
            .http
            .post(format!("{endpoint}/chat/completions"))
            .timeout(self.timeout)
            .json(body);
        if let Some(key) = self.api_key {
            request = request.bearer_auth(key);
        }
        for (header, value) in self.fence.headers() {
            request = request.header(header, value);
        }
        let response = request.send().await.map_err(|e| {
            let e = self.shown(e);
            let why = format!("model server {name} did not answer: {}", in_words(&e));
            if e.is_connect() || e.is_timeout() {
                Failed::CannotServeNow(in_words(&e), e.is_timeout())
            } else {
                Failed::Transient(why)
            }
        })?;
        let status = response.status();
        let streamed = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|t| t.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let mut answer = Answer {
            response,
            idle: self.idle,
            name,
            site: self.site,
            read: Vec::new(),
            sink: self.sink,
        };
        if streamed && status.is_success() {
            return answer.streamed().await;
        }
        let text = answer.whole().await?;
        let said = || text.chars().take(200).collect::<String>();
        if matches!(status.as_u16(), 429 | 502 | 503 | 504) {
            return Err(Failed::CannotServeNow(
                format!("{status}: {}", said()),
                false,
            ));
        }
        if status.is_server_error() {
            return Err(Failed::Transient(format!(
                "model server {name} answered {status}: {}",
                said()
            )));
        }
        if !status.is_success() {
            return Err(Failed::Fatal(format!(
                "model server {name} refused the request with {status}: {}",
                said()
            )));
        }
        // A server that does not stream answers whole.
        serde_json::from_str(&text).map_err(|e| {
            Failed::Fatal(format!(
                "model server {name} answered something that is not JSON: {e}"
            ))
        })
    }
}

impl Ask<'_> {
    /// `e` as the tenant may read it: without the address of a site's
    /// server.
    fn shown(&self, e: reqwest::Error) -> reqwest::Error {
        if self.site { e.without_url() } else { e }
    }
}

/// The most of one answer read from a model server, bytes: a larger one
/// is refused, not held.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// A model server's answer as it arrives.
struct Answer<'a> {
    response: reqwest::Response,
    idle: Duration,
    name: &'a str,
    site: bool,
    read: Vec<u8>,
    sink: Option<&'a crate::runtime::text::TextSink>,
}

impl Answer<'_> {
    /// The next bytes, none at the end: a gap longer than `idle` or an
    /// answer past [`MAX_ANSWER`] ends it with why.
    async fn next(&mut self) -> Result<Option<bytes::Bytes>, Failed> {
        let name = self.name;
        let chunk = tokio::time::timeout(self.idle, self.response.chunk())
            .await
            .map_err(|_| {
                Failed::Transient(format!(
                    "model server {name} sent nothing for {} s in the middle of its answer (runtime.model_stream_idle_seconds)",
                    self.idle.as_secs()
                ))
            })?
            .map_err(|e| {
                let e = if self.site { e.without_url() } else { e };
                Failed::Transient(format!(
                    "model server {name} broke off its answer: {}",
                    in_words(&e)
                ))
            })?;
        if let Some(c) = &chunk
            && self.read.len() + c.len() > MAX_ANSWER
        {
            return Err(Failed::Fatal(format!(
                "model server {name} answered more than {} MiB",
                MAX_ANSWER >> 20
            )));
        }
        Ok(chunk)
    }

    /// The whole answer as text.
    async fn whole(&mut self) -> Result<String, Failed> {
        while let Some(chunk) = self.next().await? {
            self.read.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&self.read).into_owned())
    }

    /// A streamed answer (server-sent events of chat completion chunks),
    /// put together as the answer a server that does not stream gives.
    async fn streamed(&mut self) -> Result<Value, Failed> {
        let mut whole = Streamed::default();
        let mut line = Vec::new();
        while let Some(chunk) = self.next().await? {
            self.read.extend_from_slice(&chunk);
            for &b in chunk.iter() {
                if b != b'\n' {
                    line.push(b);
                    continue;
                }
                let done = whole.line(&line).map_err(|e| self.broken(e))?;
                if let Some(sink) = self.sink
                    && !whole.fresh.is_empty()
                {
                    sink.push(&std::mem::take(&mut whole.fresh));
                }
                if done {
                    return Ok(whole.answer());
                }
                line.clear();
            }
        }
        if whole.line(&line).map_err(|e| self.broken(e))? || whole.chunks > 0 {
            return Ok(whole.answer());
        }
        Err(self.broken("the stream ended before any chunk".into()))
    }

    fn broken(&self, why: String) -> Failed {
        Failed::Transient(format!("model server {}'s stream: {why}", self.name))
    }
}

/// A streamed answer so far.
#[derive(Default)]
struct Streamed {
    chunks: usize,
    model: String,
    content: Option<String>,
    /// Text that came since it was last taken.
    fresh: String,
    tool_calls: Vec<Value>,
    usage: Option<Value>,
}

impl Streamed {
    /// Takes one line of the stream: true at its end (`data: [DONE]`).
    fn line(&mut self, line: &[u8]) -> Result<bool, String> {
        let line = String::from_utf8_lossy(line);
        let line = line.trim_end_matches('\r');
        let Some(data) = line.strip_prefix("data:") else {
            // Comments, event names, ids and the blank line between events.
            return Ok(false);
        };
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("a chunk is not JSON: {e}"))?;
        if let Some(error) = chunk.get("error") {
            return Err(format!(
                "the server failed mid-answer: {}",
                error.to_string().chars().take(200).collect::<String>()
            ));
        }
        self.chunks += 1;
        if let Some(m) = chunk.get("model").and_then(Value::as_str)
            && !m.is_empty()
        {
            self.model = m.to_string();
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(delta) = chunk.pointer("/choices/0/delta") else {
            return Ok(false);
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            self.content.get_or_insert_default().push_str(text);
            self.fresh.push_str(text);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let i = call.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            if i >= 128 {
                return Err(format!("tool call index {i} is past 127"));
            }
            if self.tool_calls.len() <= i {
                self.tool_calls
                    .resize(i + 1, json!({"function": {"name": "", "arguments": ""}}));
            }
            let whole = &mut self.tool_calls[i];
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                whole["id"] = json!(id);
            }
            for part in ["name", "arguments"] {
                if let Some(more) = call
                    .pointer(&format!("/function/{part}"))
                    .and_then(Value::as_str)
                {
                    let so_far = whole["function"][part].as_str().unwrap_or_default();
                    whole["function"][part] = json!(format!("{so_far}{more}"));
                }
            }
        }
        Ok(false)
    }

    /// The answer it came to, shaped as a whole chat completion.
    fn answer(self) -> Value {
        let mut message = json!({"role": "assistant", "content": self.content});
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(self.tool_calls);
        }
        json!({
            "model": self.model,
            "choices": [{"index": 0, "message": message}],
            "usage": self.usage,
        })
    }
}

/// Reads an OpenAI chat completion.
/// Prompt, completion and cached tokens of an OpenAI `usage` object.
fn usage_of(u: &Value) -> (u32, u32, u32) {
    let n = |path: &str| u.pointer(path).and_then(Value::as_u64).unwrap_or(0) as u32;
    (
        n("/prompt_tokens"),
        n("/completion_tokens"),
        n("/prompt_tokens_details/cached_tokens"),
    )
}

fn parse_chat(v: &Value, turn: u32, started: Instant) -> Result<ModelReply, ModelError> {
    let usage = v.get("usage").map(usage_of).unwrap_or_default();
    let message = v
        .pointer("/choices/0/message")
        .ok_or_else(|| ModelError::Fatal("the model's answer has no choices[0].message".into()))?;
    let mut tool_calls = Vec::new();
    for (i, c) in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = c
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ModelError::Fatal(format!(
                    "tool call {i} of the model's answer has no function name"
                ))
            })?;
        let arguments = match c.pointer("/function/arguments") {
            Some(Value::String(s)) => {
                serde_json::from_str(s).unwrap_or_else(|_| json!({"_unparsed": s}))
            }
            Some(other) => other.clone(),
            None => json!({}),
        };
        tool_calls.push(ToolCall {
            id: c
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("call-{turn}-{i}")),
            tool: name.to_string(),
            arguments,
        });
    }
    Ok(ModelReply {
        content: message
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_string),
        tool_calls,
        input_tokens: usage.0,
        output_tokens: usage.1,
        cached_tokens: usage.2,
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        latency_ms: started.elapsed().as_millis() as u64,
        route: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A streamed answer's tool calls come in pieces by index: the name
    /// once, the arguments in parts; the usage in a last chunk without
    /// choices; comments and CRLF line ends are read past.
    #[test]
    fn a_streamed_answer_is_put_together_as_a_whole_one() {
        let mut whole = Streamed::default();
        let lines = [
            ": keep-alive",
            r#"data: {"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"lookup","arguments":""}}]}}]}"#,
            "",
            r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"customer\":"}}]}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"c2","function":{"name":"page","arguments":"{}"}}]}}]}"#,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"acme\\\"}\"}}]}}]}\r",
            r#"data: {"choices":[],"usage":{"prompt_tokens":90,"completion_tokens":7}}"#,
        ];
        for line in lines {
            assert!(!whole.line(line.as_bytes()).unwrap(), "{line}");
        }
        assert!(whole.line(b"data: [DONE]").unwrap());
        let reply = parse_chat(&whole.answer(), 0, Instant::now()).unwrap();
        assert_eq!(reply.model, "m");
        assert_eq!(reply.content, None);
        assert_eq!(reply.tool_calls.len(), 2);
        assert_eq!(reply.tool_calls[0].id, "c1");
        assert_eq!(reply.tool_calls[0].tool, "lookup");
        assert_eq!(reply.tool_calls[0].arguments, json!({"customer": "acme"}));
        assert_eq!(reply.tool_calls[1].tool, "page");
        assert_eq!((reply.input_tokens, reply.output_tokens), (90, 7));
    }

    /// A chunk that is not JSON, an error in the stream or a tool call
    /// index past the bound ends the answer with why.
    #[test]
    fn a_broken_stream_says_why() {
        let mut whole = Streamed::default();
        assert!(whole.line(b"data: {nope").unwrap_err().contains("not JSON"));
        let error = whole
            .line(br#"data: {"error":{"message":"out of memory"}}"#)
            .unwrap_err();
        assert!(error.contains("out of memory"), "{error}");
        let far = whole
            .line(br#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":100000}]}}]}"#)
            .unwrap_err();
        assert!(far.contains("past 127"), "{far}");
    }
}
