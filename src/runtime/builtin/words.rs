//! A transport's failure in an operator's words.
//!
//! The one place where the errors of the transports a release's calls go
//! through (an MCP server over stdio or HTTP, a model server over HTTP)
//! enter the domain: the stored and shown text of a call says what failed
//! (the connection refused to host:port, a TLS failure, a timeout, an HTTP
//! status, the server closing its end) and never names a Rust type.

use rmcp::transport::streamable_http_client::StreamableHttpError;

/// `error` in words, found along its chain of causes.
pub fn in_words(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut innermost = error;
    while let Some(e) = cause {
        if let Some(r) = e.downcast_ref::<reqwest::Error>() {
            return reqwest_words(r);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io_words(io);
        }
        innermost = e;
        // rmcp's initialisation error and its HTTP transport's hold their
        // causes without naming them as the source.
        cause =
            if let Some(rmcp::service::ClientInitializeError::TransportError { error, .. }) =
                e.downcast_ref::<rmcp::service::ClientInitializeError>()
            {
                Some(error as &(dyn std::error::Error + 'static))
            } else if let Some(StreamableHttpError::Client(r)) =
                e.downcast_ref::<StreamableHttpError<reqwest::Error>>()
            {
                Some(r as &(dyn std::error::Error + 'static))
            } else {
                e.source()
            };
    }
    without_types(&innermost.to_string())
}

/// An HTTP client's failure, naming the server's host:port.
fn reqwest_words(r: &reqwest::Error) -> String {
    let server = r
        .url()
        .map(|u| match u.host_str() {
            Some(h) => format!("{h}:{}", u.port_or_known_default().unwrap_or(0)),
            None => u.to_string(),
        })
        .unwrap_or_else(|| "the server".into());
    if r.is_timeout() {
        return format!("timed out waiting for {server}");
    }
    if let Some(status) = r.status() {
        return format!("{server} answered HTTP {status}");
    }
    // The chain of causes, into the errors io::Errors wrap (their source()
    // skips the wrapped error itself, where rustls' is found).
    let chain = || {
        std::iter::successors(std::error::Error::source(r), |e| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|inner| inner as &(dyn std::error::Error + 'static))
                .or_else(|| e.source())
        })
    };
    let tls = chain().find_map(|e| e.downcast_ref::<rustls::Error>());
    if let Some(tls) = tls {
        return format!("TLS failure with {server}: {tls}");
    }
    let io = chain().find_map(|e| e.downcast_ref::<std::io::Error>());
    if r.is_connect() {
        let why = io.map_or_else(|| "no connection".to_string(), io_words);
        return format!("{why} (connecting to {server})");
    }
    if r.is_redirect() {
        return format!("{server} answered with a redirect, which is not followed");
    }
    match io {
        Some(io) => format!("{} (talking to {server})", io_words(io)),
        None => format!("the exchange with {server} failed"),
    }
}

/// `text` without the Rust type names some errors carry (rmcp names its
/// transport's type in brackets): bracketed segments and words that hold
/// a path (`::`) are dropped.
fn without_types(text: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    let mut segment = String::new();
    for c in text.chars() {
        match c {
            '[' | '<' => {
                depth += 1;
                segment.push(c);
            }
            ']' | '>' if depth > 0 => {
                depth -= 1;
                segment.push(c);
                if depth == 0 {
                    if !segment.contains("::") {
                        out.push_str(&segment);
                    }
                    segment.clear();
                }
            }
            _ if depth > 0 => segment.push(c),
            _ => out.push(c),
        }
    }
    out.push_str(&segment);
    let words: Vec<&str> = out
        .split_whitespace()
        .filter(|w| !w.contains("::"))
        .collect();
    words.join(" ")
}

fn io_words(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::ConnectionReset => "connection reset by the server".into(),
        K::TimedOut => "timed out".into(),
        K::BrokenPipe | K::UnexpectedEof => "the server closed the connection".into(),
        K::NotFound => "not found".into(),
        K::PermissionDenied => "permission denied".into(),
        _ => {
            let text = without_types(&e.to_string());
            if text.contains("certificate") || text.to_ascii_lowercase().contains("tls") {
                format!("TLS failure: {text}")
            } else {
                text
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(std::io::Error);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "Transport [rmcp::transport::worker::WorkerTransport<X>] error: {}",
                self.0
            )
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn transport_errors_are_told_in_words_not_types() {
        let refused = Wrapped(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(in_words(&refused), "connection refused");
        let io = std::io::Error::other("no route");
        assert_eq!(in_words(&io), "no route");
        let typed = std::fmt::Error;
        assert!(!in_words(&typed).contains("::"));
        assert_eq!(
            without_types(
                "Transport [rmcp::transport::worker::WorkerTransport<rmcp::X<Y>>] error: Client error: closed"
            ),
            "Transport error: Client error: closed"
        );
    }

    /// A real HTTP client against real listeners: refused, an HTTP status,
    /// a timeout and a TLS failure each name the server and what failed.
    #[tokio::test]
    async fn an_http_clients_failures_name_the_server_and_what_failed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_millis(300))
            .build()
            .unwrap();

        // Refused: a port nobody listens on.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let e = client
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            in_words(&e),
            format!("connection refused (connecting to 127.0.0.1:{port})")
        );

        // A server that answers 503, and one that never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((mut s, _)) = listener.accept().await {
                n += 1;
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                if n == 1 {
                    let _ = s
                        .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                        .await;
                } else {
                    // Holds the connection open and silent.
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
            }
        });
        let answered = client
            .get(format!("http://{addr}/"))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap_err();
        assert_eq!(
            in_words(&answered),
            format!("{addr} answered HTTP 503 Service Unavailable")
        );
        let silent = client
            .get(format!("http://{addr}/"))
            .send()
            .await
            .unwrap_err();
        assert_eq!(in_words(&silent), format!("timed out waiting for {addr}"));

        // TLS spoken to a plain HTTP server.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_addr = plain.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = plain.accept().await {
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let tls = client
            .get(format!("https://{plain_addr}/"))
            .send()
            .await
            .unwrap_err();
        let said = in_words(&tls);
        assert!(
            said.contains("TLS") && said.contains(&plain_addr.to_string()) && !said.contains("::"),
            "{said}"
        );
    }
}
