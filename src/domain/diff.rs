//! A structural diff of two JSON documents: what the checkpoints page shows
//! between two checkpoints of an attempt. Pure.
//!
//! Objects are compared key by key, arrays index by index; a value whose
//! type differs is one change. Paths are JSON Pointers (RFC 6901), so a
//! change names exactly where it is.

use serde::Serialize;
use serde_json::Value;

/// One difference between two documents.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// Where, as a JSON Pointer (`""` is the whole document).
    pub path: String,
    /// added, removed or changed.
    pub kind: ChangeKind,
    /// The value before (absent when added).
    pub before: Option<Value>,
    /// The value after (absent when removed).
    pub after: Option<Value>,
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

/// The changes that turn `before` into `after`, in document order.
pub fn diff(before: &Value, after: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    walk(String::new(), before, after, &mut out);
    out
}

/// A key as a JSON Pointer token: `~` and `/` escaped.
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn walk(path: String, before: &Value, after: &Value, out: &mut Vec<Change>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}/{}", token(k));
                match b.get(k) {
                    Some(vb) => walk(p, va, vb, out),
                    None => out.push(Change {
                        path: p,
                        kind: ChangeKind::Removed,
                        before: Some(va.clone()),
                        after: None,
                    }),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    out.push(Change {
                        path: format!("{path}/{}", token(k)),
                        kind: ChangeKind::Added,
                        before: None,
                        after: Some(vb.clone()),
                    });
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let p = format!("{path}/{i}");
                match (a.get(i), b.get(i)) {
                    (Some(va), Some(vb)) => walk(p, va, vb, out),
                    (Some(va), None) => out.push(Change {
                        path: p,
                        kind: ChangeKind::Removed,
                        before: Some(va.clone()),
                        after: None,
                    }),
                    (None, Some(vb)) => out.push(Change {
                        path: p,
                        kind: ChangeKind::Added,
                        before: None,
                        after: Some(vb.clone()),
                    }),
                    (None, None) => {}
                }
            }
        }
        (a, b) if a != b => out.push(Change {
            path,
            kind: ChangeKind::Changed,
            before: Some(a.clone()),
            after: Some(b.clone()),
        }),
        _ => {}
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
        let changes: Vec<(String, &str)> = diff(&before, &after)
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
        assert!(diff(&before, &before).is_empty());
        // Another type at the same place is one change of the whole value.
        let whole = diff(&json!({"a": [1]}), &json!({"a": {"0": 1}}));
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].path, "/a");
        assert_eq!(whole[0].before, Some(json!([1])));
    }
}
