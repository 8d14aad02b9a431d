//! Model text as it is written: the model client hands each answer's
//! text to a [`TextSink`] as it arrives; the sink puts it in the
//! attempt's stream at most every [`COALESCE`] (not a record per token);
//! readers (WatchAttempt, the SSE route, the console) follow the stream
//! from an offset. The streams live in memory, each a bounded tail:
//! [`PER_ATTEMPT`] bytes an attempt, [`PER_TENANT`] bytes and
//! [`STREAMS_PER_TENANT`] streams a tenant, [`TOTAL`] bytes and
//! [`STREAMS`] streams in all, the least recently written attempts given up first
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
/// The most attempts' streams one tenant has.
pub const STREAMS_PER_TENANT: usize = 1024;
/// The most attempts' streams there are.
pub const STREAMS: usize = 4096;

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
            live: broadcast::channel(64).0,
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

/// Text bytes and streams held (by one tenant, or in all).
#[derive(Default, Clone, Copy)]
struct Share {
    bytes: usize,
    streams: usize,
}

#[derive(Default)]
struct Streams {
    by_attempt: HashMap<Uuid, AttemptText>,
    by_tenant: HashMap<TenantId, Share>,
    total: Share,
}

impl Streams {
    /// `attempt`'s stream, made (within the budgets) if it has none.
    fn stream(&mut self, tenant: &TenantId, attempt: Uuid) -> &mut AttemptText {
        if let std::collections::hash_map::Entry::Vacant(e) = self.by_attempt.entry(attempt) {
            e.insert(AttemptText::new(tenant));
            self.by_tenant.entry(tenant.clone()).or_default().streams += 1;
            self.total.streams += 1;
            self.fit(tenant, attempt);
        }
        self.by_attempt.get_mut(&attempt).expect("just made")
    }

    /// Counts `added` bytes in and `freed` out of `tenant`'s share.
    fn tally(&mut self, tenant: &TenantId, added: usize, freed: usize) {
        let share = self.by_tenant.entry(tenant.clone()).or_default();
        share.bytes = share.bytes + added - freed;
        self.total.bytes = self.total.bytes + added - freed;
    }

    /// Gives up `attempt`'s stream.
    fn drop_stream(&mut self, attempt: Uuid) {
        if let Some(s) = self.by_attempt.remove(&attempt) {
            self.total.bytes -= s.bytes;
            self.total.streams -= 1;
            if let Some(share) = self.by_tenant.get_mut(&s.tenant) {
                share.bytes -= s.bytes;
                share.streams -= 1;
                if share.streams == 0 {
                    self.by_tenant.remove(&s.tenant);
                }
            }
        }
    }

    /// Gives up the least recently written streams until `tenant`'s share
    /// (its own first) and the total are within their budgets; never
    /// `keep`'s.
    fn fit(&mut self, tenant: &TenantId, keep: Uuid) {
        let over = |s: &Share, bytes: usize, streams: usize| s.bytes > bytes || s.streams > streams;
        while self
            .by_tenant
            .get(tenant)
            .is_some_and(|s| over(s, PER_TENANT, STREAMS_PER_TENANT))
        {
            let Some(old) = self.oldest(Some(tenant), keep) else {
                break;
            };
            self.drop_stream(old);
        }
        while over(&self.total, TOTAL, STREAMS) {
            let Some(old) = self.oldest(None, keep) else {
                break;
            };
            self.drop_stream(old);
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
        let s = all.stream(tenant, attempt);
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
        all.tally(tenant, added, freed);
        all.fit(tenant, attempt);
        piece
    }

    /// What `attempt`'s stream holds from `from` on, each with its number
    /// (a gap, numbered 0, first when it no longer holds `from`), its live
    /// pieces after those, and the number of its last piece.
    fn read(&self, attempt: Uuid, from: u64) -> (Vec<(u64, TextPiece)>, Option<Live>, u64) {
        let all = self.streams.lock();
        let Some(s) = all.by_attempt.get(&attempt) else {
            return (Vec::new(), None, 0);
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
        (out, Some(s.live.subscribe()), s.count)
    }

    /// Where `attempt`'s stream ends now, and its pieces from then on
    /// (the stream made if it has none yet).
    fn follow_end(&self, tenant: &TenantId, attempt: Uuid) -> (u64, Live) {
        let mut all = self.streams.lock();
        let s = all.stream(tenant, attempt);
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
        let (pieces, _, _) = self.shared.text.read(attempt_id, 0);
        let pieces: Vec<TextPiece> = pieces.into_iter().map(|(_, p)| p).collect();
        let mut turns = crate::domain::text::assemble(&pieces);
        // A turn that only asked for tools wrote no text.
        turns.retain(|(_, text)| !text.is_empty());
        Ok((turns, self.shared.text.end(attempt_id)))
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
                let (backlog, live, count) = streams.read(attempt_id, next);
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
                // Every piece up to the stream's last then is delivered or
                // lies before the reader's offset.
                last = last.max(count);
                if ended {
                    return;
                }
                // No text yet: the stream is made, so that its first
                // piece wakes this reader (it is read below, by number).
                let mut live = match live {
                    Some(live) => live,
                    None => streams.follow_end(scope.tenant(), attempt_id).1,
                };
                loop {
                    let received = tokio::select! {
                        r = live.recv() => r,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => break,
                        _ = shutdown.changed() => return,
                        _ = yield_.closed() => return,
                    };
                    match received {
                        // A piece after one this reader has not got (put
                        // between its read and its subscription): read the
                        // stream again, in order.
                        Ok((n, _)) if n > last + 1 => break,
                        Ok((n, piece)) if n == last + 1 => {
                            last = n;
                            next = next.max(piece.end());
                            if yield_.send(piece).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        // Fell behind: read it again.
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        // The stream was given up (over a budget): a new
                        // one starts at offset 0 and piece 1; follow it
                        // from there (its pieces name their calls).
                        Err(broadcast::error::RecvError::Closed) => {
                            (next, last) = (0, 0);
                            break;
                        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::parse(name).unwrap()
    }

    fn text(t: &str) -> PieceKind {
        PieceKind::Text { text: t.into() }
    }

    #[test]
    fn a_stream_keeps_its_tail_and_tells_a_reader_what_it_gave_up() {
        let streams = TextStreams::default();
        let (acme, attempt, call) = (tenant("acme"), Uuid::from_u128(1), Uuid::from_u128(2));
        let chunk = "x".repeat(64 * 1024);
        for _ in 0..5 {
            streams.put(&acme, attempt, call, text(&chunk));
        }
        assert_eq!(streams.end(attempt), 5 * 64 * 1024);
        let (pieces, _, _) = streams.read(attempt, 0);
        assert_eq!(
            pieces[0].1.kind,
            PieceKind::Gap { up_to: 64 * 1024 },
            "the first 64 KiB were given up"
        );
        let held: usize = pieces.iter().map(|(_, p)| p.len() as usize).sum();
        assert_eq!(held, PER_ATTEMPT);
        // From the middle of a piece: the rest of it.
        let (pieces, _, _) = streams.read(attempt, 5 * 64 * 1024 - 10);
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].1.offset, 5 * 64 * 1024 - 10);
        assert_eq!(pieces[0].1.len(), 10);
    }

    #[test]
    fn one_tenant_s_volume_gives_up_its_own_streams_not_another_s() {
        let streams = TextStreams::default();
        let (acme, initech) = (tenant("acme"), tenant("initech"));
        let theirs = Uuid::from_u128(7);
        streams.put(&initech, theirs, theirs, text("initech's turn"));
        for n in 0..(STREAMS_PER_TENANT as u128 + 50) {
            let a = Uuid::from_u128(1_000 + n);
            streams.put(&acme, a, a, text("acme's turn"));
        }
        let all = streams.streams.lock();
        assert_eq!(all.by_tenant[&acme].streams, STREAMS_PER_TENANT);
        assert!(
            all.by_attempt.contains_key(&theirs),
            "initech's stream stays"
        );
        // The newest of acme's stay, the oldest went.
        assert!(
            all.by_attempt
                .contains_key(&Uuid::from_u128(1_000 + STREAMS_PER_TENANT as u128 + 49))
        );
        assert!(!all.by_attempt.contains_key(&Uuid::from_u128(1_000)));
        assert_eq!(all.total.streams, STREAMS_PER_TENANT + 1);
    }
}
