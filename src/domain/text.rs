//! An attempt's model text as it is written: the pieces of each model
//! turn's answer, placed at byte offsets of one stream per attempt, so
//! that a reader who reconnects asks for what follows the last offset it
//! has. The stream is not a durable record: once a turn ends its text is
//! in the call's record, and the stream is only how it got there.

use serde::Serialize;
use uuid::Uuid;

/// What one piece of the stream says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum PieceKind {
    /// More of the call's answer, at `offset`.
    Text {
        /// The text (a whole number of characters).
        text: String,
    },
    /// The call ended without an answer and is tried again (as another
    /// call): a reader discards what it has of this call's text, which
    /// began at `discard_from`.
    Superseded {
        /// Where the call's text began in the stream.
        discard_from: u64,
        /// Why the call failed, in words.
        reason: String,
    },
    /// The call's answer is whole; it is in the call's record.
    Ended,
    /// The stream no longer holds the text from `offset` to `up_to` (it
    /// keeps a bounded tail per attempt): the calls' records have it.
    Gap {
        /// Where the text the stream holds begins.
        up_to: u64,
    },
}

/// One piece of an attempt's model text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TextPiece {
    /// Where the piece begins in the attempt's stream (bytes of UTF-8).
    pub offset: u64,
    /// The model call it belongs to.
    pub call_id: Uuid,
    /// What it says.
    #[serde(flatten)]
    pub kind: PieceKind,
}

impl TextPiece {
    /// Bytes it takes in the stream.
    pub fn len(&self) -> u64 {
        match &self.kind {
            PieceKind::Text { text } => text.len() as u64,
            _ => 0,
        }
    }

    /// Whether it takes no bytes of the stream (a marker).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the next piece begins.
    pub fn end(&self) -> u64 {
        self.offset + self.len()
    }

    /// The piece from `from` on (a text piece `from` falls inside is cut
    /// at the character boundary at or before it); None when it ends
    /// before `from`.
    pub fn from(&self, from: u64) -> Option<TextPiece> {
        match &self.kind {
            PieceKind::Text { text } if from > self.offset => {
                if from >= self.end() {
                    return None;
                }
                let mut cut = (from - self.offset) as usize;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                Some(TextPiece {
                    offset: self.offset + cut as u64,
                    call_id: self.call_id,
                    kind: PieceKind::Text {
                        text: text[cut..].to_string(),
                    },
                })
            }
            // A marker at the reader's offset is still news to it.
            _ if self.offset < from => None,
            _ => Some(self.clone()),
        }
    }
}

/// Puts a reader's pieces together: the text of each call as it stands,
/// superseded tries dropped (what a UI shows).
pub fn assemble(pieces: &[TextPiece]) -> Vec<(Uuid, String)> {
    let mut calls: Vec<(Uuid, String)> = Vec::new();
    for p in pieces {
        let at = match calls.iter().position(|(id, _)| *id == p.call_id) {
            Some(i) => i,
            None => {
                calls.push((p.call_id, String::new()));
                calls.len() - 1
            }
        };
        match &p.kind {
            PieceKind::Text { text } => calls[at].1.push_str(text),
            PieceKind::Superseded { .. } => {
                calls.remove(at);
            }
            PieceKind::Ended | PieceKind::Gap { .. } => {}
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(offset: u64, call: Uuid, t: &str) -> TextPiece {
        TextPiece {
            offset,
            call_id: call,
            kind: PieceKind::Text { text: t.into() },
        }
    }

    #[test]
    fn a_piece_read_from_its_middle_is_cut_at_a_character() {
        let c = Uuid::nil();
        let p = text(10, c, "héllo");
        assert_eq!(p.from(0), Some(p.clone()));
        assert_eq!(
            p.from(12),
            Some(text(11, c, "éllo")),
            "inside é: from its start"
        );
        assert_eq!(p.from(13), Some(text(13, c, "llo")));
        assert_eq!(p.from(16), None);
        let end = TextPiece {
            offset: 16,
            call_id: c,
            kind: PieceKind::Ended,
        };
        assert_eq!(end.from(16), Some(end.clone()));
        assert_eq!(end.from(17), None);
    }

    #[test]
    fn a_superseded_try_is_dropped_from_what_a_reader_shows() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let pieces = [
            text(0, a, "The ans"),
            TextPiece {
                offset: 7,
                call_id: a,
                kind: PieceKind::Superseded {
                    discard_from: 0,
                    reason: "the server broke off".into(),
                },
            },
            text(7, b, "The answer."),
            TextPiece {
                offset: 18,
                call_id: b,
                kind: PieceKind::Ended,
            },
        ];
        assert_eq!(assemble(&pieces), vec![(b, "The answer.".to_string())]);
    }
}
