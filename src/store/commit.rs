//! Group commit: one writer thread, one flusher thread.
//!
//! The writer runs transactions one after another (sled serialises them
//! anyway) and hands each committed one to the flusher. The flusher takes
//! everything that has queued up, flushes sled and syncs its data file once,
//! and then answers the whole batch and publishes its events. While the
//! flusher syncs, the writer keeps committing the next batch, so the cost
//! of a sync is shared by every writer that arrived during the previous one.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use parking_lot::Mutex;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use tokio::sync::{broadcast, oneshot};

use super::outbox::StoredEvent;
use super::tx::Tx;
use super::StoreError;

/// A write waiting for the flusher: how to answer it and what it published.
pub(super) struct Pending {
    complete: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
    events: Vec<Arc<StoredEvent>>,
}

/// What the writer thread gives each job.
pub(super) struct WriterCtx {
    pub(super) db: sled::Db,
    pub(super) trees: Arc<[sled::Tree]>,
    /// Sequence number of the next event. Only the writer thread numbers
    /// events, so a plain counter is exact.
    pub(super) next_seq: u64,
}

type Job = Box<dyn FnOnce(&mut WriterCtx) -> Option<Pending> + Send>;

enum Message {
    Job(Job),
    Stop(mpsc::SyncSender<Result<(), StoreError>>),
}

/// Counters of the group commit.
#[derive(Clone, Copy, Debug, Default)]
pub struct CommitStats {
    /// Transactions committed.
    pub commits: u64,
    /// Flush-and-sync rounds.
    pub flushes: u64,
}

struct Shared {
    healthy: AtomicBool,
    last_error: Mutex<Option<String>>,
    commits: AtomicU64,
    flushes: AtomicU64,
}

pub(super) struct Committer {
    sender: Mutex<Option<mpsc::Sender<Message>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    shared: Arc<Shared>,
}

impl Committer {
    pub(super) fn start(
        db: sled::Db,
        trees: Arc<[sled::Tree]>,
        data_file: PathBuf,
        sync_data: bool,
        next_seq: u64,
        events: broadcast::Sender<Arc<StoredEvent>>,
    ) -> Result<Committer, StoreError> {
        // Opened for writing because Windows' FlushFileBuffers needs it;
        // nothing is written through this handle.
        let file = File::options()
            .read(true)
            .write(true)
            .open(&data_file)
            .map_err(StoreError::io(format!("opening {}", data_file.display())))?;
        let shared = Arc::new(Shared {
            healthy: AtomicBool::new(true),
            last_error: Mutex::new(None),
            commits: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        });
        let (job_tx, job_rx) = mpsc::channel::<Message>();
        let (flush_tx, flush_rx) = mpsc::channel::<FlushMessage>();

        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("store-writer".into())
                .spawn({
                    let db = db.clone();
                    move || writer_loop(job_rx, flush_tx, db, trees, next_seq, shared)
                })
                .map_err(StoreError::io("starting the store writer thread"))?
        };
        let flusher = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("store-flusher".into())
                .spawn(move || flusher_loop(flush_rx, db, file, sync_data, events, shared))
                .map_err(StoreError::io("starting the store flusher thread"))?
        };
        Ok(Committer {
            sender: Mutex::new(Some(job_tx)),
            threads: Mutex::new(vec![writer, flusher]),
            shared,
        })
    }

    /// Queues a transaction; the receiver answers once it is durable.
    pub(super) fn submit<R, E, F>(
        &self,
        f: F,
    ) -> Result<oneshot::Receiver<Result<R, E>>, StoreError>
    where
        F: Fn(&mut Tx<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel::<Result<R, E>>();
        let job: Job = Box::new(move |ctx: &mut WriterCtx| match run_transaction(ctx, &f) {
            Ok((value, events)) => Some(Pending {
                complete: Box::new(move |flushed| {
                    let _ = reply.send(flushed.map(|()| value).map_err(E::from));
                }),
                events,
            }),
            Err(e) => {
                // Nothing was written: answer at once, no flush needed.
                let _ = reply.send(Err(e));
                None
            }
        });
        self.sender
            .lock()
            .as_ref()
            .ok_or(StoreError::Closed)?
            .send(Message::Job(job))
            .map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    /// Runs `f` on the writer thread between two transactions: no write
    /// interleaves with it. For consistent snapshots.
    pub(super) fn run_exclusive<R, F>(&self, f: F) -> oneshot::Receiver<R>
    where
        F: FnOnce(&[sled::Tree], &sled::Db) -> R + Send + 'static,
        R: Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Job = Box::new(move |ctx: &mut WriterCtx| {
            let _ = reply.send(f(&ctx.trees, &ctx.db));
            None
        });
        if let Some(sender) = self.sender.lock().as_ref() {
            // A closed writer drops the job, and with it `reply`: the
            // receiver then reports the store closed.
            let _ = sender.send(Message::Job(job));
        }
        rx
    }

    pub(super) fn health(&self) -> Result<(), String> {
        if self.shared.healthy.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(self
                .shared
                .last_error
                .lock()
                .clone()
                .unwrap_or_else(|| "the store writer stopped".into()))
        }
    }

    pub(super) fn stats(&self) -> CommitStats {
        CommitStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            flushes: self.shared.flushes.load(Ordering::Relaxed),
        }
    }

    /// Stops after everything already queued, with a final flush.
    pub(super) fn stop(&self) -> Result<(), StoreError> {
        let Some(sender) = self.sender.lock().take() else {
            return Ok(());
        };
        // A std channel: stop() also runs from Drop, possibly on an async
        // worker thread, where a tokio blocking receive would panic.
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        if sender.send(Message::Stop(done_tx)).is_err() {
            return Err(StoreError::Closed);
        }
        drop(sender);
        let result = done_rx.recv().unwrap_or(Err(StoreError::Closed));
        for handle in self.threads.lock().drain(..) {
            let _ = handle.join();
        }
        result
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // A store dropped without close() still finishes queued writes.
        let _ = self.stop();
    }
}

/// Runs one closure as a sled transaction over every tree.
fn run_transaction<R, E, F>(
    ctx: &mut WriterCtx,
    f: &F,
) -> Result<(R, Vec<Arc<StoredEvent>>), E>
where
    F: Fn(&mut Tx<'_>) -> Result<R, E>,
    E: From<StoreError>,
{
    let base_seq = ctx.next_seq;
    let result = ctx.trees.as_ref().transaction(|trees| {
        let mut tx = Tx::new(trees, base_seq);
        match f(&mut tx) {
            Ok(value) => Ok((value, tx.into_events())),
            Err(e) => Err(ConflictableTransactionError::Abort(e)),
        }
    });
    match result {
        Ok((value, events)) => {
            ctx.next_seq = base_seq + events.len() as u64;
            Ok((value, events))
        }
        Err(TransactionError::Abort(e)) => Err(e),
        Err(TransactionError::Storage(e)) => Err(E::from(StoreError::Engine(e))),
    }
}

enum FlushMessage {
    Write(Pending),
    Stop(mpsc::SyncSender<Result<(), StoreError>>),
}

fn writer_loop(
    jobs: mpsc::Receiver<Message>,
    flusher: mpsc::Sender<FlushMessage>,
    db: sled::Db,
    trees: Arc<[sled::Tree]>,
    next_seq: u64,
    shared: Arc<Shared>,
) {
    let mut ctx = WriterCtx { db, trees, next_seq };
    while let Ok(message) = jobs.recv() {
        match message {
            Message::Job(job) => {
                if let Some(pending) = job(&mut ctx) {
                    shared.commits.fetch_add(1, Ordering::Relaxed);
                    if flusher.send(FlushMessage::Write(pending)).is_err() {
                        break;
                    }
                }
            }
            Message::Stop(done) => {
                let _ = flusher.send(FlushMessage::Stop(done));
                return;
            }
        }
    }
    shared.healthy.store(false, Ordering::Release);
}

fn flusher_loop(
    queue: mpsc::Receiver<FlushMessage>,
    db: sled::Db,
    file: File,
    sync_data: bool,
    events: broadcast::Sender<Arc<StoredEvent>>,
    shared: Arc<Shared>,
) {
    let flush = || -> Result<(), StoreError> {
        db.flush()?;
        if sync_data {
            file.sync_data()
                .map_err(StoreError::io("syncing the store data file"))?;
        }
        Ok(())
    };
    let mut batch: Vec<Pending> = Vec::new();
    loop {
        let mut stop = None;
        match queue.recv() {
            Ok(FlushMessage::Write(p)) => batch.push(p),
            Ok(FlushMessage::Stop(done)) => stop = Some(done),
            Err(_) => return,
        }
        // Take everything that queued up while the previous sync ran.
        while stop.is_none() {
            match queue.try_recv() {
                Ok(FlushMessage::Write(p)) => batch.push(p),
                Ok(FlushMessage::Stop(done)) => stop = Some(done),
                Err(_) => break,
            }
        }
        // After a failed sync the state of unsynced writes is unknown, so
        // nothing is acknowledged again until the appliance restarts.
        let result = if shared.healthy.load(Ordering::Acquire) {
            flush()
        } else {
            Err(StoreError::FlushFailed(
                shared.last_error.lock().clone().unwrap_or_default(),
            ))
        };
        shared.flushes.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = &result {
            tracing::error!(error = %e, "store flush failed; the appliance is no longer ready");
            shared.last_error.lock().get_or_insert_with(|| e.to_string());
            shared.healthy.store(false, Ordering::Release);
        }
        for pending in batch.drain(..) {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(StoreError::FlushFailed(e.to_string())),
            };
            let published = outcome.is_ok();
            (pending.complete)(outcome);
            if published {
                for event in pending.events {
                    // No subscriber is not an error.
                    let _ = events.send(event);
                }
            }
        }
        if let Some(done) = stop {
            let _ = done.send(result);
            return;
        }
    }
}
