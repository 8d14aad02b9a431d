//! Token usage: what a model call used, as its server counted it, and the
//! sums the ledger keeps of it (per attempt, per run with the runs it
//! delegated to, per tenant, project, agent and release per UTC day).
//!
//! Sums are added to, never recounted: each call's usage is charged once,
//! in the transaction that records the call's result.

use serde::{Deserialize, Serialize};

/// Tokens of one model call, or a sum of calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    /// Prompt (input) tokens, cached ones included.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion (output) tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Input tokens the server answered from its prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Model calls counted (1 for one call's usage).
    #[serde(default)]
    pub model_calls: u64,
}

/// The most tokens one model call may report, in and out each: above any
/// model's context window, far below what a sum of calls can overflow.
pub const MAX_CALL_TOKENS: u64 = 16_000_000;

impl TokenUsage {
    /// One call's usage, each count at most [`MAX_CALL_TOKENS`].
    pub fn call(input_tokens: u64, output_tokens: u64, cached_tokens: u64) -> TokenUsage {
        let input_tokens = input_tokens.min(MAX_CALL_TOKENS);
        TokenUsage {
            input_tokens,
            output_tokens: output_tokens.min(MAX_CALL_TOKENS),
            cached_tokens: cached_tokens.min(input_tokens),
            model_calls: 1,
        }
    }

    /// One call's usage as an adapter reports it: refused, naming the
    /// field (under `field`) and the limit, where a count is above
    /// [`MAX_CALL_TOKENS`].
    pub fn reported(
        field: &str,
        input_tokens: u64,
        output_tokens: u64,
        cached_tokens: u64,
    ) -> Result<TokenUsage, super::FieldError> {
        for (name, n) in [
            ("inputTokens", input_tokens),
            ("outputTokens", output_tokens),
            ("cachedTokens", cached_tokens),
        ] {
            if n > MAX_CALL_TOKENS {
                return Err(super::FieldError::new(
                    format!("{field}.{name}"),
                    format!("is {n}; one model call reports at most {MAX_CALL_TOKENS} tokens"),
                ));
            }
        }
        // More cached than sent counts as all of it cached.
        Ok(TokenUsage::call(input_tokens, output_tokens, cached_tokens))
    }

    /// Input and output tokens: what budgets and quotas count.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds `other` to this sum.
    pub fn add(&mut self, other: &TokenUsage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.model_calls = self.model_calls.saturating_add(other.model_calls);
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == TokenUsage::default()
    }
}

/// The kinds of tokens, as the metrics label them.
pub const KINDS: [&str; 3] = ["input", "output", "cached"];

impl TokenUsage {
    /// The count of one of [`KINDS`].
    pub fn of_kind(&self, kind: &str) -> u64 {
        match kind {
            "input" => self.input_tokens,
            "output" => self.output_tokens,
            "cached" => self.cached_tokens,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_add_and_a_call_caps_its_cached_tokens_at_its_input() {
        let mut sum = TokenUsage::default();
        sum.add(&TokenUsage::call(100, 20, 150));
        sum.add(&TokenUsage::call(50, 5, 10));
        assert_eq!(
            sum,
            TokenUsage {
                input_tokens: 150,
                output_tokens: 25,
                cached_tokens: 110,
                model_calls: 2
            }
        );
        assert_eq!(sum.total(), 175);
        assert_eq!(sum.of_kind("cached"), 110);
    }
}
