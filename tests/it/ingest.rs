//! What the agent does with bad input on the socket.

use crate::support::*;
use sluice::telemetry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_overlong_invalid_utf8_and_empty_lines_with_reasons_and_keeps_the_connection() {
    let pipeline = Scenario::new("reject").listener("default", "max_record_size", "1 KiB").pipeline().await;
    let (config, db) = (&pipeline.config, &pipeline.db);

    let lines = vec![
        b"before the bad ones".to_vec(),
        vec![b'x'; 5000],
        b"invalid \xff\xfe utf-8".to_vec(),
        b"".to_vec(),
        b"after the bad ones".to_vec(),
        vec![b'y'; 1024],
    ];
    send_lines(&config.socket(), &lines).await;
    until_rows(db, 3).await;

    let payloads: Vec<String> =
        column(db, "SELECT coalesce(record::text, message) FROM logs ORDER BY kafka_offset").await;
    assert_eq!(payloads, vec!["before the bad ones".to_string(), "after the bad ones".into(), "y".repeat(1024)]);

    let metrics = scrape(config.agent_admin()).await;
    let rejected = |reason| metrics.count(telemetry::INGEST_REJECTED, &[("reason", reason)]);
    assert_eq!(rejected("too_large"), 1.0);
    assert_eq!(rejected("invalid_utf8"), 1.0);
    assert_eq!(rejected("empty"), 1.0);
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS, &[]), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_writer_without_newline_does_not_stop_other_connections() {
    let pipeline = Scenario::new("slow").listener("default", "max_record_size", "1 KiB").pipeline().await;
    let (config, db) = (&pipeline.config, &pipeline.db);

    // One connection dribbles bytes and never ends its record...
    let mut slow = tokio::net::UnixStream::connect(config.socket()).await.expect("connect");
    use tokio::io::AsyncWriteExt;
    for _ in 0..20 {
        slow.write_all(&[b'z'; 100]).await.expect("write");
    }
    // ...while another one is served normally.
    send_lines(&config.socket(), &[b"quick".to_vec()]).await;
    until_rows(db, 1).await;
    // The slow one's 2000 bytes exceeded the limit: rejected once its newline comes.
    slow.write_all(b"\n").await.expect("write");
    slow.shutdown().await.expect("close");
    until_metric(config.agent_admin(), telemetry::INGEST_REJECTED, &[("reason", "too_large")], 1.0).await;
}

/// Issue 12, item 2: every message is sized to fit the buffer and librdkafka; a text line whose
/// JSON-escaped form would outgrow that bound (control characters escape to six bytes) is refused
/// as `too_large` instead of waiting forever for room (the JSON envelope; the binary one carries
/// a line as it is: next test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_line_whose_escaped_message_outgrows_the_bound_is_refused_too_large() {
    let pipeline = Scenario::new("escaped")
        .listener("default", "max_record_size", "1 KiB")
        .set("ship", "envelope", "json")
        .pipeline()
        .await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    let quotes = vec![b'"'; 1024]; // escapes to 2 KiB: within the bound
    send_lines(&config.socket(), &[vec![0x01; 1024], quotes.clone(), b"after".to_vec()]).await;
    until_rows(db, 2).await;
    let payloads: Vec<String> =
        column(db, "SELECT coalesce(record::text, message) FROM logs ORDER BY kafka_offset").await;
    assert_eq!(payloads, vec![String::from_utf8(quotes).expect("utf-8"), "after".to_string()]);
    let metrics = scrape(config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::INGEST_REJECTED, &[("reason", "too_large")]), 1.0);
}

/// The binary envelope escapes nothing: a line of control characters at the record limit is
/// carried as it is, and stored as it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_line_of_control_characters_at_the_limit_is_carried_as_it_is_in_the_binary_envelope() {
    let pipeline = Scenario::new("unescaped").listener("default", "max_record_size", "1 KiB").pipeline().await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    let controls = vec![0x01; 1024];
    send_lines(&config.socket(), &[controls.clone(), b"after".to_vec()]).await;
    until_rows(db, 2).await;
    let payloads: Vec<String> =
        column(db, "SELECT coalesce(record::text, message) FROM logs ORDER BY kafka_offset").await;
    assert_eq!(payloads, vec![String::from_utf8(controls).expect("utf-8"), "after".to_string()]);
    let metrics = scrape(config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::INGEST_REJECTED, &[("reason", "too_large")]), 0.0);
}
