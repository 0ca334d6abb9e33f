//! The `otlp` listener against the real stack: stock OpenTelemetry SDK exporters (Python and Java
//! over gRPC and HTTP on loopback, Go over gRPC on the Unix socket) land rows with their trace ids;
//! an Export is answered only once its records are delivered, refusals come back as a partial
//! success the SDK reports, an Export that cannot be made safe in time is told to retry (with
//! `RetryInfo` / `Retry-After`), the SDK's retry carries records over an agent that was down,
//! and hostile requests (a huge declared length, a compression bomb, deep nesting) are refused
//! whole, counted, in bounded memory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use prost::Message as _;

use crate::support::*;
use sluice::telemetry;

/// An `otlp` listener named `otlp` on a socket in the test's directory and two free loopback
/// ports (gRPC's and HTTP's, though each answers both); returns the socket and the addresses.
fn otlp_listener(config: &mut TestConfig) -> (PathBuf, SocketAddr, SocketAddr) {
    let socket = config.add_listener("otlp", "otlp");
    let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let (grpc, http) = (loopback(free_port()), loopback(free_port()));
    config.listener("otlp", "addresses", toml::Value::Array(vec![grpc.to_string().into(), http.to_string().into()]));
    (socket, grpc, http)
}

/// The Python SDK program (tests/otlp/python/export.py): `kind` is `grpc` or `http`.
fn python_sdk(kind: &str, endpoint: &str, count: usize) -> std::process::Command {
    let mut command = std::process::Command::new(python());
    command.arg(source_path("tests/otlp/python/export.py")).args([kind, endpoint, &count.to_string()]);
    command
}

/// Builds the Go SDK program (tests/otlp/go) into `dir`.
fn go_sdk(dir: &Path) -> PathBuf {
    let binary = dir.join("otlp-go");
    let output = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(source_path("tests/otlp/go"))
        .output()
        .expect("run go build");
    assert!(output.status.success(), "go build failed:\n{}", String::from_utf8_lossy(&output.stderr));
    binary
}

/// The Java SDK program (tests/otlp/java), compiled into `dir`: a command running it with `kind`
/// (`grpc` or `http`), `endpoint` and `count`.
fn java_sdk(dir: &Path, kind: &str, endpoint: &str, count: usize) -> std::process::Command {
    let build = dir.join("otlp-java");
    let classpath = build.join("classpath.txt");
    if !classpath.exists() {
        let output = std::process::Command::new("mvn")
            .args(["-B", "-ntp", "-q", "compile", "dependency:build-classpath"])
            .arg(format!("-Dotlp.build={}", build.display()))
            .arg(format!("-Dmdep.outputFile={}", classpath.display()))
            .current_dir(source_path("tests/otlp/java"))
            .output()
            .expect("run mvn");
        assert!(output.status.success(), "mvn failed:\n{}", String::from_utf8_lossy(&output.stdout));
    }
    let dependencies = std::fs::read_to_string(&classpath).expect("the classpath");
    let mut command = std::process::Command::new("java");
    command
        .arg("-cp")
        .arg(format!("{}:{}", build.join("classes").display(), dependencies.trim()))
        .arg("dev.sluice.otlptest.Export")
        .args([kind, endpoint, &count.to_string()]);
    command
}

fn run(mut command: std::process::Command, what: &str) -> String {
    let output = command.output().unwrap_or_else(|error| panic!("cannot run {what}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn string_body(text: &str) -> Option<AnyValue> {
    Some(AnyValue { value: Some(any_value::Value::StringValue(text.to_string())) })
}

fn request(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs { log_records: records, ..Default::default() }],
            ..Default::default()
        }],
    }
}

/// One HTTP/1.1 POST; the status, the headers and the body.
async fn post(
    address: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, hyper::HeaderMap, Bytes) {
    let stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(connection);
    let mut request = hyper::Request::post(path).header("host", address.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = within(
        WAIT,
        "an OTLP/HTTP answer",
        sender.send_request(request.body(Full::new(Bytes::from(body))).expect("request")),
    )
    .await
    .expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (parts.status.as_u16(), parts.headers, body)
}

/// What a unary gRPC call came back with: the headers, the message (if any) and the trailers.
struct GrpcAnswer {
    headers: hyper::HeaderMap,
    message: Bytes,
    trailers: Option<hyper::HeaderMap>,
}

impl GrpcAnswer {
    /// `grpc-status`, from the trailers or (trailers-only) the headers.
    fn status(&self) -> i32 {
        let value =
            self.trailers.as_ref().and_then(|trailers| trailers.get("grpc-status")).or(self.headers.get("grpc-status"));
        value.and_then(|value| value.to_str().ok()).and_then(|value| value.parse().ok()).expect("a grpc-status")
    }
}

/// One gRPC call of `LogsService/Export` over HTTP/2 with prior knowledge; `body` is sent as is
/// (the caller frames it).
async fn grpc_call(address: SocketAddr, body: Vec<u8>) -> GrpcAnswer {
    let stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("handshake");
    tokio::spawn(connection);
    let request =
        hyper::Request::post(format!("http://{address}/opentelemetry.proto.collector.logs.v1.LogsService/Export"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from(body)))
            .expect("request");
    let response = within(WAIT, "a gRPC answer", sender.send_request(request)).await.expect("response");
    let (parts, mut body) = response.into_parts();
    let mut message = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("frame");
        match frame.into_data() {
            Ok(data) => message.extend_from_slice(&data),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    GrpcAnswer { headers: parts.headers, message: Bytes::from(message), trailers }
}

/// A message framed as gRPC sends it: flag 0, its length, its bytes.
fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut framed = vec![0];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    framed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_python_java_and_go_sdks_deliver_rows_with_trace_ids_over_grpc_http_and_the_unix_socket() {
    let mut addresses = None;
    let pipeline = Scenario::new("otlp_sdks").with(|config| addresses = Some(otlp_listener(config))).pipeline().await;
    let (socket, grpc, http) = addresses.expect("listener");
    let (config, db) = (&pipeline.config, &pipeline.db);

    let grpc_out = run(python_sdk("grpc", &format!("http://{grpc}"), 20), "the Python SDK over gRPC");
    let http_out = run(python_sdk("http", &format!("http://{http}/v1/logs"), 20), "the Python SDK over HTTP");
    let go = go_sdk(config.dir.path());
    let mut command = std::process::Command::new(&go);
    command.arg(format!("unix://{}", socket.display())).arg("20");
    let go_out = run(command, "the Go SDK over the Unix socket");
    assert!(!go_out.contains("error:"), "the Go SDK reported an error:\n{go_out}");
    let java = java_sdk(config.dir.path(), "grpc", &format!("http://{grpc}"), 10);
    assert!(run(java, "the Java SDK over gRPC").contains("flushed"));
    let java = java_sdk(config.dir.path(), "http", &format!("http://{http}/v1/logs"), 10);
    assert!(run(java, "the Java SDK over HTTP").contains("flushed"));

    until_rows(db, 80).await;
    let trace_id =
        |out: &str| out.lines().find_map(|line| line.strip_prefix("trace_id ")).expect("a trace id").to_string();
    let rows = db
        .query(
            "SELECT message, level, record->>'trace_id', record->'resource'->>'service.name', (record->'attributes'->>'n')::int \
             FROM logs ORDER BY message",
            &[],
        )
        .await
        .expect("rows");
    assert_eq!(rows.len(), 80, "each record once");
    for row in &rows {
        let message: String = row.get(0);
        let level: String = row.get(1);
        assert_eq!(level, "info", "{message}");
        let trace: Option<String> = row.get(2);
        let n: i32 = row.get(4);
        assert!(message.ends_with(&format!(" {n}")), "{message} carries n = {n}");
        if message.starts_with("python") {
            assert_eq!(row.get::<_, Option<String>>(3).as_deref(), Some("otlp-python"));
            assert!(
                trace == Some(trace_id(&grpc_out)) || trace == Some(trace_id(&http_out)),
                "{message}: trace id {trace:?}"
            );
        } else if message.starts_with("java") {
            assert_eq!(row.get::<_, Option<String>>(3).as_deref(), Some("otlp-java"));
            assert_eq!(trace.as_deref(), Some("0af7651916cd43dd8448eb211c80319c"));
        } else {
            assert!(message.starts_with("go otlp"), "{message}");
            assert_eq!(trace.as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        }
    }
    let metrics = scrape(config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS, &[("listener", "otlp")]), 80.0);
    assert!(metrics.count(telemetry::INGEST_OTLP_EXPORTS, &[("transport", "grpc"), ("outcome", "ok")]) >= 3.0);
    assert!(metrics.count(telemetry::INGEST_OTLP_EXPORTS, &[("transport", "http"), ("outcome", "ok")]) >= 2.0);
    assert_eq!(metrics.count(telemetry::INGEST_OTLP_EXPORTS, &[("outcome", "retry")]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_records_come_back_as_a_partial_success_with_their_reasons() {
    let mut addresses = None;
    let pipeline = Scenario::new("otlp_partial")
        .with(|config| addresses = Some(otlp_listener(config)))
        .listener("otlp", "max_record_size", "1KiB")
        .pipeline()
        .await;
    let (socket, _, http) = addresses.expect("listener");
    let (config, db) = (&pipeline.config, &pipeline.db);

    // Protobuf: one good record, one whose JSON is over max_record_size, one with a NUL.
    let records = vec![
        LogRecord { body: string_body("kept"), severity_number: 9, ..Default::default() },
        LogRecord { body: string_body(&"x".repeat(2000)), ..Default::default() },
        LogRecord { body: string_body("nul \u{0} inside"), ..Default::default() },
    ];
    let (status, _, body) =
        post(http, "/v1/logs", &[("content-type", "application/x-protobuf")], request(records).encode_to_vec()).await;
    assert_eq!(status, 200);
    let answer = ExportLogsServiceResponse::decode(body).expect("an ExportLogsServiceResponse");
    let partial = answer.partial_success.expect("a partial success");
    assert_eq!(partial.rejected_log_records, 2);
    assert_eq!(partial.error_message, "contains_nul 1, too_large 1");

    // OTLP/JSON, with a hex trace id, answered in JSON.
    let json = r#"{"resourceLogs":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"curl"}}]},
        "scopeLogs":[{"logRecords":[{"timeUnixNano":"1700000000000000000","severityNumber":13,
        "body":{"stringValue":"from json"},"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174"}]}]}]}"#;
    let (status, headers, body) = post(http, "/v1/logs", &[("content-type", "application/json")], json.into()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["content-type"], "application/json");

    // The Go SDK over the Unix socket: its records over max_record_size come back to it as a
    // partial success, which it reports.
    let go = go_sdk(config.dir.path());
    let mut command = std::process::Command::new(&go);
    command.arg(format!("unix://{}", socket.display())).args(["3", "2000"]);
    let out = run(command, "the Go SDK");
    assert!(out.contains("error:") && out.contains("(3 logs rejected)"), "the SDK heard the partial success:\n{out}");

    until_rows(db, 2).await;
    let rows = db
        .query("SELECT message, level, record->>'trace_id', event_time FROM logs ORDER BY message", &[])
        .await
        .expect("rows");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].get::<_, String>(0), "from json");
    assert_eq!(rows[0].get::<_, String>(1), "warn");
    assert_eq!(rows[0].get::<_, String>(2), "5b8efff798038103d269b633813fc60c");
    assert_eq!(rows[1].get::<_, String>(0), "kept");
    let metrics = scrape(config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::INGEST_REJECTED, &[("listener", "otlp"), ("reason", "too_large")]), 4.0);
    assert_eq!(metrics.count(telemetry::INGEST_REJECTED, &[("listener", "otlp"), ("reason", "contains_nul")]), 1.0);
    assert_eq!(metrics.count(telemetry::INGEST_OTLP_EXPORTS, &[("outcome", "partial_success")]), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_that_cannot_be_delivered_in_time_is_told_to_retry() {
    let mut addresses = None;
    let setup = Scenario::new("otlp_retry")
        .kafka_unreachable()
        .with(|config| addresses = Some(otlp_listener(config)))
        .listener("otlp", "export_timeout", "1s")
        .build()
        .await;
    let (_socket, grpc, http) = addresses.expect("listener");
    let (_, agent) = setup.listening_agent().await;
    until_within(WAIT, "the loopback address", || async { tokio::net::TcpStream::connect(http).await }).await;

    let records = request(vec![LogRecord { body: string_body("never delivered"), ..Default::default() }]);
    let (status, headers, _) =
        post(http, "/v1/logs", &[("content-type", "application/x-protobuf")], records.encode_to_vec()).await;
    assert_eq!(status, 503, "Kafka never answers: the record is not delivered within export_timeout");
    assert_eq!(headers["retry-after"], "1");

    let answer = grpc_call(grpc, grpc_frame(&records.encode_to_vec())).await;
    assert_eq!(answer.status(), 14, "UNAVAILABLE");
    assert!(answer.message.is_empty(), "trailers-only");
    use base64::Engine as _;
    let details = answer.headers.get("grpc-status-details-bin").expect("status details");
    let details = base64::engine::general_purpose::STANDARD_NO_PAD.decode(details.as_bytes()).expect("base64");
    let text = String::from_utf8_lossy(&details);
    assert!(text.contains("type.googleapis.com/google.rpc.RetryInfo"), "RetryInfo in the details: {text}");

    // A client that gives up first (its connection closed mid-wait): the Export runs to its end
    // all the same, its record and its answer counted.
    let stream = tokio::net::TcpStream::connect(http).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
    let connection = tokio::spawn(connection);
    let abandoned = hyper::Request::post("/v1/logs")
        .header("host", "x")
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(records.encode_to_vec())))
        .expect("request");
    let _ = tokio::time::timeout(std::time::Duration::from_millis(200), sender.send_request(abandoned)).await;
    connection.abort();
    drop(sender);
    until_metric(agent.admin(), telemetry::INGEST_OTLP_EXPORTS, &[("outcome", "retry")], 3.0).await;
    let metrics = scrape(agent.admin()).await;
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS, &[("listener", "otlp")]), 3.0, "each Export's record counted");
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_retries_while_the_agent_is_down_and_every_record_arrives() {
    let mut addresses = None;
    let setup = Scenario::new("otlp_down").with(|config| addresses = Some(otlp_listener(config))).build().await;
    let (_socket, grpc, _) = addresses.expect("listener");
    let _persister = setup.persister().await;
    let db = setup.db().await;

    // The SDK starts while the agent is down: its first try meets a connection closed at once
    // (however long Python takes to start), and is retried.
    let down = tokio::net::TcpListener::bind(grpc).await.expect("bind the gRPC address");
    let sdk = python_sdk("grpc", &format!("http://{grpc}"), 10)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the Python SDK");
    let (first_try, _) = within(WAIT, "the SDK's first try", down.accept()).await.expect("accept");
    drop((first_try, down));
    let _agent = setup.agent().await;
    let output = tokio::task::spawn_blocking(move || sdk.wait_with_output()).await.expect("join").expect("the SDK");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    until_rows(&db, 10).await;
    assert_eq!(row_count(&db).await, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_refused_whole_counted_and_held_in_bounded_memory() {
    let mut addresses = None;
    let setup = Scenario::new("otlp_hostile")
        .kafka_unreachable()
        .with(|config| addresses = Some(otlp_listener(config)))
        .listener("otlp", "export_timeout", "1s")
        .listener("otlp", "idle_timeout", "1s")
        .build()
        .await;
    let (_socket, grpc, http) = addresses.expect("listener");
    let (_, agent) = setup.listening_agent().await;
    until_within(WAIT, "the loopback address", || async { tokio::net::TcpStream::connect(http).await }).await;
    let protobuf = [("content-type", "application/x-protobuf")];

    // A declared length far past max_message_size: refused before a byte is read.
    let stream = tokio::net::TcpStream::connect(http).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(connection);
    let declared = hyper::Request::post("/v1/logs")
        .header("host", "x")
        .header("content-type", "application/x-protobuf")
        .header("content-length", (64u64 << 30).to_string())
        .body(Full::new(Bytes::from_static(b"\x0a")))
        .expect("request");
    let response = within(WAIT, "an answer", sender.send_request(declared)).await.expect("response");
    assert_eq!(response.status(), 413);

    // A compression bomb: 64 MiB of zeros in ~64 KiB of gzip stops inflating at the cap.
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        std::io::Write::write_all(&mut gzip, &zeros).expect("gzip");
    }
    let bomb = gzip.finish().expect("gzip");
    let (status, _, _) =
        post(http, "/v1/logs", &[("content-type", "application/x-protobuf"), ("content-encoding", "gzip")], bomb).await;
    assert_eq!(status, 413);

    // Nesting deeper than any decoder recurses: refused as malformed, in both encodings.
    let deep_json = format!(
        r#"{{"resourceLogs":[{{"scopeLogs":[{{"logRecords":[{{"body":{}"x"{}}}]}}]}}]}}"#,
        r#"{"arrayValue":{"values":["#.repeat(2000),
        "]}}".repeat(2000)
    );
    let (status, _, _) = post(http, "/v1/logs", &[("content-type", "application/json")], deep_json.into_bytes()).await;
    assert_eq!(status, 400);
    let mut deep = AnyValue { value: Some(any_value::Value::StringValue("x".into())) };
    for _ in 0..200 {
        deep = AnyValue {
            value: Some(any_value::Value::ArrayValue(opentelemetry_proto::tonic::common::v1::ArrayValue {
                values: vec![deep],
            })),
        };
    }
    let deep = request(vec![LogRecord { body: Some(deep), ..Default::default() }]);
    let (status, _, _) = post(http, "/v1/logs", &protobuf, deep.encode_to_vec()).await;
    assert_eq!(status, 400);

    // Not OTLP at all.
    let (status, _, _) = post(http, "/v1/logs", &protobuf, b"\xff\xff\xff\xff garbage".to_vec()).await;
    assert_eq!(status, 400);
    let (status, _, _) = post(http, "/v1/logs", &[("content-type", "text/plain")], b"hello".to_vec()).await;
    assert_eq!(status, 415);

    // gRPC: a message declaring 4 GiB with a few bytes behind it, and one over the cap.
    let mut lying = vec![0, 0xff, 0xff, 0xff, 0xff];
    lying.extend_from_slice(b"short");
    assert_eq!(grpc_call(grpc, lying).await.status(), 3, "INVALID_ARGUMENT");
    let oversized = grpc_frame(&vec![0u8; 5 << 20]);
    assert_eq!(grpc_call(grpc, oversized).await.status(), 3, "INVALID_ARGUMENT: it never fits, not worth a retry");

    // Many tiny records: 300 KB on the wire that would decode to ~20 MB.
    let tiny = request(vec![LogRecord::default(); 100_000]);
    let (status, _, _) = post(http, "/v1/logs", &protobuf, tiny.encode_to_vec()).await;
    assert_eq!(status, 413, "refused before it is built");

    // A connection that never sends a request is closed after idle_timeout.
    let mut idle = tokio::net::TcpStream::connect(grpc).await.expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut idle, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.expect("preface");
    let mut sink = Vec::new();
    within(WAIT, "the idle connection's close", tokio::io::AsyncReadExt::read_to_end(&mut idle, &mut sink))
        .await
        .expect("read");

    let metrics = scrape(agent.admin()).await;
    assert_eq!(
        metrics.count(telemetry::INGEST_REJECTED, &[("listener", "otlp"), ("reason", "too_large")]),
        3.0 + 100_000.0,
        "the tiny-records Export's every record counted, the others one each"
    );
    assert_eq!(metrics.count(telemetry::INGEST_REJECTED, &[("listener", "otlp"), ("reason", "malformed")]), 5.0);
    assert_eq!(metrics.count(telemetry::INGEST_OTLP_EXPORTS, &[("outcome", "refused")]), 9.0);
    assert_eq!(metrics.count(telemetry::INGEST_IDLE_CLOSED, &[("listener", "otlp")]), 1.0);
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS, &[("listener", "otlp")]), 0.0);
    let peak = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).expect("the agent's status");
    let peak_kib: u64 = peak
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    assert!(peak_kib < 96 * 1024, "the agent's peak RSS stayed bounded: {peak_kib} KiB");
}
