//! What a call asked and answered, made readable: the artifact behind a
//! hash, shown as text capped at a readable size, and a model call's
//! messages as a conversation. Pure: the caller reads the bytes. And the
//! address content is stored under: its [`content_hash`].

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::retention::Tombstone;

/// Whether `text` has the form of a [`content_hash`]: `sha256:` and 64
/// lower-case hex digits.
pub fn is_content_hash(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `sha256:<hex>` of bytes.
pub fn content_hash(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The most of one artifact a page shows inline, in characters; the whole
/// artifact is a link away.
pub const SHOWN_CHARS: usize = 4000;

/// The most of one message of a conversation shown inline, in characters.
pub const MESSAGE_CHARS: usize = 1500;

/// The messages of a long conversation shown inline: the last ones (the
/// earlier ones were shown with the calls before).
pub const SHOWN_MESSAGES: usize = 8;

/// One artifact as a reader sees it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Shown {
    /// `sha256:<hex>`.
    pub hash: String,
    /// Where it is.
    pub state: ContentState,
    /// Its bytes.
    pub bytes: usize,
    /// Indented JSON, or the text as stored, cut at [`SHOWN_CHARS`].
    pub text: String,
    /// Whether `text` was cut.
    pub truncated: bool,
    /// The content as JSON, when it is JSON (whole, for the API).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    /// The tombstone of purged content, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purged: Option<String>,
}

/// Whether the content behind a hash can be shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum ContentState {
    /// Here.
    Present,
    /// Removed by retention; the record's tombstone says when and why.
    Purged,
    /// Not in the tenant's artifact store (never stored, or removed
    /// without a tombstone on this record).
    Missing,
}

impl Shown {
    /// Shows `bytes` stored under `hash`: JSON indented, text as it is,
    /// anything else as a note of its size.
    pub fn of(hash: &str, bytes: &[u8]) -> Shown {
        let json: Option<Value> = serde_json::from_slice(bytes).ok();
        let full = match &json {
            // A JSON string (a question, an answer) reads as its text.
            Some(Value::String(text)) => text.clone(),
            Some(v) => serde_json::to_string_pretty(v).expect("a value serialises"),
            None => match std::str::from_utf8(bytes) {
                Ok(text) => text.to_string(),
                Err(_) => format!("({} bytes of binary content)", bytes.len()),
            },
        };
        let (text, truncated) = cut(&full, SHOWN_CHARS);
        Shown {
            hash: hash.to_string(),
            state: ContentState::Present,
            bytes: bytes.len(),
            text,
            truncated,
            json,
            purged: None,
        }
    }

    /// Content that retention removed.
    pub fn purged(hash: &str, tombstone: &Tombstone) -> Shown {
        Shown {
            purged: Some(tombstone.describe()),
            ..Shown::absent(hash, ContentState::Purged)
        }
    }

    /// Content that is not there.
    pub fn missing(hash: &str) -> Shown {
        Shown::absent(hash, ContentState::Missing)
    }

    fn absent(hash: &str, state: ContentState) -> Shown {
        Shown {
            hash: hash.to_string(),
            state,
            bytes: 0,
            text: String::new(),
            truncated: false,
            json: None,
            purged: None,
        }
    }

    /// Whether there is content to show.
    pub fn is_present(&self) -> bool {
        self.state == ContentState::Present
    }
}

/// `text` cut at `max` characters (on a character boundary), and whether
/// it was cut.
pub fn cut(text: &str, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (text[..at].to_string(), true),
        None => (text.to_string(), false),
    }
}

/// One message of a model conversation.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its text, cut at [`MESSAGE_CHARS`].
    pub text: String,
    /// Whether `text` was cut.
    pub truncated: bool,
    /// The tools an assistant message asked for: name and arguments.
    pub tool_calls: Vec<ToolCall>,
    /// The tool a `tool` message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answers: Option<String>,
}

/// A tool call a model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// The tool.
    pub tool: String,
    /// Its arguments, as text.
    pub arguments: String,
}

/// A model call's conversation: the messages it sent (the last
/// [`SHOWN_MESSAGES`]) and how many came before them.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Conversation {
    /// Messages before the ones shown.
    pub earlier: usize,
    /// The messages shown, oldest first.
    pub messages: Vec<Message>,
}

impl Conversation {
    /// The conversation of a chat-completions request (`{"messages":
    /// [...]}`), or `None` when the request is not one.
    pub fn of_request(request: &Value) -> Option<Conversation> {
        let all = request.get("messages")?.as_array()?;
        let messages: Vec<Message> = all.iter().filter_map(message).collect();
        if messages.is_empty() {
            return None;
        }
        let earlier = messages.len().saturating_sub(SHOWN_MESSAGES);
        Some(Conversation {
            earlier,
            messages: messages.into_iter().skip(earlier).collect(),
        })
    }

    /// The assistant's reply of a model call's result: its text (`content`)
    /// and the tools it asked for (`toolCalls` or `tool_calls`).
    pub fn reply(result: &Value) -> Option<Message> {
        let text = result.get("content")?;
        let mut reply = json_message("assistant", text);
        let calls = result
            .get("toolCalls")
            .or_else(|| result.get("tool_calls"))
            .and_then(Value::as_array);
        reply.tool_calls = calls.map(|c| tool_calls(c)).unwrap_or_default();
        Some(reply)
    }
}

fn json_message(role: &str, content: &Value) -> Message {
    let full = match content {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        // Content parts (`[{"type":"text","text":...}]`) or anything else.
        Value::Array(parts)
            if parts
                .iter()
                .all(|p| p.get("text").and_then(Value::as_str).is_some()) =>
        {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        }
        other => serde_json::to_string_pretty(other).expect("a value serialises"),
    };
    let (text, truncated) = cut(&full, MESSAGE_CHARS);
    Message {
        role: role.to_string(),
        text,
        truncated,
        tool_calls: Vec::new(),
        answers: None,
    }
}

fn message(m: &Value) -> Option<Message> {
    let role = m.get("role")?.as_str()?;
    let mut out = json_message(role, m.get("content").unwrap_or(&Value::Null));
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        out.tool_calls = tool_calls(calls);
    }
    out.answers = m
        .get("name")
        .or_else(|| m.get("tool_call_id"))
        .and_then(Value::as_str)
        .filter(|_| role == "tool")
        .map(str::to_string);
    Some(out)
}

fn tool_calls(calls: &[Value]) -> Vec<ToolCall> {
    calls
        .iter()
        .map(|c| {
            // OpenAI's shape, or the flat one the builtin loop records.
            let f = c.get("function").unwrap_or(c);
            let tool = f
                .get("name")
                .or_else(|| f.get("tool"))
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string();
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            ToolCall {
                tool,
                arguments: cut(&arguments, MESSAGE_CHARS).0,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_is_indented_and_long_content_cut_on_a_character() {
        let shown = Shown::of("sha256:a", br#"{"b":1,"a":"x"}"#);
        assert_eq!(shown.text, "{\n  \"a\": \"x\",\n  \"b\": 1\n}");
        assert!(!shown.truncated && shown.is_present());
        let long = "é".repeat(SHOWN_CHARS + 10);
        let shown = Shown::of("sha256:b", long.as_bytes());
        assert!(shown.truncated);
        assert_eq!(shown.text.chars().count(), SHOWN_CHARS);
        assert!(shown.json.is_none());
        let question = Shown::of("sha256:d", br#""How many users?""#);
        assert_eq!(question.text, "How many users?");
        let binary = Shown::of("sha256:c", &[0xff, 0xfe, 0x00]);
        assert_eq!(binary.text, "(3 bytes of binary content)");
    }

    #[test]
    fn a_chat_request_reads_as_a_conversation_with_its_tool_calls() {
        let mut messages = vec![
            json!({"role": "system", "content": "You triage."}),
            json!({"role": "user", "content": "Task input: checkout down"}),
            json!({"role": "assistant", "content": "Paging", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "page-oncall", "arguments": "{\"message\":\"down\"}"}}
            ]}),
            json!({"role": "tool", "tool_call_id": "c1", "name": "page-oncall", "content": "{\"paged\":true}"}),
        ];
        let c = Conversation::of_request(&json!({"messages": messages, "tools": []})).unwrap();
        assert_eq!(c.earlier, 0);
        assert_eq!(c.messages.len(), 4);
        assert_eq!(c.messages[2].tool_calls[0].tool, "page-oncall");
        assert_eq!(
            c.messages[2].tool_calls[0].arguments,
            "{\"message\":\"down\"}"
        );
        assert_eq!(c.messages[3].answers.as_deref(), Some("page-oncall"));
        for i in 0..10 {
            messages.push(json!({"role": "user", "content": format!("more {i}")}));
        }
        let c = Conversation::of_request(&json!({ "messages": messages })).unwrap();
        assert_eq!(c.earlier, 14 - SHOWN_MESSAGES);
        assert_eq!(c.messages.last().unwrap().text, "more 9");
        assert!(Conversation::of_request(&json!({"ticket": 1})).is_none());
    }

    #[test]
    fn a_model_result_reads_as_the_assistants_reply() {
        let r = Conversation::reply(&json!({
            "content": "", "toolCalls": [{"id": "x", "tool": "sum", "arguments": {"a": 1}}]
        }))
        .unwrap();
        assert_eq!(r.role, "assistant");
        assert_eq!(r.tool_calls[0].tool, "sum");
        assert_eq!(r.tool_calls[0].arguments, "{\"a\":1}");
        assert!(Conversation::reply(&json!({"severity": "low"})).is_none());
    }
}
