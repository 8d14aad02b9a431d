//! A structural diff of two JSON documents: what the checkpoints page shows
//! between two checkpoints of an attempt. Pure, and bounded: whatever the
//! documents, it lists at most a [`Budget`] of changes and bytes and counts
//! the rest.
//!
//! Objects are compared key by key, arrays index by index; a value whose
//! type differs is one change. Paths are JSON Pointers (RFC 6901), so a
//! change names exactly where it is; a path or value is kept only as far
//! as it is shown ([`SHOWN`] characters, then `…`). A long text that is
//! base64 (an adapter's serialized data, such as a LangGraph checkpoint
//! beside its readable values) is shown as what it is, not as its
//! characters.

use serde::Serialize;
use serde_json::Value;

/// One difference between two documents, as shown.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// Where, as a JSON Pointer (`""` is the whole document), cut at
    /// [`SHOWN`] characters.
    pub path: String,
    /// added, removed or changed.
    pub kind: ChangeKind,
    /// The value before as JSON, cut at [`SHOWN`] characters (absent when
    /// added).
    pub before: Option<String>,
    /// The value after, likewise (absent when removed).
    pub after: Option<String>,
}

/// What happened at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// Only in the second document.
    Added,
    /// Only in the first.
    Removed,
    /// In both, with another value.
    Changed,
}

impl ChangeKind {
    /// As shown.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed => "changed",
        }
    }
}

/// Characters of a path or a value kept for a change.
pub const SHOWN: usize = 300;

/// How much of a diff is listed: changes, and bytes of their paths and
/// values together.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub changes: usize,
    pub bytes: usize,
}

/// What the checkpoints page lists.
pub const PAGE: Budget = Budget {
    changes: 500,
    bytes: 256 * 1024,
};

/// The changes that turn one document into another, in document order, as
/// far as the budget lists them, and how many more there are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diff {
    pub changes: Vec<Change>,
    pub more: u64,
}

/// The changes that turn `before` into `after`, within `budget`.
pub fn diff(before: &Value, after: &Value, budget: Budget) -> Diff {
    let mut walk = Walk {
        path: String::new(),
        budget,
        bytes: 0,
        out: Diff::default(),
    };
    walk.values(before, after);
    walk.out
}

/// A key as a JSON Pointer token: `~` and `/` escaped.
fn push_token(path: &mut String, key: &str) {
    path.push('/');
    for c in key.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

/// A value as JSON, at most [`SHOWN`] characters (then `…`): no more is
/// ever written, whatever its size.
fn shown(v: &Value) -> String {
    if let Value::String(text) = v
        && is_serialized(text)
    {
        return format!("(serialized data: {} base64 characters)", text.len());
    }
    struct Upto(Vec<u8>);
    impl std::io::Write for Upto {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            // Enough bytes for SHOWN characters of any width.
            let room = (SHOWN * 4 + 4).saturating_sub(self.0.len());
            if room == 0 {
                return Err(std::io::Error::other("shown"));
            }
            let n = buf.len().min(room);
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = Upto(Vec::new());
    let _ = serde_json::to_writer(&mut w, v);
    cut(&String::from_utf8_lossy(&w.0))
}

/// Base64 data rather than words: long, of the base64 alphabet only, with
/// upper and lower case letters and digits.
fn is_serialized(text: &str) -> bool {
    const LONG: usize = 200;
    text.len() >= LONG
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_'))
        && text.bytes().any(|b| b.is_ascii_uppercase())
        && text.bytes().any(|b| b.is_ascii_lowercase())
        && text.bytes().any(|b| b.is_ascii_digit())
}

fn cut(text: &str) -> String {
    match super::content::cut(text, SHOWN) {
        (cut, true) => format!("{cut}…"),
        (whole, false) => whole,
    }
}

/// A walk of two documents: the path it is at, and what it found.
struct Walk {
    path: String,
    budget: Budget,
    bytes: usize,
    out: Diff,
}

impl Walk {
    /// Lists a change at the current path, or counts it past the budget.
    fn change(&mut self, kind: ChangeKind, before: Option<&Value>, after: Option<&Value>) {
        if self.out.changes.len() >= self.budget.changes || self.bytes >= self.budget.bytes {
            self.out.more += 1;
            return;
        }
        let change = Change {
            path: cut(&self.path),
            kind,
            before: before.map(shown),
            after: after.map(shown),
        };
        self.bytes += change.path.len()
            + change.before.as_ref().map_or(0, String::len)
            + change.after.as_ref().map_or(0, String::len);
        self.out.changes.push(change);
    }

    fn values(&mut self, before: &Value, after: &Value) {
        let at = self.path.len();
        match (before, after) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, va) in a {
                    push_token(&mut self.path, k);
                    match b.get(k) {
                        Some(vb) => self.values(va, vb),
                        None => self.change(ChangeKind::Removed, Some(va), None),
                    }
                    self.path.truncate(at);
                }
                for (k, vb) in b {
                    if !a.contains_key(k) {
                        push_token(&mut self.path, k);
                        self.change(ChangeKind::Added, None, Some(vb));
                        self.path.truncate(at);
                    }
                }
            }
            (Value::Array(a), Value::Array(b)) => {
                for i in 0..a.len().max(b.len()) {
                    push_token(&mut self.path, &i.to_string());
                    match (a.get(i), b.get(i)) {
                        (Some(va), Some(vb)) => self.values(va, vb),
                        (Some(va), None) => self.change(ChangeKind::Removed, Some(va), None),
                        (None, Some(vb)) => self.change(ChangeKind::Added, None, Some(vb)),
                        (None, None) => {}
                    }
                    self.path.truncate(at);
                }
            }
            (a, b) if a != b => self.change(ChangeKind::Changed, Some(a), Some(b)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn changes_are_named_by_pointer_in_document_order() {
        let before =
            json!({"step": 2, "notes": ["a", "b"], "plan": {"todo": 3, "a/b": 1}, "gone": true});
        let after =
            json!({"step": 3, "notes": ["a"], "plan": {"todo": 3, "a/b": 2}, "new": {"x": 1}});
        let found = diff(&before, &after, PAGE);
        let changes: Vec<(String, &str)> = found
            .changes
            .iter()
            .map(|c| (c.path.clone(), c.kind.as_str()))
            .collect();
        assert_eq!(
            changes,
            [
                ("/gone".to_string(), "removed"),
                ("/notes/1".to_string(), "removed"),
                ("/plan/a~1b".to_string(), "changed"),
                ("/step".to_string(), "changed"),
                ("/new".to_string(), "added"),
            ]
        );
        assert_eq!(found.more, 0);
        assert_eq!(diff(&before, &before, PAGE), Diff::default());
        // Another type at the same place is one change of the whole value.
        let whole = diff(&json!({"a": [1]}), &json!({"a": {"0": 1}}), PAGE);
        assert_eq!(whole.changes.len(), 1);
        assert_eq!(whole.changes[0].path, "/a");
        assert_eq!(whole.changes[0].before.as_deref(), Some("[1]"));
    }

    /// The review's shape: deep arrays whose every leaf changed. The
    /// listing stops at the budget and the rest is counted.
    #[test]
    fn serialized_data_is_named_not_printed() {
        use base64::Engine;
        let blob = |seed: u8| {
            base64::engine::general_purpose::STANDARD.encode(
                (0..300u16)
                    .map(|i| (i as u8).wrapping_mul(seed))
                    .collect::<Vec<u8>>(),
            )
        };
        let before = json!({"latest": {"checkpoint": ["msgpack", blob(3)], "values": {"n": 1}}});
        let after = json!({"latest": {"checkpoint": ["msgpack", blob(5)], "values": {"n": 2}}});
        let d = diff(&before, &after, PAGE);
        let packed = d
            .changes
            .iter()
            .find(|c| c.path == "/latest/checkpoint/1")
            .unwrap();
        assert_eq!(
            packed.after.as_deref(),
            Some("(serialized data: 400 base64 characters)")
        );
        let values = d
            .changes
            .iter()
            .find(|c| c.path == "/latest/values/n")
            .unwrap();
        assert_eq!(values.after.as_deref(), Some("2"));
        // Words, hashes and short tokens are shown as they are.
        for text in [
            "sha256:".to_string() + &"ab12".repeat(16),
            "word ".repeat(60),
            "A1b2".repeat(10),
        ] {
            assert!(!is_serialized(&text), "{text}");
        }
    }

    #[test]
    fn a_hostile_diff_lists_its_budget_and_counts_the_rest() {
        fn deep(depth: usize, leaf: u64) -> Value {
            let mut v = json!(vec![leaf; 8]);
            for _ in 0..depth {
                v = json!([v.clone(), v]);
            }
            v
        }
        let (a, b) = (deep(12, 1), deep(12, 2));
        let found = diff(&a, &b, PAGE);
        assert_eq!(found.changes.len(), PAGE.changes);
        assert_eq!(found.changes.len() as u64 + found.more, 8 << 12);
        let bytes: usize = found
            .changes
            .iter()
            .map(|c| {
                c.path.len() + c.before.as_ref().unwrap().len() + c.after.as_ref().unwrap().len()
            })
            .sum();
        assert!(bytes <= PAGE.bytes + 3 * (SHOWN * 4 + 4), "{bytes}");
        // A huge value or key is kept only as far as it is shown.
        let big = "k".repeat(100_000);
        let found = diff(&json!({ big.clone(): big.clone() }), &json!({}), PAGE);
        assert_eq!(found.changes[0].path.chars().count(), SHOWN + 1);
        assert_eq!(
            found.changes[0].before.as_ref().unwrap().chars().count(),
            SHOWN + 1
        );
    }
}
