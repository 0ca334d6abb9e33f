//! Masking before anything leaves the pod (`[ingest.redact]`, a listener's own `redact`): what
//! Kafka and PostgreSQL hold of records with secrets in fields and in text, read back from the
//! real broker and database — and the Kafka key, rendered from a masked field, masked too.

use crate::support::*;
use sluice::telemetry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_masked_before_kafka_and_counted_per_rule() {
    let mut syslog_socket = None;
    let pipeline = Scenario::new("redact")
        .set("ship", "key", "template")
        .set("ship", "key_template", "{record.email}")
        .with(|config| {
            let rules: toml::Value = toml::from_str::<toml::Table>(
                r#"
                mask = "***"
                rules = [
                    { name = "password", field = "password" },
                    { name = "email", preset = "email" },
                    { name = "credit_card", preset = "credit_card" },
                    { name = "bearer", preset = "bearer_token" },
                ]
                "#,
            )
            .expect("rules")
            .into();
            config.set("ingest", "redact", rules);
            // A syslog listener with its own rules: only the API key pattern.
            syslog_socket = Some(config.add_listener("syslog", "syslog"));
            config.listener("syslog", "transport", "stream");
            let own: toml::Value =
                toml::from_str::<toml::Table>(r#"rules = [{ name = "api_key", regex = "sk_live_[0-9a-zA-Z]{8}" }]"#)
                    .expect("rules")
                    .into();
            config.listener("syslog", "redact", own);
        })
        .pipeline()
        .await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    send_lines(
        &config.socket(),
        &[
            br#"{"n":1,"user":"ann","password":"hunter2","email":"ann@example.com"}"#.to_vec(),
            br#"{"n":2,"msg":"paid 4111 1111 1111 1111 with Authorization: Bearer abc.def-123","Password":{"old":"x"}}"#.to_vec(),
            b"n=3 login ann@example.com ok, order 4111111111111112".to_vec(),
            br#"{"n":4,"msg":"nothing secret"}"#.to_vec(),
        ],
    )
    .await;
    send_lines(
        &syslog_socket.expect("syslog socket"),
        &[b"<13>app: key sk_live_abcd1234 for ann@example.com".to_vec()],
    )
    .await;
    until_rows(db, 5).await;

    let topic = read_topic(&services().kafka, &pipeline.topic).await;
    let everything = format!("{}{:?}", topic.payloads.join("\n"), topic.keys);
    for secret in ["hunter2", "4111 1111 1111 1111", "abc.def-123", "sk_live_abcd1234", "\"old\""] {
        assert!(!everything.contains(secret), "{secret} reached Kafka: {everything}");
    }
    let (syslog, lines): (Vec<&String>, Vec<&String>) = topic.payloads.iter().partition(|p| p.contains("for ann@"));
    assert_eq!(syslog.len(), 1, "the syslog listener's own rules do not mask e-mail: {everything}");
    assert!(lines.iter().all(|p| !p.contains("ann@example.com")), "{everything}");
    assert!(everything.contains("4111111111111112"), "not a card number (Luhn): kept");

    let rows: Vec<(String, Option<String>)> = pairs(
        db,
        "SELECT record->>'n', coalesce(record::text, message) FROM logs WHERE record->>'n' IS NOT NULL ORDER BY 1",
    )
    .await;
    assert_eq!(
        rows[0].1.as_deref(),
        Some(r#"{"n":1,"user":"ann","password":"***","email":"***"}"#),
        "every other byte as written"
    );
    assert_eq!(rows[1].1.as_deref(), Some(r#"{"n":2,"msg":"paid *** with Authorization: ***","Password":"***"}"#));
    assert_eq!(rows[2].1.as_deref(), Some(r#"{"n":4,"msg":"nothing secret"}"#));
    let text: String =
        db.query_one("SELECT message FROM logs WHERE message LIKE 'n=3%'", &[]).await.expect("text row").get(0);
    assert_eq!(text, "n=3 login *** ok, order 4111111111111112");
    assert_eq!(topic.keys.iter().flatten().collect::<Vec<_>>(), vec!["***"], "the key rendered from the masked field");

    let metrics = scrape(config.agent_admin()).await;
    let count = |listener: &str, rule: &str| {
        metrics.count(telemetry::INGEST_REDACTIONS, &[("listener", listener), ("rule", rule)])
    };
    assert_eq!(count("default", "password"), 2.0);
    assert_eq!(count("default", "email"), 2.0, "a field's value and a text match");
    assert_eq!(count("default", "credit_card"), 1.0);
    assert_eq!(count("default", "bearer"), 1.0);
    assert_eq!(count("syslog", "api_key"), 1.0);
}
