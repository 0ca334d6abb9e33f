//! The admin server against real sockets: its routes, the `/config` rule, and the bounds that
//! keep a slow or idle client from holding its descriptors and memory.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

const KEY: &str = "agent.admin_config_endpoint";

/// A served admin server; stopped when dropped.
struct Running {
    address: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(listen: &str, enabled: Option<bool>, limits: Limits) -> Running {
    let mut server = AdminServer::bind(listen, ConfigEndpoint { key: KEY, enabled }).await.expect("bind");
    server.limits = limits;
    let mut address = server.local_addr().expect("bound");
    if address.ip().is_unspecified() {
        address.set_ip(Ipv4Addr::LOCALHOST.into());
    }
    let metrics = PrometheusBuilder::new().build_recorder().handle();
    let checks = Checks {
        ready: Arc::new(|| Ok("ready".into())),
        dependencies: vec![
            ("kafka", Arc::new(|| Err("kafka unreachable; records are buffered".into()))),
            ("postgres", Arc::new(|| Ok("postgres reachable".into()))),
        ],
    };
    let config: ConfigView = Arc::new(|| "[agent]\nadmin_listen = \"x\"\n".into());
    let stop = CancellationToken::new();
    tokio::spawn(server.serve(metrics, Arc::new(|| {}), checks, config, stop.clone()));
    Running { address, stop }
}

/// Limits small enough for a test to reach.
fn quick() -> Limits {
    Limits { max_connections: 4, header_read_timeout: Duration::from_millis(300), lifetime: Duration::from_secs(1) }
}

/// One HTTP/1.0 GET (the admin client's): status and body.
async fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let response = client::get(address, path, Duration::from_secs(5)).await.expect("a response within 5s");
    (response.status, response.body)
}

/// How long until the server closes `stream` (end of file or reset), if within `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

#[tokio::test]
async fn admin_server_closes_connections_beyond_its_limit() {
    let limits = Limits { header_read_timeout: Duration::from_secs(30), lifetime: Duration::from_secs(30), ..quick() };
    let server = start("127.0.0.1:0", None, limits).await;
    let mut held = Vec::new();
    for _ in 0..limits.max_connections {
        held.push(TcpStream::connect(server.address).await.expect("connect"));
    }
    // The fifth is accepted and closed at once, not left in the kernel's backlog.
    let mut extra = TcpStream::connect(server.address).await.expect("connect");
    assert!(closed_within(&mut extra, Duration::from_secs(2)).await.is_some(), "closed beyond the limit");
    // A slot that frees up serves again.
    drop(held.pop());
    let served = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let attempt = async {
                let mut stream = TcpStream::connect(server.address).await.ok()?;
                stream.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.ok()?;
                let mut response = String::new();
                stream.read_to_string(&mut response).await.ok()?;
                response.starts_with("HTTP/1.0 200").then_some(())
            };
            if attempt.await.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "a freed slot is used again");
}

#[tokio::test]
async fn admin_server_closes_a_connection_that_never_finishes_its_headers() {
    let server = start("127.0.0.1:0", None, Limits { lifetime: Duration::from_secs(30), ..quick() }).await;
    let mut slow = TcpStream::connect(server.address).await.expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await.expect("write");
    // A slowloris: one more header byte every 50 ms, never the blank line.
    let (mut reader, mut writer) = slow.into_split();
    let dribble = tokio::spawn(async move {
        while writer.write_all(b"X").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut buffer = [0u8; 1024];
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    dribble.abort();
    assert!(ended.is_ok(), "closed within the header read timeout, though bytes kept coming");
}

#[tokio::test]
async fn admin_server_closes_a_kept_alive_connection_left_idle() {
    let server = start("127.0.0.1:0", None, Limits { lifetime: Duration::from_secs(30), ..quick() }).await;
    let mut stream = TcpStream::connect(server.address).await.expect("connect");
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut response = vec![0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut response)).await.expect("response");
    assert!(String::from_utf8_lossy(&response[..read.expect("read")]).starts_with("HTTP/1.1 200"));
    let idle = closed_within(&mut stream, Duration::from_secs(3)).await;
    assert!(idle.is_some(), "an idle kept-alive connection is closed");
}

#[tokio::test]
async fn admin_server_ends_a_connection_at_its_lifetime_however_busy() {
    let limits = quick();
    let server = start("127.0.0.1:0", None, limits).await;
    let mut stream = TcpStream::connect(server.address).await.expect("connect");
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    // Requests keep coming, each well within the header timeout.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.is_err() {
                break;
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "a busy connection still ends");
    assert!(started.elapsed() >= limits.lifetime - Duration::from_millis(100), "{:?}", started.elapsed());
}

#[tokio::test]
async fn config_is_served_when_the_admin_server_listens_on_loopback() {
    let server = start("127.0.0.1:0", None, Limits::default()).await;
    assert_eq!(get(server.address, "/config").await, (200, "[agent]\nadmin_listen = \"x\"\n".into()));
}

#[tokio::test]
async fn config_is_refused_on_other_addresses_with_a_body_saying_how_to_enable_it() {
    let server = start("0.0.0.0:0", None, Limits::default()).await;
    let (status, body) = get(server.address, "/config").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(&format!("{KEY} = true")) && body.contains("0.0.0.0"), "{body}");
    // The other routes are served as ever.
    assert_eq!(get(server.address, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(get(server.address, "/readyz").await.0, 200);
    assert_eq!(get(server.address, "/metrics").await.0, 200);
}

#[tokio::test]
async fn config_follows_the_key_when_it_is_set() {
    let enabled = start("0.0.0.0:0", Some(true), Limits::default()).await;
    assert_eq!(get(enabled.address, "/config").await.0, 200);
    let disabled = start("127.0.0.1:0", Some(false), Limits::default()).await;
    let (status, body) = get(disabled.address, "/config").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(KEY), "{body}");
}

#[tokio::test]
async fn a_dependency_state_is_served_apart_from_readiness() {
    let server = start("127.0.0.1:0", None, Limits::default()).await;
    assert_eq!(get(server.address, "/readyz").await, (200, "ready\n".into()), "a dependency never gates /readyz");
    assert_eq!(get(server.address, "/healthz/kafka").await, (503, "kafka unreachable; records are buffered\n".into()));
    assert_eq!(get(server.address, "/healthz/postgres").await, (200, "postgres reachable\n".into()));
    let (status, body) = get(server.address, "/healthz/redis").await;
    assert_eq!(status, 404);
    assert!(body.contains("/healthz/kafka, /healthz/postgres"), "{body}");
}
