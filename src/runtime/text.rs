//! Model text as it is written: the model client hands each answer's
//! text to a [`TextSink`] as it arrives; the sink puts it in the
//! attempt's stream at most every [`COALESCE`] (not a record per token);
//! readers (WatchAttempt, the SSE route, the console) follow the stream
//! from an offset. The streams live in memory, each a bounded tail:
//! [`PER_ATTEMPT`] bytes an attempt, [`PER_TENANT`] a tenant and
//! [`TOTAL`] in all, the least recently written attempts given up first
//! (within the tenant whose volume is over its share, so that one
//! tenant's volume never evicts another's).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use parking_lot::Mutex;
use tokio::sync::{broadcast, watch};
use uuid::Uuid;

use super::{Runtime, RuntimeError};
use crate::domain::TenantId;
use crate::domain::access::TenantScope;
use crate::domain::text::{PieceKind, TextPiece};

/// How often a call's new text is put in the stream, at most.
pub const COALESCE: Duration = Duration::from_millis(100);
/// The most of one attempt's text a stream holds (its tail).
pub const PER_ATTEMPT: usize = 256 * 1024;
/// The most text one tenant's streams hold together.
pub const PER_TENANT: usize = 16 * 1024 * 1024;
/// The most text all streams hold together.
pub const TOTAL: usize = 64 * 1024 * 1024;

/// One attempt's stream.
struct AttemptText {
    tenant: TenantId,
    /// The pieces held, each with its number in the stream.
    pieces: VecDeque<(u64, TextPiece)>,
    /// Pieces put in so far.
    count: u64,
    /// Text bytes held.
    bytes: usize,
    /// Where the next piece begins.
    end: u64,
    /// When a piece was last put in.
    touched: Instant,
    live: broadcast::Sender<(u64, TextPiece)>,
}

impl AttemptText {
    fn new(tenant: &TenantId) -> AttemptText {
        AttemptText {
            tenant: tenant.clone(),
            pieces: VecDeque::new(),
            count: 0,
            bytes: 0,
            end: 0,
            touched: Instant::now(),
            live: broadcast::channel(256).0,
        }
    }
}

/// Pieces of a stream as they are put in, numbered.
type Live = broadcast::Receiver<(u64, TextPiece)>;

/// Every attempt's stream.
#[derive(Default)]
pub struct TextStreams {
    streams: Mutex<Streams>,
}

#[derive(Default)]
struct Streams {
    by_attempt: HashMap<Uuid, AttemptText>,
    by_tenant: HashMap<TenantId, usize>,
    total: usize,
}

impl Streams {
    /// Gives up `attempt`'s stream.
    fn drop_stream(&mut self, attempt: Uuid) {
        if let Some(s) = self.by_attempt.remove(&attempt) {
            self.total -= s.bytes;
            if let Some(t) = self.by_tenant.get_mut(&s.tenant) {
                *t -= s.bytes;
                if *t == 0 {
                    self.by_tenant.remove(&s.tenant);
                }
            }
        }
    }

    /// The least recently written stream (of `tenant`, when given), other
    /// than `keep`.
    fn oldest(&self, tenant: Option<&TenantId>, keep: Uuid) -> Option<Uuid> {
        self.by_attempt
            .iter()
            .filter(|(id, s)| **id != keep && tenant.is_none_or(|t| *t == s.tenant))
            .min_by_key(|(_, s)| s.touched)
            .map(|(id, _)| *id)
    }
}

impl TextStreams {
    /// Puts a piece at the end of `attempt`'s stream; answers it.
    fn put(&self, tenant: &TenantId, attempt: Uuid, call_id: Uuid, kind: PieceKind) -> TextPiece {
        let mut all = self.streams.lock();
        let s = all
            .by_attempt
            .entry(attempt)
            .or_insert_with(|| AttemptText::new(tenant));
        let piece = TextPiece {
            offset: s.end,
            call_id,
            kind,
        };
        let added = piece.len() as usize;
        s.end = piece.end();
        s.bytes += added;
        s.touched = Instant::now();
        s.count += 1;
        s.pieces.push_back((s.count, piece.clone()));
        let _ = s.live.send((s.count, piece.clone()));
        let mut freed = 0;
        while s.bytes > PER_ATTEMPT {
            let Some((_, first)) = s.pieces.pop_front() else {
                break;
            };
            s.bytes -= first.len() as usize;
            freed += first.len() as usize;
        }
        let net = added - freed.min(added);
        let back = freed.saturating_sub(added);
        all.total = all.total + net - back;
        let t = all.by_tenant.entry(tenant.clone()).or_default();
        *t = *t + net - back;
        // Over a share: the tenant's own oldest streams go first, then
        // (over the total) anyone's oldest.
        while all.by_tenant.get(tenant).copied().unwrap_or(0) > PER_TENANT {
            let Some(old) = all.oldest(Some(tenant), attempt) else {
                break;
            };
            all.drop_stream(old);
        }
        while all.total > TOTAL {
            let Some(old) = all.oldest(None, attempt) else {
                break;
            };
            all.drop_stream(old);
        }
        piece
    }

    /// What `attempt`'s stream holds from `from` on, each with its number
    /// (a gap, numbered 0, first when it no longer holds `from`), and its
    /// live pieces after those.
    fn read(&self, attempt: Uuid, from: u64) -> (Vec<(u64, TextPiece)>, Option<Live>) {
        let all = self.streams.lock();
        let Some(s) = all.by_attempt.get(&attempt) else {
            return (Vec::new(), None);
        };
        let from = from.min(s.end);
        let mut out = Vec::new();
        if let Some((_, first)) = s.pieces.front()
            && first.offset > from
        {
            let gap = TextPiece {
                offset: from,
                call_id: first.call_id,
                kind: PieceKind::Gap {
                    up_to: first.offset,
                },
            };
            out.push((0, gap));
        }
        out.extend(
            s.pieces
                .iter()
                .filter_map(|(n, p)| Some((*n, p.from(from)?))),
        );
        (out, Some(s.live.subscribe()))
    }

    /// Where `attempt`'s stream ends now, and its pieces from then on
    /// (the stream made if it has none yet).
    fn follow_end(&self, tenant: &TenantId, attempt: Uuid) -> (u64, Live) {
        let mut all = self.streams.lock();
        let s = all
            .by_attempt
            .entry(attempt)
            .or_insert_with(|| AttemptText::new(tenant));
        (s.end, s.live.subscribe())
    }

    /// Where `attempt`'s stream ends now.
    pub fn end(&self, attempt: Uuid) -> u64 {
        self.streams
            .lock()
            .by_attempt
            .get(&attempt)
            .map_or(0, |s| s.end)
    }
}

/// Where one model call's text goes as it arrives.
pub struct TextSink {
    streams: Arc<TextStreams>,
    tenant: TenantId,
    attempt: Uuid,
    call_id: Uuid,
    state: Mutex<SinkState>,
}

struct SinkState {
    /// Text not yet in the stream.
    pending: String,
    /// Bytes of the answer put in the stream.
    sent: usize,
    /// Where the call's text began in the stream.
    began: Option<u64>,
    flushed: Instant,
}

impl TextSink {
    /// A sink for call `call_id` of `attempt`.
    pub fn new(
        streams: Arc<TextStreams>,
        tenant: &TenantId,
        attempt: Uuid,
        call_id: Uuid,
    ) -> TextSink {
        TextSink {
            streams,
            tenant: tenant.clone(),
            attempt,
            call_id,
            state: Mutex::new(SinkState {
                pending: String::new(),
                sent: 0,
                began: None,
                flushed: Instant::now(),
            }),
        }
    }

    /// More of the answer's text: in the stream once [`COALESCE`] passed
    /// since the last piece.
    pub fn push(&self, text: &str) {
        let mut s = self.state.lock();
        s.pending.push_str(text);
        if s.flushed.elapsed() >= COALESCE {
            self.flush(&mut s);
        }
    }

    fn flush(&self, s: &mut SinkState) {
        s.flushed = Instant::now();
        if s.pending.is_empty() {
            return;
        }
        let text = std::mem::take(&mut s.pending);
        s.sent += text.len();
        let piece = self.streams.put(
            &self.tenant,
            self.attempt,
            self.call_id,
            PieceKind::Text { text },
        );
        s.began.get_or_insert(piece.offset);
    }

    /// The call answered `content`: the rest of it (all of it, from a
    /// server that did not stream), then the end.
    pub fn answered(&self, content: Option<&str>) {
        let mut s = self.state.lock();
        let content = content.unwrap_or_default();
        if s.sent + s.pending.len() < content.len()
            && content.is_char_boundary(s.sent + s.pending.len())
        {
            let rest = &content[s.sent + s.pending.len()..];
            s.pending.push_str(rest);
        }
        self.flush(&mut s);
        self.streams
            .put(&self.tenant, self.attempt, self.call_id, PieceKind::Ended);
    }

    /// The call failed: a reader discards what it got of its text.
    pub fn failed(&self, reason: &str) {
        let s = self.state.lock();
        let Some(began) = s.began else {
            return; // none of its text was shown
        };
        self.streams.put(
            &self.tenant,
            self.attempt,
            self.call_id,
            PieceKind::Superseded {
                discard_from: began,
                reason: reason.chars().take(500).collect(),
            },
        );
    }
}

impl Runtime {
    /// The attempt's model text the stream holds now, each call's as it
    /// stands (superseded tries dropped), and where the stream ends: a
    /// reader follows from there.
    pub fn text_so_far(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
    ) -> Result<(Vec<(Uuid, String)>, u64), RuntimeError> {
        self.attempt(scope, attempt_id)?;
        let (pieces, _) = self.shared.text.read(attempt_id, 0);
        let pieces: Vec<TextPiece> = pieces.into_iter().map(|(_, p)| p).collect();
        Ok((
            crate::domain::text::assemble(&pieces),
            self.shared.text.end(attempt_id),
        ))
    }

    /// The attempt's model text from byte `from` on (past the end: from
    /// the end), then live as it is written, until the attempt has ended
    /// and every piece is delivered.
    pub fn model_text(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        from: u64,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<impl Stream<Item = TextPiece> + Send + use<>, RuntimeError> {
        // The attempt exists in the caller's tenant (or this is NotFound).
        self.attempt(scope, attempt_id)?;
        let (runtime, scope) = (self.clone(), scope.clone());
        let streams = self.shared.text.clone();
        // Past the end is the end as it is now, not when the reader is
        // first served.
        let from = from.min(streams.end(attempt_id));
        Ok(super::follow::async_stream(move |yield_| async move {
            // Where the reader is: the offset it asked for, then the
            // number of the last piece it got.
            let (mut next, mut last) = (from, 0u64);
            loop {
                let ended = !runtime.is_live(&scope, attempt_id)
                    && runtime
                        .attempt(&scope, attempt_id)
                        .is_ok_and(|a| a.state.is_terminal());
                let (backlog, live) = streams.read(attempt_id, next);
                for (n, piece) in backlog {
                    if n != 0 && n <= last {
                        continue;
                    }
                    last = last.max(n);
                    next = match &piece.kind {
                        PieceKind::Gap { up_to } => *up_to,
                        _ => next.max(piece.end()),
                    };
                    if yield_.send(piece).await.is_err() {
                        return;
                    }
                }
                if ended {
                    return;
                }
                let Some(mut live) = live else {
                    // No text yet: look again shortly.
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                        _ = shutdown.changed() => return,
                        _ = yield_.closed() => return,
                    }
                };
                loop {
                    let received = tokio::select! {
                        r = live.recv() => r,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => break,
                        _ = shutdown.changed() => return,
                        _ = yield_.closed() => return,
                    };
                    match received {
                        Ok((n, piece)) if n > last => {
                            last = n;
                            next = next.max(piece.end());
                            if yield_.send(piece).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        // Fell behind, or the stream was given up: read it again.
                        Err(_) => break,
                    }
                }
            }
        }))
    }
}

/// What a model call followed as it is written yields: its text, then
/// its answer.
pub enum Written<T> {
    /// A piece of the call's text.
    Text(TextPiece),
    /// The call's answer.
    Done(T),
}

impl Runtime {
    /// Runs `call` (a model call of `attempt_id`) to its end, even if the
    /// stream is dropped, and yields the text the attempt's stream gets
    /// meanwhile, then the call's answer.
    pub fn while_written<T, F>(
        &self,
        tenant: &TenantId,
        attempt_id: Uuid,
        call: F,
    ) -> impl Stream<Item = Written<T>> + Send + use<T, F>
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + Send + 'static,
    {
        let streams = self.shared.text.clone();
        let (from, mut live) = streams.follow_end(tenant, attempt_id);
        super::follow::async_stream(move |yield_| async move {
            let mut task = tokio::spawn(call);
            let mut last = 0u64;
            let done = loop {
                tokio::select! {
                    received = live.recv() => match received {
                        Ok((n, piece)) => {
                            last = n;
                            if yield_.send(Written::Text(piece)).await.is_err() {
                                // The reader went; the call goes on.
                                return;
                            }
                        }
                        // Fell behind: the read at the end catches up.
                        Err(broadcast::error::RecvError::Lagged(_)) => {}
                        // The stream was given up: the call's end is all
                        // there is to wait for.
                        Err(broadcast::error::RecvError::Closed) => break (&mut task).await,
                    },
                    done = &mut task => break done,
                }
            };
            // Every piece of the call was put before it answered.
            for (n, piece) in streams.read(attempt_id, from).0 {
                if n > last && yield_.send(Written::Text(piece)).await.is_err() {
                    return;
                }
            }
            match done {
                Ok(answer) => {
                    let _ = yield_.send(Written::Done(answer)).await;
                }
                Err(e) => {
                    tracing::error!(attempt = %attempt_id, error = %e, "a streamed model call failed")
                }
            }
        })
    }
}
