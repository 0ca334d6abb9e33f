//! The other side of the admin port: one plain HTTP/1.0 `GET`, for `sluice status`, the
//! integration tests and the benchmark (no client library needed for three routes of text).
//!
//! Owns: the request, reading the whole answer (the server closes an HTTP/1.0 connection), its
//! status and body, and the bound on how long that may take. Must not: follow redirects, keep
//! connections, or grow into a general HTTP client.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code (0 if the status line could not be read).
    pub status: u16,
    /// The body, as text.
    pub body: String,
}

/// `GET path` from the admin server at `address`, giving up after `timeout` (an error of kind
/// `TimedOut`).
pub async fn get(address: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<Response> {
    let request = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        let status = response.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
        Ok(Response { status, body })
    };
    tokio::time::timeout(timeout, request).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer in {}s", timeout.as_secs())))
    })
}
