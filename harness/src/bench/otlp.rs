//! `sluice-bench otlp` (issue 32): what an OTLP record costs beside a `lines` record, in one run
//! on one agent — records/s and agent CPU per record; asserts nothing. Also the cost of
//! `multiline` on ordinary one-line records (a `lines` listener with the Java preset).
//!
//! One agent (release build, memory buffer, `ack_point = "delivered"`, the stack's broker) with
//! the `lines` listener and an `otlp` listener. Each phase sends RECORDS records of about 256
//! bytes and ends when Kafka has acknowledged all of them (`sluice_ship_delivered_total`):
//! `lines` — one connection, buffered writes, no acknowledgements (an app's fastest way in);
//! `lines+multiline` — the same into a listener with `multiline.preset = "java"` (no line joins:
//! the cost of checking each line);
//! `otlp/http` and `otlp/grpc` — Exports of BATCH records (the SDKs' batch processor sends 512),
//! `SENDERS` at a time, each waiting for its answer, which comes once its records are delivered
//! (OTLP is acknowledged mode). The clients are written here (HTTP/1.1 by hand, gRPC over the h2
//! crate) so the benchmark adds no feature to what the agent is built with.
//!
//! With `SLUICE_BENCH_OTELCOL` (the OpenTelemetry Collector `scripts/bench-otlp` builds), one more
//! phase: the same OTLP/gRPC Exports into the Collector's `otlp` receiver → `batch` → contrib's
//! `kafka` exporter (`raw` encoding: one Kafka message per record, as the agent sends; acks all,
//! zstd, as the agent), timed until its topic holds every record, CPU from its process.
//!
//! Owns: that table's scenario. Must not: print anything but the figures (stdout).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use prost::Message as _;
use sluice::client::load::{Amount, Load, Records, Writes};
use sluice::telemetry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::host::{clock_ticks, cpu_ticks, now};
use super::run::RunError;
use crate::{Services, TestConfig};

/// Exports in flight at once (an app with a few exporters, or one with concurrent exports).
const SENDERS: usize = 2;

/// The command line: `[RECORDS] [BATCH]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Records per phase.
    pub records: u64,
    /// Records per Export.
    pub batch: u64,
}

/// One phase's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    /// `lines`, `otlp/http`, `otlp/grpc`.
    pub protocol: &'static str,
    /// Records delivered.
    pub records: u64,
    /// From the first write to the last delivery, seconds.
    pub seconds: f64,
    /// CPU clock ticks (user + system) the agent used meanwhile.
    pub cpu_ticks: u64,
}

impl Phase {
    /// Records per second.
    pub fn rate(&self) -> f64 {
        self.records as f64 / self.seconds
    }

    /// Agent CPU per record, microseconds.
    pub fn cpu_micros_per_record(&self) -> f64 {
        self.cpu_ticks as f64 / clock_ticks() as f64 * 1e6 / self.records as f64
    }
}

#[expect(clippy::print_stdout, reason = "the figures are this command's output")]
fn say(line: &str) {
    println!("{line}");
}

fn failed(message: impl std::fmt::Display) -> RunError {
    RunError::Failed(message.to_string())
}

/// A body of about 256 bytes as JSON, for record `n`.
fn body(n: u64) -> String {
    let mut text = format!("bench record {n} ");
    text.extend(std::iter::repeat_n('x', 150usize.saturating_sub(text.len())));
    text
}

/// `count` records from `first`, as one Export request's protobuf bytes.
fn export(first: u64, count: u64) -> Vec<u8> {
    let string = |text: &str| Some(AnyValue { value: Some(any_value::Value::StringValue(text.to_string())) });
    let records = (first..first + count)
        .map(|n| LogRecord {
            time_unix_nano: 1_700_000_000_000_000_000 + n,
            severity_number: 9,
            severity_text: "INFO".into(),
            body: string(&body(n)),
            attributes: vec![KeyValue { key: "n".into(), value: string(&n.to_string()), ..Default::default() }],
            trace_id: vec![0x4b; 16],
            span_id: vec![0x0f; 8],
            flags: 1,
            ..Default::default()
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(opentelemetry_proto::tonic::resource::v1::Resource {
                attributes: vec![KeyValue { key: "service.name".into(), value: string("bench"), ..Default::default() }],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs { log_records: records, ..Default::default() }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// Delivered records so far.
async fn delivered(admin: SocketAddr) -> u64 {
    match crate::http_get(admin, "/metrics").await {
        Ok((200, body)) => sluice::telemetry::scrape::Scrape::parse(&body).sum(telemetry::SHIP_DELIVERED, &[]) as u64,
        _ => 0,
    }
}

/// Runs `send` and measures until `records` more are delivered.
async fn phase<F>(protocol: &'static str, pid: i32, admin: SocketAddr, records: u64, send: F) -> Result<Phase, RunError>
where
    F: std::future::Future<Output = Result<(), RunError>>,
{
    let before = delivered(admin).await;
    let (ticks, started) = (cpu_ticks(pid), now());
    send.await?;
    let deadline = now() + 300.0;
    while delivered(admin).await < before + records {
        if now() > deadline {
            return Err(failed(format!("{protocol}: not every record delivered within 300 s")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Phase { protocol, records, seconds: now() - started, cpu_ticks: cpu_ticks(pid) - ticks })
}

/// The Exports of the phase, shared out to the senders (each takes the next one).
struct Exports {
    next: std::sync::atomic::AtomicU64,
    records: u64,
    batch: u64,
}

impl Exports {
    fn take(&self) -> Option<Vec<u8>> {
        let first = self.next.fetch_add(self.batch, std::sync::atomic::Ordering::Relaxed);
        (first < self.records).then(|| export(first, self.batch.min(self.records - first)))
    }
}

/// One HTTP/1.1 connection posting Exports until none is left, each answered before the next.
async fn http_sender(address: SocketAddr, exports: Arc<Exports>) -> Result<(), RunError> {
    let mut stream = tokio::net::TcpStream::connect(address).await.map_err(failed)?;
    stream.set_nodelay(true).map_err(failed)?;
    let mut answer = Vec::with_capacity(4096);
    while let Some(body) = exports.take() {
        let head = format!(
            "POST /v1/logs HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.map_err(failed)?;
        stream.write_all(&body).await.map_err(failed)?;
        // The answer: its head, then its content-length's bytes.
        answer.clear();
        let head_end = loop {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.map_err(failed)?;
            if n == 0 {
                return Err(failed("the agent closed the connection"));
            }
            answer.extend_from_slice(&chunk[..n]);
            if let Some(at) = answer.windows(4).position(|window| window == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
        if !head.starts_with("http/1.1 200") {
            return Err(failed(format!("otlp/http answered {}", head.lines().next().unwrap_or(""))));
        }
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while answer.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.map_err(failed)?;
            if n == 0 {
                return Err(failed("the agent closed the connection mid-answer"));
            }
            answer.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(())
}

/// One HTTP/2 connection calling `LogsService/Export` until none is left, each answered first.
async fn grpc_sender(address: SocketAddr, exports: Arc<Exports>) -> Result<(), RunError> {
    let stream = tokio::net::TcpStream::connect(address).await.map_err(failed)?;
    // As gRPC clients do: no Nagle wait between a request's frames.
    stream.set_nodelay(true).map_err(failed)?;
    let (client, connection) = h2::client::handshake(stream).await.map_err(failed)?;
    tokio::spawn(connection);
    let mut client = client.ready().await.map_err(failed)?;
    while let Some(message) = exports.take() {
        let request =
            http::Request::post(format!("http://{address}/opentelemetry.proto.collector.logs.v1.LogsService/Export"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .map_err(failed)?;
        let (response, mut send) = client.send_request(request, false).map_err(failed)?;
        let mut framed = Vec::with_capacity(message.len() + 5);
        framed.push(0);
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        send.reserve_capacity(framed.len());
        send.send_data(Bytes::from(framed), true).map_err(failed)?;
        let response = response.await.map_err(failed)?;
        let mut body = response.into_body();
        while let Some(data) = body.data().await {
            let data = data.map_err(failed)?;
            let _ = body.flow_control().release_capacity(data.len());
        }
        let status =
            body.trailers().await.map_err(failed)?.and_then(|trailers| {
                trailers.get("grpc-status").and_then(|value| value.to_str().ok().map(str::to_string))
            });
        if status.as_deref() != Some("0") {
            return Err(failed(format!("otlp/grpc answered grpc-status {status:?}")));
        }
        client = client.ready().await.map_err(failed)?;
    }
    Ok(())
}

/// `SENDERS` senders of `kind` over `records` records in Exports of `batch`.
async fn otlp_load(grpc: bool, address: SocketAddr, records: u64, batch: u64) -> Result<(), RunError> {
    let exports = Arc::new(Exports { next: std::sync::atomic::AtomicU64::new(0), records, batch });
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let exports = exports.clone();
            tokio::spawn(async move {
                if grpc { grpc_sender(address, exports).await } else { http_sender(address, exports).await }
            })
        })
        .collect();
    for sender in senders {
        sender.await.map_err(failed)??;
    }
    Ok(())
}

/// Measures the four phases on one agent.
pub async fn measure(services: &Services, settings: &Settings) -> Result<Vec<Phase>, RunError> {
    let mut config = super::agent_config(
        TestConfig::empty("sluice-bench."),
        &services.kafka,
        &format!("bench-otlp-{}", now() as u64),
    );
    let address = SocketAddr::from(([127, 0, 0, 1], crate::free_port()));
    let socket = config.dir.path().join("otlp.sock").display().to_string();
    config
        .listener("otlp", "protocol", "otlp")
        .listener("otlp", "socket", socket)
        .listener("otlp", "addresses", toml::Value::Array(vec![address.to_string().into()]))
        .set("ingest", "ack_point", "delivered");
    let multiline_socket = config.dir.path().join("multiline.sock").display().to_string();
    let mut multiline = toml::Table::new();
    multiline.insert("preset".into(), "java".into());
    config.listener("multiline", "socket", multiline_socket.clone()).listener(
        "multiline",
        "multiline",
        toml::Value::Table(multiline),
    );
    let mut agent = crate::start_agent(&config).await;
    let (pid, admin) = (agent.pid(), agent.admin());
    let records = settings.records;
    let mut phases = Vec::new();
    let lines = |socket: std::path::PathBuf| async move {
        let load = Load { socket, connections: 1, amount: Amount::Records(records), rate: 0, writes: Writes::Buffered };
        let make: Records = Arc::new(|_, index| {
            let mut line = format!("{{\"level\":\"info\",\"message\":\"{}\",\"n\":{index}", body(index));
            line.push_str("}\n");
            line.into_bytes()
        });
        tokio::task::spawn_blocking(move || load.run(make)).await.map_err(failed)?.map_err(failed)?;
        Ok(())
    };
    phases.push(phase("lines", pid, admin, records, lines(config.socket())).await?);
    phases.push(phase("lines+multiline", pid, admin, records, lines(multiline_socket.into())).await?);
    phases.push(phase("otlp/http", pid, admin, records, otlp_load(false, address, records, settings.batch)).await?);
    phases.push(phase("otlp/grpc", pid, admin, records, otlp_load(true, address, records, settings.batch)).await?);
    agent.stop(Duration::from_secs(30)).await;
    if let Ok(binary) = std::env::var("SLUICE_BENCH_OTELCOL") {
        phases.push(otelcol_phase(&binary, services, settings).await?);
    }
    Ok(phases)
}

/// Messages in `topic` now (high minus low watermark, every partition).
fn messages_in(brokers: &str, topic: &str) -> u64 {
    use rdkafka::consumer::Consumer as _;
    let Ok(consumer) =
        rdkafka::ClientConfig::new().set("bootstrap.servers", brokers).create::<rdkafka::consumer::BaseConsumer>()
    else {
        return 0;
    };
    let Ok(metadata) = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) else { return 0 };
    metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions())
        .filter_map(|partition| consumer.fetch_watermarks(topic, partition.id(), Duration::from_secs(10)).ok())
        .map(|(low, high)| u64::try_from(high - low).unwrap_or(0))
        .sum()
}

/// The OpenTelemetry Collector at `binary` under the OTLP/gRPC load: records/s until its topic
/// holds every record, and its CPU.
async fn otelcol_phase(binary: &str, services: &Services, settings: &Settings) -> Result<Phase, RunError> {
    let dir = tempfile::tempdir().map_err(failed)?;
    let topic = format!("bench-otelcol-{}", now() as u64);
    let address = SocketAddr::from(([127, 0, 0, 1], crate::free_port()));
    let config = format!(
        r#"receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {address}
processors:
  batch: {{}}
exporters:
  kafka:
    brokers: ["{brokers}"]
    logs:
      topic: {topic}
      encoding: raw
    producer:
      required_acks: -1
      compression: zstd
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    logs:
      receivers: [otlp]
      processors: [batch]
      exporters: [kafka]
"#,
        brokers = services.kafka
    );
    let path = dir.path().join("otelcol.yaml");
    std::fs::write(&path, config).map_err(failed)?;
    let mut command = std::process::Command::new(binary);
    command.arg("--config").arg(&path);
    let mut collector = crate::Process::start("otelcol", command, dir.path());
    let deadline = now() + 60.0;
    while tokio::net::TcpStream::connect(address).await.is_err() {
        if now() > deadline || !collector.running() {
            return Err(failed(format!("the Collector did not listen on {address}: {}", collector.log_tail(20))));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = collector.pid();
    let records = settings.records;
    let (ticks, started) = (cpu_ticks(pid), now());
    otlp_load(true, address, records, settings.batch).await?;
    let deadline = now() + 300.0;
    loop {
        let (brokers, name) = (services.kafka.clone(), topic.clone());
        let stored = tokio::task::spawn_blocking(move || messages_in(&brokers, &name)).await.map_err(failed)?;
        if stored >= records {
            break;
        }
        if now() > deadline {
            return Err(failed(format!("the Collector stored {stored} of {records} records within 300 s")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seconds = now() - started;
    let phase = Phase { protocol: "otelcol otlp/grpc → kafka", records, seconds, cpu_ticks: cpu_ticks(pid) - ticks };
    collector.stop(Duration::from_secs(30)).await;
    Ok(phase)
}

/// Runs the table against the stack's broker at `services`, printing it.
pub async fn run(settings: &Settings, services: &Services) -> Result<(), RunError> {
    say(&format!(
        "# OTLP beside lines: one agent (release, memory buffer, ack_point delivered, Kafka at {}), {} records per phase, \
         ~256 B each; OTLP in Exports of {} records, {SENDERS} in flight",
        services.kafka, settings.records, settings.batch
    ));
    if std::env::var_os("SLUICE_BENCH_OTELCOL").is_none() {
        say(
            "# (the OpenTelemetry Collector is not measured: SLUICE_BENCH_OTELCOL is not set; scripts/bench-otlp builds it)",
        );
    }
    say("| protocol | records/s | agent CPU µs/record | seconds | CPU ticks |");
    say("| --- | --- | --- | --- | --- |");
    for phase in measure(services, settings).await? {
        say(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {} |",
            phase.protocol,
            phase.rate(),
            phase.cpu_micros_per_record(),
            phase.seconds,
            phase.cpu_ticks
        ));
    }
    Ok(())
}
