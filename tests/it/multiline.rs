//! Multiline on `lines` listeners against the real stack, with stack traces the runtimes really
//! print: a JVM exception with its cause (`java Trace.java`), a chained Python traceback
//! (`logging.exception`), a Go panic (`go run`, its stderr). Each trace lands as one row between
//! the lines before and after it; the last record of a burst is handed on after `flush_timeout`
//! while the connection stays open; a record over `max_lines` is split and counted.

use std::process::Command;

use tokio::io::AsyncWriteExt;

use crate::support::*;
use sluice::telemetry;

fn output(mut command: Command, what: &str, stderr: bool) -> Vec<u8> {
    let output = command.output().unwrap_or_else(|error| panic!("cannot run {what}: {error}"));
    if stderr { output.stderr } else { output.stdout }
}

/// A `lines` listener `name` with `preset`, flushing after 300 ms.
fn multiline_listener(config: &mut TestConfig, name: &str, preset: &str) -> std::path::PathBuf {
    let socket = config.add_listener(name, "lines");
    let mut multiline = toml::Table::new();
    multiline.insert("preset".into(), preset.into());
    multiline.insert("flush_timeout".into(), "300ms".into());
    config.listener(name, "multiline", toml::Value::Table(multiline));
    socket
}

async fn messages(db: &tokio_postgres::Client, like: &str) -> Vec<String> {
    db.query("SELECT message FROM logs WHERE message LIKE $1 ORDER BY event_time NULLS LAST, message", &[&like])
        .await
        .expect("rows")
        .iter()
        .map(|row| row.get::<_, String>(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stack_traces_from_java_python_and_go_each_land_as_one_record() {
    let mut sockets = Vec::new();
    let pipeline = Scenario::new("multiline")
        .with(|config| {
            for (name, preset) in [("java", "java"), ("python", "python"), ("go", "go")] {
                sockets.push(multiline_listener(config, name, preset));
            }
        })
        .pipeline()
        .await;
    let (config, db) = (&pipeline.config, &pipeline.db);

    let mut java = Command::new("java");
    java.arg(source_path("tests/multiline/Trace.java"));
    let java = output(java, "java Trace.java", false);
    let mut python = Command::new(crate::support::python());
    python.arg(source_path("tests/multiline/trace.py"));
    let python = output(python, "trace.py", false);
    let go_dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(source_path("tests/multiline/panic.go"), go_dir.path().join("panic.go")).expect("copy");
    let mut go = Command::new("go");
    go.args(["run", "panic.go"]).current_dir(go_dir.path());
    let go = output(go, "go run panic.go", true);
    assert!(
        String::from_utf8_lossy(&go).contains("goroutine 1 [running]"),
        "a real panic: {}",
        String::from_utf8_lossy(&go)
    );

    // Each program's output as it wrote it, over a connection that stays open: the last record
    // is handed on after flush_timeout, not when the connection ends.
    let mut open = Vec::new();
    for (socket, text) in sockets.iter().zip([&java, &python, &go]) {
        let mut stream = tokio::net::UnixStream::connect(socket).await.expect("connect");
        stream.write_all(text).await.expect("write");
        open.push(stream);
    }
    until_rows(db, 8).await;

    let java_rows = messages(db, "2026-12-06%java%").await;
    assert_eq!(java_rows.len(), 3, "{java_rows:#?}");
    assert!(
        java_rows[1]
            .starts_with("2026-12-06 12:00:01 ERROR java failed\njava.lang.IllegalStateException: request failed")
    );
    assert!(java_rows[1].contains("\nCaused by: java.io.IOException: connection reset\n"));
    assert!(java_rows[1].ends_with("more"), "{}", java_rows[1]);
    assert_eq!(java_rows[2], "2026-12-06 12:00:02 INFO java after");

    let python_rows = messages(db, "%:app:python%").await;
    assert_eq!(python_rows.len(), 3, "{python_rows:#?}");
    let failed = python_rows.iter().find(|row| row.starts_with("ERROR:app:python failed")).expect("the traceback");
    assert!(failed.contains("KeyError: 'missing'") && failed.contains("The above exception was the direct cause"));
    assert!(failed.ends_with("ValueError: bad request"), "{failed}");

    let go_text = String::from_utf8_lossy(&go).trim_end().to_string();
    let go_rows = messages(db, "%")
        .await
        .into_iter()
        .filter(|row| row.starts_with("go before") || row.starts_with("panic:"))
        .collect::<Vec<_>>();
    assert_eq!(go_rows.len(), 2, "{go_rows:#?}");
    let panic = go_rows.iter().find(|row| row.starts_with("panic:")).expect("the panic");
    assert_eq!(format!("go before\n{panic}"), go_text, "the panic and its goroutines, whole");
    assert_eq!(row_count(db).await, 8);

    let metrics = scrape(config.agent_admin()).await;
    assert!(metrics.count(telemetry::INGEST_LINES_JOINED, &[("listener", "java")]) >= 10.0);
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS, &[("listener", "java")]), 3.0);
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS_SPLIT, &[]), 0.0);
    drop(open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_past_max_lines_is_split_counted_and_nothing_is_lost() {
    let mut socket = None;
    let pipeline = Scenario::new("multiline_split")
        .with(|config| {
            let path = config.add_listener("app", "lines");
            let mut multiline = toml::Table::new();
            multiline.insert("start".into(), r"^\d{4}-".into());
            multiline.insert("max_lines".into(), 10.into());
            config.listener("app", "multiline", toml::Value::Table(multiline));
            socket = Some(path);
        })
        .pipeline()
        .await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    let mut text = String::from("2026-12-06 a record of 25 lines\n");
    for n in 1..25 {
        text.push_str(&format!("  continuation {n}\n"));
    }
    text.push_str("2026-12-06 the next record\n");
    let mut stream = tokio::net::UnixStream::connect(socket.expect("socket")).await.expect("connect");
    stream.write_all(text.as_bytes()).await.expect("write");
    stream.shutdown().await.expect("close");

    until_rows(db, 4).await;
    let rows = messages(db, "%").await;
    let lines: usize = rows.iter().map(|row| row.lines().count()).sum();
    assert_eq!(lines, 26, "every line stored once: {rows:#?}");
    assert_eq!(rows.iter().filter(|row| row.lines().count() == 10).count(), 2, "{rows:#?}");
    let metrics = scrape(config.agent_admin()).await;
    assert_eq!(metrics.count(telemetry::INGEST_RECORDS_SPLIT, &[("listener", "app"), ("reason", "max_lines")]), 2.0);
}
