//! Connections: how many, and how long each may take.
//!
//! The acceptor sits under TLS, so a refused connection costs no handshake.
//! It caps concurrent connections (the one over the cap is closed at once,
//! with a log line at most every ten seconds), and watches each one:
//!
//! - a connection must send a complete request head within
//!   `http.header_read_timeout_seconds` of its first byte (or of its
//!   accept, for the first request; the TLS handshake counts),
//! - an HTTP/1.1 connection with no request in flight is closed after
//!   `http.idle_timeout_seconds` without a byte,
//! - an HTTP/2 connection with no stream open is closed after
//!   `http.idle_timeout_seconds` since its last stream ended; a peer that
//!   stops answering keep-alive pings is dropped by hyper.
//!
//! A request in flight (a long poll, a server stream) is never cut by these
//! timers. The watcher sees requests through a service wrapper that shares
//! the connection's state, and sees bytes by wrapping the TCP stream.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::config::HttpConfig;

/// Connection bounds, from `[http]`.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// Concurrent connections accepted.
    pub max_connections: usize,
    /// Concurrent connections from one remote (not loopback) address.
    pub max_per_address: usize,
    /// Time to send a complete request head (and to finish the handshake).
    pub header_read: Duration,
    /// Time a connection may sit with no request in flight.
    pub idle: Duration,
    /// Time a request body has to arrive.
    pub body_read: Duration,
}

impl Bounds {
    /// The bounds `[http]` configures.
    pub fn from_config(http: &HttpConfig) -> Bounds {
        Bounds {
            max_connections: http.max_connections,
            max_per_address: http.max_connections_per_address,
            header_read: Duration::from_secs(http.header_read_timeout_seconds),
            idle: Duration::from_secs(http.idle_timeout_seconds),
            body_read: Duration::from_secs(http.body_read_timeout_seconds),
        }
    }
}

/// Accepts TCP connections under [`Bounds`], below the TLS acceptor.
#[derive(Clone)]
pub struct BoundedAcceptor {
    bounds: Arc<Bounds>,
    slots: Arc<Semaphore>,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last "limit reached" log line.
    last_refusal_log: Arc<AtomicU64>,
    /// Open connections by remote address (loopback not counted).
    by_address: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A remote address's hold on one of its connections, given back on drop.
struct AddressSlot {
    address: IpAddr,
    by_address: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.by_address.lock().expect("connections by address");
        if let Some(n) = open.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.address);
            }
        }
    }
}

impl BoundedAcceptor {
    /// An acceptor with `bounds`.
    pub fn new(bounds: Bounds) -> Self {
        BoundedAcceptor {
            slots: Arc::new(Semaphore::new(bounds.max_connections)),
            bounds: Arc::new(bounds),
            epoch: Instant::now(),
            last_refusal_log: Arc::new(AtomicU64::new(0)),
            by_address: Arc::default(),
        }
    }

    /// A slot for one more connection from `peer`, unless it holds its
    /// share already; loopback (this host) takes none.
    fn address_slot(&self, peer: Option<IpAddr>) -> Result<Option<AddressSlot>, ()> {
        let Some(address) = peer.map(|a| a.to_canonical()).filter(|a| !a.is_loopback()) else {
            return Ok(None);
        };
        let mut open = self.by_address.lock().expect("connections by address");
        let n = open.entry(address).or_insert(0);
        if *n >= self.bounds.max_per_address {
            return Err(());
        }
        *n += 1;
        Ok(Some(AddressSlot {
            address,
            by_address: self.by_address.clone(),
        }))
    }

    /// Logs a refused connection (at most every ten seconds) and counts it.
    fn log_refusal(&self, key: &'static str, limit: usize) {
        const EVERY_MS: u64 = 10_000;
        let now = self.epoch.elapsed().as_millis() as u64 + EVERY_MS;
        let last = self.last_refusal_log.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= EVERY_MS
            && self
                .last_refusal_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                limit,
                "the connection limit ({key}) is reached; new connections are closed until others end"
            );
        }
        metrics::counter!(crate::telemetry::names::HTTP_CONNECTIONS_REFUSED).increment(1);
    }
}

impl<S> axum_server::accept::Accept<TcpStream, S> for BoundedAcceptor {
    type Stream = Watched;
    type Service = Tracked<S>;
    type Future = std::future::Ready<io::Result<(Watched, Tracked<S>)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let Ok(address) = self.address_slot(stream.peer_addr().ok().map(|a| a.ip())) else {
            self.log_refusal(
                "http.max_connections_per_address",
                self.bounds.max_per_address,
            );
            return std::future::ready(Err(io::Error::other(
                "connection limit per address reached",
            )));
        };
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            self.log_refusal("http.max_connections", self.bounds.max_connections);
            return std::future::ready(Err(io::Error::other("connection limit reached")));
        };
        // TCP_NODELAY: small RPC answers must not wait for Nagle's
        // algorithm and the client's delayed ACK.
        if let Err(e) = stream.set_nodelay(true) {
            return std::future::ready(Err(e));
        }
        let state = Arc::new(ConnState::new());
        let watched = Watched {
            stream,
            state: state.clone(),
            bounds: self.bounds.clone(),
            timer: Box::pin(tokio::time::sleep(self.bounds.header_read)),
            _permit: permit,
            _address: address,
        };
        std::future::ready(Ok((
            watched,
            Tracked {
                inner: service,
                state,
                bounds: self.bounds.clone(),
            },
        )))
    }
}

/// What the stream and the service wrappers of one connection share.
struct ConnState {
    /// Requests (HTTP/2: streams) whose response has not ended.
    in_flight: AtomicUsize,
    /// The connection has carried an HTTP/2 request.
    h2: AtomicBool,
    /// When the connection last became idle, or when the current request
    /// head started: `None` while a request is in flight.
    since: Mutex<Clock>,
    /// The reader to wake when the deadline changes.
    reader: Mutex<Option<Waker>>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Clock {
    /// Waiting for a request head whose first byte came at this instant
    /// (or the connection's accept).
    Head(Instant),
    /// Idle since this instant.
    Idle(Instant),
    /// A request is in flight.
    Busy,
}

impl ConnState {
    fn new() -> Self {
        ConnState {
            in_flight: AtomicUsize::new(0),
            h2: AtomicBool::new(false),
            since: Mutex::new(Clock::Head(Instant::now())),
            reader: Mutex::new(None),
        }
    }

    fn request_started(&self, version: Version) {
        if version == Version::HTTP_2 {
            self.h2.store(true, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        *self.since.lock().expect("connection state") = Clock::Busy;
    }

    fn request_ended(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut since = self.since.lock().expect("connection state");
            if self.in_flight.load(Ordering::Acquire) == 0 {
                *since = Clock::Idle(Instant::now());
            }
            drop(since);
            if let Some(waker) = self.reader.lock().expect("connection state").take() {
                waker.wake();
            }
        }
    }

    /// Bytes arrived: an idle HTTP/1.1 connection starts reading a head.
    fn bytes_read(&self) {
        let mut since = self.since.lock().expect("connection state");
        match *since {
            Clock::Idle(_) if !self.h2.load(Ordering::Relaxed) => {
                *since = Clock::Head(Instant::now());
            }
            Clock::Idle(_) | Clock::Head(_) | Clock::Busy => {}
        }
    }

    fn deadline(&self, bounds: &Bounds) -> Option<Instant> {
        match *self.since.lock().expect("connection state") {
            Clock::Head(at) => Some(at + bounds.header_read),
            Clock::Idle(at) => Some(at + bounds.idle),
            Clock::Busy => None,
        }
    }
}

/// A TCP stream closed (read error `TimedOut`) when its connection's
/// deadline passes; holds the connection's slot.
pub struct Watched {
    stream: TcpStream,
    state: Arc<ConnState>,
    bounds: Arc<Bounds>,
    timer: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
    _address: Option<AddressSlot>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.state.bytes_read();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                *this.state.reader.lock().expect("connection state") = Some(cx.waker().clone());
                let Some(deadline) = this.state.deadline(&this.bounds) else {
                    return Poll::Pending;
                };
                if this.timer.deadline() != deadline {
                    this.timer.as_mut().reset(deadline);
                }
                match this.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the connection sent no complete request in time",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connection's service: counts requests in flight until their
/// response body ends (or is dropped), and gives each request body its
/// deadline.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    state: Arc<ConnState>,
    bounds: Arc<Bounds>,
}

impl<S, B> tower::Service<Request<B>> for Tracked<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.state.request_started(request.version());
        let guard = InFlight(self.state.clone());
        let limit = self.bounds.body_read;
        let request = request.map(|body| {
            Body::new(Timed {
                body,
                deadline: Box::pin(tokio::time::sleep(limit)),
                limit,
            })
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                Body::new(GuardedBody {
                    body,
                    _guard: guard,
                })
            }))
        })
    }
}

/// A request body that must arrive within `http.body_read_timeout_seconds`
/// of its request: a body trickled in a byte at a time would otherwise hold
/// its connection (and its slot) for as long as the client likes. Only a
/// body still arriving is cut; reading a complete one is never refused.
struct Timed<B> {
    body: B,
    deadline: Pin<Box<Sleep>>,
    limit: Duration,
}

impl<B> http_body::Body for Timed<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the request body did not arrive within {} s (http.body_read_timeout_seconds)",
                        this.limit.as_secs()
                    ),
                )
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Ends its request when dropped.
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// A response body that keeps its request in flight until it is dropped.
struct GuardedBody {
    body: Body,
    _guard: InFlight,
}

impl http_body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The address a request came from: the TCP peer (the appliance
/// terminates TLS itself), or the client a standby of the pair forwarded
/// for, as [`believe_the_pair`] established. A router called in process,
/// without a connection, sees the unspecified address.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::IpAddr);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|info| info.0.ip())
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
        ))
    }
}

/// The header a standby names the client's address in.
pub const FORWARDED_FOR: &str = "x-agentbay-forwarded-for";
/// The header a standby names itself in.
pub const FORWARDED_BY: &str = "x-agentbay-forwarded-by";
/// The header carrying the pair key's proof of the two above
/// ([`PairKey::forward_proof`](crate::domain::cluster::PairKey::forward_proof)).
pub const PAIR_PROOF: &str = "x-agentbay-pair-proof";

/// The forwarding headers, removed from every request before a handler
/// sees it, and from every request a standby forwards before it adds its
/// own.
pub const FORWARDING_HEADERS: [&str; 4] = [FORWARDED_FOR, FORWARDED_BY, PAIR_PROOF, "forwarded"];

/// Where a request came from, the one rule: the TCP peer, unless the peer
/// is a standby of this pair that forwarded it, proven by the pair key
/// over the client's address, the standby's name and the time (within
/// [`FORWARD_SKEW_SECONDS`](crate::domain::cluster::FORWARD_SKEW_SECONDS)
/// of the system clock: the pair's clocks, not the appliance's). Then the
/// client's address replaces the peer's for everything after (the
/// limiter, the lockouts, the audit trail). Forwarding headers without
/// a valid proof are dropped, unread.
pub async fn believe_the_pair(
    key: Option<Arc<crate::domain::cluster::PairKey>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let headers = request.headers();
    let forwarded = headers.contains_key(PAIR_PROOF).then(|| {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let client: IpAddr = text(FORWARDED_FOR)?.parse().ok()?;
        let (by, proof) = (text(FORWARDED_BY)?, text(PAIR_PROOF)?);
        let now = chrono::Utc::now().timestamp();
        key.as_ref()?
            .check_forward(proof, client, by, now)
            .then_some(client)
    });
    match forwarded {
        Some(Some(client)) => {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(std::net::SocketAddr::new(
                    client, 0,
                )));
        }
        Some(None) => tracing::debug!(
            "a forwarded request's pair proof does not hold; its client address is not believed"
        ),
        None => {}
    }
    for name in FORWARDING_HEADERS {
        request.headers_mut().remove(name);
    }
    next.run(request).await
}

/// Gives every request body a reader to the end: a body a handler stops
/// reading (refused as too large, or not needed) is read on and discarded,
/// up to 16 MiB and ten seconds, so that the client finishes sending and
/// receives the answer. Without it an HTTP/2 client still uploading saw
/// its stream reset instead of the 413.
pub async fn drain_unread_bodies(request: axum::extract::Request) -> axum::extract::Request {
    request.map(|body| Body::new(Drained(Some(body))))
}

/// A request body drained when dropped unfinished.
struct Drained(Option<Body>);

impl http_body::Body for Drained {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match self.0.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0
            .as_ref()
            .map(|b| b.size_hint())
            .unwrap_or_else(|| http_body::SizeHint::with_exact(0))
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        const MAX_BYTES: u64 = 16 * 1024 * 1024;
        const MAX_TIME: Duration = Duration::from_secs(10);
        let Some(body) = self.0.take() else { return };
        if http_body::Body::is_end_stream(&body) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            use http_body_util::BodyExt;
            let mut body = body;
            let mut read = 0u64;
            let _ = tokio::time::timeout(MAX_TIME, async {
                while read <= MAX_BYTES {
                    match body.frame().await {
                        Some(Ok(frame)) => {
                            read += frame.data_ref().map_or(0, |d| d.len() as u64);
                        }
                        Some(Err(_)) | None => break,
                    }
                }
            })
            .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_remote_address_holds_its_share_and_loopback_none() {
        let mut bounds = Bounds::from_config(&HttpConfig::default());
        bounds.max_per_address = 2;
        let acceptor = BoundedAcceptor::new(bounds);
        let remote: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        let first = acceptor.address_slot(Some(remote)).unwrap();
        let second = acceptor.address_slot(Some(remote)).unwrap();
        assert!(first.is_some() && second.is_some());
        assert!(
            acceptor.address_slot(Some(remote)).is_err(),
            "a third is refused"
        );
        assert!(acceptor.address_slot(Some(other)).unwrap().is_some());
        // This host, also as an IPv4-mapped IPv6 address, is not counted.
        for local in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            for _ in 0..5 {
                assert!(
                    acceptor
                        .address_slot(Some(local.parse().unwrap()))
                        .unwrap()
                        .is_none()
                );
            }
        }
        // A closed connection gives its slot back.
        drop(first);
        assert!(acceptor.address_slot(Some(remote)).unwrap().is_some());
        drop(second);
    }
}
