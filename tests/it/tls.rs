//! TLS to PostgreSQL (the persister verifies the server's certificate) and authentication to
//! Kafka: SCRAM over SASL_SSL, and OAUTHBEARER with librdkafka's OIDC client-credentials flow.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

fn ca() -> String {
    std::env::var("SLUICE_TEST_PG_CA")
        .expect("SLUICE_TEST_PG_CA: the stack's PostgreSQL offers TLS (`scripts/stack env`)")
}

fn require_tls(url: &str) -> String {
    format!("{url}{}sslmode=require", if url.contains('?') { '&' } else { '?' })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_persister_writes_over_verified_tls_when_the_url_requires_it() {
    let pipeline = Scenario::new("tls")
        .set("postgres", "url", require_tls(&services().pg))
        .set("postgres", "ca_file", ca())
        .pipeline()
        .await;
    send_lines(&pipeline.config.socket(), &[b"over tls".to_vec()]).await;
    until_rows(&pipeline.db, 1).await;
    let encrypted: bool = pipeline
        .db
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'sluice-persist' AND a.datname = current_database()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(encrypted, "the persister's connections use TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_persister_refuses_a_certificate_it_cannot_verify() {
    // sslmode=require without the CA that signed the server's certificate.
    let setup = Scenario::new("untrusted")
        .set("postgres", "url", require_tls(&services().pg))
        .with(|config| _ = config.table["postgres"].as_table_mut().expect("postgres").remove("ca_file"))
        .build()
        .await;
    let config = &setup.config;
    let path = config.write();
    let persister =
        Process::spawn("persist", &["persist", "--config", path.to_str().expect("path")], config.dir.path());
    until_logged(&persister, "certificate verify failed").await;
    // Ready all the same (issue 30: readiness never follows PostgreSQL); its state says it.
    let (status, body) = http_get(persister.admin(), "/healthz/postgres").await.expect("healthz/postgres");
    assert_eq!(status, 503, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_and_a_persister_ship_through_sasl_ssl_with_scram_and_a_private_ca() {
    let broker = PrivateBroker::start_sasl_ssl().await;
    let (sasl_bootstrap, ca) = broker.sasl_ssl.clone().expect("a SASL_SSL listener");
    let mut properties = toml::Table::new();
    for (key, value) in [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanisms", "SCRAM-SHA-512"),
        ("sasl.username", "sluice"),
        ("ssl.ca.location", ca.to_str().expect("path")),
    ] {
        properties.insert(key.into(), value.into());
    }
    let mut from_env = toml::Table::new();
    from_env.insert("sasl.password".into(), "SLUICE_TEST_SASL_PASSWORD".into());
    let setup = Scenario::new("sasl")
        .on(&broker)
        .set("kafka", "brokers", sasl_bootstrap)
        .set("kafka", "properties", properties)
        .set("kafka", "properties_from_env", from_env)
        .with(|config| config.env.push(("SLUICE_TEST_SASL_PASSWORD".into(), SASL_PASSWORD.into())))
        .build()
        .await;
    let config = &setup.config;

    let _persister = setup.persister().await;
    let agent = setup.agent().await;
    let db = setup.db().await;
    let lines: Vec<Vec<u8>> = (0..100).map(|n| numbered(&setup.topic, n).into_bytes()).collect();
    send_lines(&config.socket(), &lines).await;
    assert_eq!(until_rows(&db, 100).await, 100);
    assert!(!agent.log_text().contains(SASL_PASSWORD), "the password is never logged");
    let (_, shown) = http_get(config.agent_admin(), "/config").await.expect("/config");
    assert!(!shown.contains(SASL_PASSWORD) && shown.contains("SLUICE_TEST_SASL_PASSWORD"), "{shown}");
}

/// An OAuth 2.0 token endpoint for the client-credentials grant, on a loopback port: it checks the
/// client's id and secret (HTTP Basic, as librdkafka sends them) and issues an unsigned JWT
/// (`alg: none`: what Kafka's unsecured-JWS validator takes) for `sub` = the client id, valid an
/// hour. Counts the tokens it issued.
struct TokenEndpoint {
    url: String,
    issued: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl TokenEndpoint {
    async fn start(client_id: &'static str, secret: &'static str) -> Self {
        use base64::Engine as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/oauth2/token", listener.local_addr().expect("address"));
        let (issued, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let expected = format!(
            "authorization: basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{client_id}:{secret}"))
        )
        .to_ascii_lowercase();
        let (counted, denied) = (issued.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                let (expected, counted, denied) = (expected.clone(), counted.clone(), denied.clone());
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    // Headers, then the form body (`grant_type=client_credentials…`).
                    while !String::from_utf8_lossy(&request).contains("grant_type=") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
                    let response = if text.contains(&expected) && text.contains("grant_type=client_credentials") {
                        counted.fetch_add(1, Ordering::SeqCst);
                        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .expect("clock")
                            .as_secs();
                        let header = engine.encode(r#"{"alg":"none"}"#);
                        let claims =
                            engine.encode(format!(r#"{{"sub":"{client_id}","iat":{now},"exp":{}}}"#, now + 3600));
                        let body = format!(
                            r#"{{"access_token":"{header}.{claims}.","token_type":"bearer","expires_in":3600}}"#
                        );
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    } else {
                        denied.fetch_add(1, Ordering::SeqCst);
                        let body = r#"{"error":"invalid_client"}"#;
                        format!(
                            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        Self { url, issued, refused }
    }
}

/// SASL OAUTHBEARER with librdkafka's OIDC client-credentials flow: the agent and the persister
/// each fetch a token from the endpoint (the secret from the environment, never shown) and the
/// broker takes it; records go through to PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_and_a_persister_ship_with_oauthbearer_tokens_from_an_oidc_endpoint() {
    const SECRET: &str = "oidc-client-secret-9f2c";
    let broker = PrivateBroker::start_sasl_ssl().await;
    let endpoint = TokenEndpoint::start("sluice-agent", SECRET).await;
    let oauth = broker.oauthbearer.clone().expect("an OAUTHBEARER listener");
    let mut properties = toml::Table::new();
    for (key, value) in [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "OAUTHBEARER"),
        ("sasl.oauthbearer.method", "oidc"),
        ("sasl.oauthbearer.client.id", "sluice-agent"),
        ("sasl.oauthbearer.token.endpoint.url", endpoint.url.as_str()),
    ] {
        properties.insert(key.into(), value.into());
    }
    let mut from_env = toml::Table::new();
    from_env.insert("sasl.oauthbearer.client.secret".into(), "SLUICE_TEST_OIDC_SECRET".into());
    let setup = Scenario::new("oauth")
        .on(&broker)
        .set("kafka", "brokers", oauth)
        .set("kafka", "properties", properties)
        .set("kafka", "properties_from_env", from_env)
        .with(|config| config.env.push(("SLUICE_TEST_OIDC_SECRET".into(), SECRET.into())))
        .build()
        .await;
    let config = &setup.config;
    let persister = setup.persister().await;
    let agent = setup.agent().await;
    let db = setup.db().await;
    let lines: Vec<Vec<u8>> = (0..50).map(|n| numbered(&setup.topic, n).into_bytes()).collect();
    send_lines(&config.socket(), &lines).await;
    assert_eq!(until_rows(&db, 50).await, 50);
    assert!(endpoint.issued.load(Ordering::SeqCst) >= 2, "a token for the agent and one for the persister");
    assert_eq!(endpoint.refused.load(Ordering::SeqCst), 0);
    for log in [agent.log_text(), persister.log_text()] {
        assert!(!log.contains(SECRET), "the secret is never logged");
    }
    let (_, shown) = http_get(config.agent_admin(), "/config").await.expect("/config");
    assert!(!shown.contains(SECRET) && shown.contains("SLUICE_TEST_OIDC_SECRET"), "{shown}");
}

/// A server that answers PostgreSQL's SSLRequest with `N` ("no TLS here") — what a server
/// without TLS, or a man in the middle downgrading the connection, says — and notes whether the
/// client then goes on in plaintext (its startup message names the user and database).
struct NoTlsServer {
    address: SocketAddr,
    ssl_requests: Arc<AtomicUsize>,
    plaintext: Arc<AtomicBool>,
    /// Refused connections whose next move is known: the client closed, sent something
    /// (`plaintext`), or stayed silent for 2 s.
    judged: Arc<AtomicUsize>,
}

impl NoTlsServer {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (ssl_requests, plaintext) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let judged = Arc::new(AtomicUsize::new(0));
        let (requests, seen, decided) = (ssl_requests.clone(), plaintext.clone(), judged.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (requests, seen, decided) = (requests.clone(), seen.clone(), decided.clone());
                tokio::spawn(async move {
                    // SSLRequest: length 8, code 80877103.
                    let mut request = [0u8; 8];
                    if stream.read_exact(&mut request).await.is_err() || request != [0, 0, 0, 8, 4, 210, 22, 47] {
                        return;
                    }
                    requests.fetch_add(1, Ordering::Relaxed);
                    if stream.write_all(b"N").await.is_err() {
                        return;
                    }
                    let mut next = [0u8; 1];
                    if let Ok(Ok(1)) = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut next)).await {
                        seen.store(true, Ordering::Relaxed);
                    }
                    decided.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        Self { address, ssl_requests, plaintext, judged }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_ca_file_and_no_sslmode_the_persister_refuses_a_server_that_offers_no_tls() {
    let server = NoTlsServer::start().await;
    let setup = Scenario::new("downgrade")
        .without_topic()
        .set("postgres", "url", format!("postgres://postgres@{}/sluice", server.address))
        .set("postgres", "ca_file", ca())
        .build()
        .await;
    let config = &setup.config;
    let path = config.write();
    let persister =
        Process::spawn("persist", &["persist", "--config", path.to_str().expect("path")], config.dir.path());
    until_logged(&persister, "server does not support TLS").await;
    assert!(server.ssl_requests.load(Ordering::Relaxed) >= 1, "the persister asked for TLS");
    // The server gives a refused client 2 s to go on in plaintext; it has judged one of them.
    until("a refused connection judged", || async {
        if server.judged.load(Ordering::Relaxed) >= 1 { Ok(()) } else { Err("none yet") }
    })
    .await;
    assert!(!server.plaintext.load(Ordering::Relaxed), "nothing was sent in plaintext after the refusal");
    let (status, body) = http_get(persister.admin(), "/healthz/postgres").await.expect("healthz/postgres");
    assert_eq!(status, 503, "{body}");
}
