//! Every ingest protocol end to end into PostgreSQL, written by the clients apps really use:
//! raw socket writes for lines, octet counting and datagrams, `logger` and Python's
//! `SysLogHandler` for syslog, Python's `fluent-logger` for Forward.

use rmpv::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;
use sluice::telemetry;

async fn strings(db: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    db.query(sql, &[])
        .await
        .expect("query")
        .iter()
        .map(|row| row.get::<_, Option<String>>(0).unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_octet_counted_and_datagram_listeners_run_side_by_side() {
    let mut sockets = Vec::new();
    let pipeline = Scenario::new("protocols")
        .with(|config| {
            sockets.push(config.add_listener("octets", "octet_counted"));
            sockets.push(config.add_listener("dgram", "datagram"));
        })
        .pipeline()
        .await;
    let (config, db) = (&pipeline.config, &pipeline.db);

    send_lines(&config.socket(), &[b"a line".to_vec()]).await;
    let mut octets = tokio::net::UnixStream::connect(&sockets[0]).await.expect("connect");
    let trace = "Error: boom\n    at handler (app.js:10)\n    at main (app.js:3)";
    octets.write_all(format!("{} {trace}5 short", trace.len()).as_bytes()).await.expect("write");
    octets.shutdown().await.expect("close");
    let datagram = std::os::unix::net::UnixDatagram::unbound().expect("socket");
    datagram.send_to(br#"{"level":"warn","message":"one datagram"}"#, &sockets[1]).expect("send");
    datagram.send_to(b"with a newline\n", &sockets[1]).expect("send");

    until_rows(db, 5).await;
    let mut payloads = strings(db, "SELECT coalesce(record::text, message) FROM logs").await;
    payloads.sort();
    let mut expected = vec![
        "a line".to_string(),
        trace.to_string(),
        "short".into(),
        r#"{"level":"warn","message":"one datagram"}"#.into(),
        "with a newline".into(),
    ];
    expected.sort();
    assert_eq!(payloads, expected, "a stack trace survives as one record");
    assert_eq!(strings(db, "SELECT level FROM logs WHERE message = 'one datagram'").await, ["warn"]);
    let peers = strings(
        db,
        "SELECT coalesce(peer_uid::text, 'none') FROM logs WHERE coalesce(record::text, message) = 'with a newline'",
    )
    .await;
    assert_eq!(peers, ["none"], "datagrams carry no peer credentials");

    let metrics = scrape(config.agent_admin()).await;
    let records = |listener, protocol| {
        metrics.count(telemetry::INGEST_RECORDS, &[("listener", listener), ("protocol", protocol)])
    };
    assert_eq!(records("default", "lines"), 1.0);
    assert_eq!(records("octets", "octet_counted"), 2.0);
    assert_eq!(records("dgram", "datagram"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logger_and_python_syslog_handler_are_parsed_into_fields() {
    let mut sockets = Vec::new();
    let pipeline = Scenario::new("syslog")
        .with(|config| {
            sockets.push(config.add_listener("syslog", "syslog"));
            let stream = config.add_listener("syslog_stream", "syslog");
            config.listener("syslog_stream", "transport", "stream");
            sockets.push(stream);
        })
        .pipeline()
        .await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    let (datagram, stream) = (&sockets[0], &sockets[1]);

    logger(datagram, &["-t", "checkout", "-p", "local4.warning"], "paid order 17");
    logger(
        datagram,
        &["--rfc5424", "-t", "billing", "--msgid", "ID47", "--sd-id", "origin@1", "--sd-param", "ip=\"10.0.0.1\""],
        "invoice sent",
    );
    python_syslog_handler(datagram, "python says boom");
    logger(stream, &["-T", "-t", "streamer", "-p", "user.info"], "over a stream, newline framed");
    logger(stream, &["-T", "--octet-count", "-t", "counter", "-p", "user.debug"], "over a stream, octet counted");

    until_rows(db, 5).await;
    let row = |sql: &'static str| strings(db, sql);
    assert_eq!(
        row("SELECT concat_ws(' ', level, record->>'facility', record->>'app_name', message) FROM logs \
             WHERE message = 'paid order 17'")
        .await,
        ["warning local4 checkout paid order 17"]
    );
    assert_eq!(
        row("SELECT concat_ws(' ', record->>'syslog', record->>'msgid', \
             record->'structured_data'->'origin@1'->>'ip') FROM logs WHERE message = 'invoice sent'")
        .await,
        ["rfc5424 ID47 10.0.0.1"]
    );
    assert_eq!(row("SELECT level FROM logs WHERE message = 'python says boom'").await, ["error"]);
    assert_eq!(
        row("SELECT concat_ws(' ', level, record->>'app_name') FROM logs WHERE message LIKE 'over a stream%' \
             ORDER BY message")
        .await,
        ["info streamer", "debug counter"]
    );
    let timed = row("SELECT count(*)::text FROM logs WHERE event_time IS NOT NULL").await;
    assert_eq!(timed, ["4"], "logger's timestamps become event_time (Python's handler sends none)");

    let metrics = scrape(config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS, &[("listener", "syslog")]), 3.0);
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS, &[("listener", "syslog_stream")]), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_fluent_logger_delivers_and_hears_every_chunk_acknowledged() {
    let mut socket = None;
    let pipeline =
        Scenario::new("fluent").with(|config| socket = Some(config.add_listener("fluent", "forward"))).pipeline().await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    let socket = socket.expect("socket");

    // fluent-logger fails unless each emit's chunk is acknowledged: acks arrive only once the
    // record is delivered to Kafka (memory buffer: ack_point = "delivered").
    fluent_logger(&socket, 50);

    until_rows(db, 50).await;
    let rows = db
        .query(
            "SELECT record->>'tag', level, message, (record->>'n')::int, event_time IS NOT NULL FROM logs \
             ORDER BY (record->>'n')::int",
            &[],
        )
        .await
        .expect("rows");
    assert_eq!(rows.len(), 50);
    for (n, row) in rows.iter().enumerate() {
        assert_eq!(row.get::<_, String>(0), "app.web");
        assert_eq!(row.get::<_, String>(1), "info");
        assert_eq!(row.get::<_, String>(2), format!("fluent {n}"));
        assert_eq!(row.get::<_, i32>(3), n as i32);
        assert!(row.get::<_, bool>(4), "the event time is kept");
    }
    let metrics = scrape(config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS, &[("protocol", "forward")]), 50.0);
}

fn pack(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("encode");
    out
}

fn event(n: i64) -> Value {
    Value::Array(vec![Value::from(1_764_482_100 + n), Value::Map(vec![(Value::from("n"), Value::from(n))])])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_packed_and_compressed_modes_deliver_every_event_and_ack_their_chunks() {
    let mut socket = None;
    let pipeline = Scenario::new("forward")
        .with(|config| socket = Some(config.add_listener("fluent", "forward")))
        .pipeline()
        .await;
    let db = &pipeline.db;
    let mut stream = tokio::net::UnixStream::connect(socket.expect("socket")).await.expect("connect");

    let option = |chunk: &str, compressed: bool| {
        let mut fields = vec![(Value::from("chunk"), Value::from(chunk))];
        if compressed {
            fields.push((Value::from("compressed"), Value::from("gzip")));
        }
        Value::Map(fields)
    };
    let forward = Value::Array(vec![Value::from("f"), Value::Array((0..10).map(event).collect()), option("c1", false)]);
    let packed_entries: Vec<u8> = (10..20).flat_map(|n| pack(&event(n))).collect();
    let packed = Value::Array(vec![Value::from("p"), Value::Binary(packed_entries), option("c2", false)]);
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gzip, &(20..30).flat_map(|n| pack(&event(n))).collect::<Vec<u8>>()).expect("gzip");
    let compressed =
        Value::Array(vec![Value::from("c"), Value::Binary(gzip.finish().expect("gzip")), option("c3", true)]);
    for message in [forward, packed, compressed] {
        stream.write_all(&pack(&message)).await.expect("write");
    }

    let mut replies = Vec::new();
    let mut buf = [0u8; 256];
    while replies.len() < 3 {
        let n = within(WAIT, "chunk acks", stream.read(&mut buf)).await.expect("read");
        assert!(n > 0, "the agent closed the connection");
        let mut data: &[u8] = &buf[..n];
        while !data.is_empty() {
            replies.push(rmpv::decode::read_value(&mut data).expect("an ack is msgpack"));
        }
    }
    let ack = |chunk: &str| Value::Map(vec![(Value::from("ack"), Value::from(chunk))]);
    assert_eq!(replies, vec![ack("c1"), ack("c2"), ack("c3")], "acknowledged in order, once delivered");
    until_rows(db, 30).await;
    let tags = strings(db, "SELECT (record->>'tag') || count(*) FROM logs GROUP BY record->>'tag' ORDER BY 1").await;
    assert_eq!(tags, ["c10", "f10", "p10"]);
    until_nothing_left(&pipeline.config).await;
    assert_eq!(row_count(db).await, 30, "each event once");
}
