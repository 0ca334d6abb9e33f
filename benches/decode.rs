//! Decode throughput per ingest protocol for 256-byte records: the CPU an agent spends between
//! the socket's bytes and a checked record ready for its envelope (framing, the content checks,
//! and the protocol's transformation: syslog fields, Forward's msgpack → JSON). Plus the
//! envelope itself, which every protocol pays once per record after this.
//!
//! `cargo bench --bench decode` (figures: records/s on one core; `docs/PERFORMANCE.md`).

use std::hint::black_box;

use bytes::BytesMut;
use chrono::Utc;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rmpv::Value;
use sluice::envelope::{EnvelopeKind, EnvelopeWriter, Peer, PeerFragment, PodMetadata};
use sluice::ingest::forward::{self, ForwardFramer, Limits};
use sluice::ingest::framing::{Frame, LineFramer, OctetFramer};
use sluice::ingest::redact::Redactor;
use sluice::ingest::{record, syslog};
use tokio_util::codec::Decoder;

const RECORDS: usize = 1000;
const SIZE: usize = 256;
const MAX_RECORD: usize = 1 << 20;
const MAX_DEPTH: usize = 64;
/// The socket reads up to this much at a time.
const READ: usize = 64 * 1024;

/// A JSON log record of exactly `SIZE` bytes, numbered `n`.
fn json_record(n: usize) -> String {
    let head = format!(r#"{{"ts":"2026-11-30T06:00:00.{n:06}Z","level":"info","logger":"checkout","n":{n},"msg":""#);
    let pad = SIZE - head.len() - 2;
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// An RFC 5424 message of exactly `SIZE` bytes.
fn syslog_message(n: usize) -> String {
    let head =
        format!("<165>1 2026-11-30T06:00:00.{n:06}Z web-1 checkout 4242 ID47 [origin ip=\"10.0.0.1\"] order {n} ");
    format!("{head}{}", "x".repeat(SIZE - head.len()))
}

/// A Forward event record whose msgpack encoding is about `SIZE` bytes.
fn forward_record(n: usize) -> Value {
    Value::Map(vec![
        ("level".into(), "info".into()),
        ("logger".into(), "checkout".into()),
        ("n".into(), Value::from(n as u64)),
        ("msg".into(), "x".repeat(SIZE - 50).into()),
    ])
}

fn msgpack(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("writing to a Vec");
    out
}

/// Feeds `wire` to `framer` in socket-sized reads and hands every record to `each`.
fn frame_all<D: Decoder<Item = Frame, Error = std::io::Error>>(
    mut framer: D,
    wire: &[u8],
    mut each: impl FnMut(&[u8]),
) {
    let mut buf = BytesMut::with_capacity(READ * 2);
    for read in wire.chunks(READ) {
        buf.extend_from_slice(read);
        while let Some(frame) = framer.decode(&mut buf).expect("framing") {
            if let Frame::Record(record) = frame {
                each(&record);
            }
        }
    }
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_256B");
    group.throughput(Throughput::Elements(RECORDS as u64));

    let lines: Vec<u8> = (0..RECORDS).flat_map(|n| format!("{}\n", json_record(n)).into_bytes()).collect();
    group.bench_function("lines", |b| {
        b.iter(|| {
            frame_all(LineFramer::new(MAX_RECORD), &lines, |r| {
                black_box(record::validate(r, MAX_DEPTH).ok());
            })
        })
    });

    let octets: Vec<u8> = (0..RECORDS).flat_map(|n| format!("{SIZE} {}", json_record(n)).into_bytes()).collect();
    group.bench_function("octet_counted", |b| {
        b.iter(|| {
            frame_all(OctetFramer::new(MAX_RECORD), &octets, |r| {
                black_box(record::validate(r, MAX_DEPTH).ok());
            })
        })
    });

    let datagrams: Vec<Vec<u8>> = (0..RECORDS).map(|n| json_record(n).into_bytes()).collect();
    group.bench_function("datagram", |b| {
        b.iter(|| {
            for datagram in &datagrams {
                black_box(record::validate(datagram, MAX_DEPTH).ok());
            }
        })
    });

    let messages: Vec<Vec<u8>> = (0..RECORDS).map(|n| syslog_message(n).into_bytes()).collect();
    group.bench_function("syslog_rfc5424", |b| {
        let mut json = Vec::new();
        b.iter(|| {
            for message in &messages {
                if let Ok(text) = record::validate(syslog::trim_trailer(message), MAX_DEPTH) {
                    syslog::to_record(text, &mut json);
                    black_box(&json);
                }
            }
        })
    });

    let limits = Limits { max_record_size: MAX_RECORD, max_json_depth: MAX_DEPTH };
    let time = Value::from(1_764_482_400u64);
    let message_mode: Vec<u8> = (0..RECORDS)
        .flat_map(|n| msgpack(&Value::Array(vec!["app.web".into(), time.clone(), forward_record(n)])))
        .collect();
    let forward_decode = |wire: &[u8]| {
        frame_all(ForwardFramer::new(MAX_RECORD, MAX_DEPTH), wire, |message| {
            // One event at a time, as the agent takes them.
            for json in forward::events(message, limits).expect("a valid message").flatten() {
                black_box(record::validate(&json, MAX_DEPTH).ok());
            }
        })
    };
    group.bench_function("forward_message_mode", |b| b.iter(|| forward_decode(&message_mode)));

    let entries: Vec<Value> = (0..RECORDS).map(|n| Value::Array(vec![time.clone(), forward_record(n)])).collect();
    let forward_mode = msgpack(&Value::Array(vec!["app.web".into(), Value::Array(entries.clone())]));
    group.bench_function("forward_forward_mode", |b| b.iter(|| forward_decode(&forward_mode)));

    let packed: Vec<u8> = entries.iter().flat_map(msgpack).collect();
    let packed_forward = msgpack(&Value::Array(vec!["app.web".into(), Value::Binary(packed)]));
    group.bench_function("forward_packed_forward", |b| b.iter(|| forward_decode(&packed_forward)));

    let pod = PodMetadata {
        name: Some("web-1".into()),
        namespace: Some("shop".into()),
        container: Some("app".into()),
        node: Some("n1".into()),
        info: Default::default(),
    };
    let peer = PeerFragment::new(Some(Peer { pid: Some(42), uid: 1000, gid: 1000 }));
    let records: Vec<String> = (0..RECORDS).map(json_record).collect();
    for (name, kind) in [("envelope_binary", EnvelopeKind::Binary), ("envelope_json", EnvelopeKind::Json)] {
        group.bench_function(name, |b| {
            let writer = EnvelopeWriter::new(&pod, kind);
            let mut out = BytesMut::new();
            b.iter(|| {
                let now = Utc::now();
                for line in &records {
                    out.clear();
                    writer.write(line, &peer, now, &mut out);
                    black_box(&out);
                }
            })
        });
    }
    group.finish();
}

/// Masking (`redact`) per record, beside the envelope: five rules (two fields, e-mail, card
/// numbers, a regex), on records none matches (the common case: one `RegexSet` pass), on JSON
/// records with a field and an e-mail to mask, and on text records with an e-mail. Rules off
/// cost nothing: the sink does not call it.
fn redact(c: &mut Criterion) {
    let mut group = c.benchmark_group("redact");
    group.throughput(Throughput::Elements(RECORDS as u64));
    let config: sluice::config::RedactConfig = toml::from_str(
        r#"rules = [
            { name = "password", field = "password" },
            { name = "token", field = "token" },
            { name = "email", preset = "email" },
            { name = "card", preset = "credit_card" },
            { name = "api_key", regex = "sk_live_[0-9a-zA-Z]{24}" },
        ]"#,
    )
    .expect("rules");
    let redactor = Redactor::new(&config, "bench").expect("compiles");
    let clean: Vec<String> = (0..RECORDS).map(json_record).collect();
    let secret: Vec<String> = (0..RECORDS)
        .map(|n| {
            let record = json_record(n);
            let tail = r#","password":"hunter2","user":"ann@example.com"}"#;
            // The same 256 bytes: the message shorter by what the two fields take.
            format!("{}\"{tail}", &record[..record.len() - 1 - tail.len()])
        })
        .collect();
    let text: Vec<String> =
        (0..RECORDS).map(|n| format!("{n:06} login from ann@example.com {}", "x".repeat(SIZE - 40))).collect();
    let mut out = String::new();
    for (records, masks) in [(&clean, false), (&secret, true), (&text, true)] {
        assert!(records.iter().all(|r| redactor.apply(r, &mut out, MAX_RECORD) == Ok(masks)), "{}", records[0]);
    }
    assert!(serde_json::from_str::<serde_json::Value>(&secret[0]).is_ok() && secret[0].len() == SIZE, "{}", secret[0]);
    for (name, records) in [("no_match", &clean), ("json_field_and_email", &secret), ("text_email", &text)] {
        group.bench_function(name, |b| {
            let mut out = String::new();
            b.iter(|| {
                for record in records {
                    black_box(redactor.apply(record, &mut out, MAX_RECORD).expect("within"));
                }
            })
        });
    }
    group.finish();
}

/// Routing per record (`kafka.topic` as a template over a record field, and a key template
/// beside it): what a templated topic adds to each record, beside a plain topic (one `Arc` clone).
fn templates(c: &mut Criterion) {
    let mut group = c.benchmark_group("templates");
    group.throughput(Throughput::Elements(RECORDS as u64));
    let pod = PodMetadata { name: Some("web-1".into()), namespace: Some("shop".into()), ..PodMetadata::default() };
    let records: Vec<String> = (0..RECORDS)
        .map(|n| {
            let record = json_record(n);
            format!(r#"{{"service":"svc{}",{}"#, n % 8, &record[1..record.len() - 16])
        })
        .map(|record| format!("{record}\"}}"))
        .collect();
    assert!(serde_json::from_str::<serde_json::Value>(&records[0]).is_ok(), "{}", records[0]);
    for (name, topic) in [("topic_plain", "logs"), ("topic_record_field", "logs.{record.service}")] {
        let kafka = sluice::config::KafkaConfig {
            topic: topic.into(),
            default_topic: topic.contains('{').then(|| "logs.other".to_string()),
            ..sluice::config::KafkaConfig::default()
        };
        let route = sluice::topic::Route::new(&kafka, &pod);
        group.bench_function(name, |b| {
            let mut scratch = String::new();
            b.iter(|| {
                for record in &records {
                    black_box(route.route(record, &mut scratch));
                }
            })
        });
    }
    let key = sluice::template::Template::parse("{pod.namespace}/{record.service}").expect("template");
    group.bench_function("key_record_field", |b| {
        let mut out = String::new();
        b.iter(|| {
            for record in &records {
                black_box(key.render(&pod, record, &mut out));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, decode, redact, templates);
criterion_main!(benches);
