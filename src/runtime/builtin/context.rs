//! Context assembly for the builtin adapter: instructions, skills, the
//! task input and the conversation so far, within the attempt's
//! `maxContextTokens`. Tokens are estimated offline (four bytes a token,
//! plus a little per message), which errs on the generous side for the
//! tokenizers of common open models. The oldest observations give way
//! first.

use serde_json::{Value, json};

/// Estimated tokens of a text (as UTF-8 bytes).
pub fn tokens(text: impl AsRef<[u8]>) -> u32 {
    (text.as_ref().len() as u32).div_ceil(4)
}

/// Estimated tokens of a chat message.
fn message_tokens(m: &Value) -> u32 {
    4 + tokens(m.to_string())
}

/// The context of one model call.
#[derive(Clone, Debug, PartialEq)]
pub struct Context {
    /// Chat messages, system first.
    pub messages: Vec<Value>,
    /// Their estimated size.
    pub tokens: u32,
    /// Observations shortened to fit.
    pub dropped: usize,
}

/// Builds the context: the system message (instructions and skills), the
/// task, then `history` (assistant turns, tool results, corrections).
/// When it does not fit `budget`, tool results are replaced by a note,
/// oldest first; what still does not fit is left for the limit to refuse.
pub fn build(
    instructions: &str,
    skills: &[(String, String)],
    input: &Value,
    history: &[Value],
    budget: u32,
) -> Context {
    let mut system = instructions.to_string();
    for (id, text) in skills {
        system.push_str(&format!("\n\n## Skill: {id}\n\n{text}"));
    }
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": format!("Task input:\n{input}")}),
    ];
    messages.extend(history.iter().cloned());
    let mut total: u32 = messages.iter().map(message_tokens).sum();
    let mut dropped = 0;
    for message in messages.iter_mut().skip(2) {
        if total <= budget {
            break;
        }
        if message["role"] == "tool" {
            let before = message_tokens(message);
            message["content"] = json!("[observation left out to fit the context budget]");
            total = total - before + message_tokens(message);
            dropped += 1;
        }
    }
    Context {
        messages,
        tokens: total,
        dropped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_observations_give_way_first() {
        let big = "x".repeat(4000);
        let history = vec![
            json!({"role": "assistant", "content": "look", "tool_calls": []}),
            json!({"role": "tool", "tool_call_id": "a", "content": big}),
            json!({"role": "tool", "tool_call_id": "b", "content": big}),
        ];
        let all = build("be brief", &[], &json!({"t": 1}), &history, 100_000);
        assert_eq!(all.dropped, 0);
        let fit = build(
            "be brief",
            &[],
            &json!({"t": 1}),
            &history,
            all.tokens - 500,
        );
        assert_eq!(fit.dropped, 1);
        assert!(
            fit.messages[3]["content"]
                .as_str()
                .unwrap()
                .contains("left out")
        );
        assert_eq!(fit.messages[4]["content"].as_str().unwrap().len(), 4000);
        assert!(fit.tokens <= all.tokens - 500);
    }
}
