//! What a record carries to Kafka besides its envelope, read back from the real broker: a key
//! rendered from a template over the pod and the record, static headers, and the record's
//! metadata as headers (the same values its envelope holds).

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_template_and_headers_reach_kafka_with_each_record() {
    let mut headers = toml::Table::new();
    headers.insert("team".into(), "payments".into());
    let pipeline = Scenario::new("routing")
        .set("ship", "key", "template")
        .set("ship", "key_template", "{pod.namespace}/{record.user}")
        .set("ship", "headers", toml::Value::Table(headers))
        .set("ship", "metadata_headers", true)
        .with(|config| {
            config.env.push(("POD_NAME".into(), "web-1".into()));
            config.env.push(("POD_NAMESPACE".into(), "shop".into()));
        })
        .pipeline()
        .await;
    let (config, db) = (&pipeline.config, &pipeline.db);
    send_lines(
        &config.socket(),
        &[
            br#"{"user":"ann","n":1}"#.to_vec(),
            br#"{"n":2}"#.to_vec(),
            b"plain text".to_vec(),
            br#"{"user":7}"#.to_vec(),
        ],
    )
    .await;
    until_rows(db, 4).await;

    let topic = read_topic(&services().kafka, &pipeline.topic).await;
    assert_eq!(topic.messages, 4);
    let by_payload = |payload: &str| topic.payloads.iter().position(|p| p == payload).expect(payload);
    let ann = by_payload(r#"{"user":"ann","n":1}"#);
    assert_eq!(topic.keys[ann].as_deref(), Some("shop/ann"));
    assert_eq!(topic.keys[by_payload(r#"{"user":7}"#)].as_deref(), Some("shop/7"), "a number's JSON text");
    assert_eq!(topic.keys[by_payload(r#"{"n":2}"#)], None, "no user: no key");
    assert_eq!(topic.keys[by_payload("plain text")], None, "a text record has no fields");
    for (index, headers) in topic.headers.iter().enumerate() {
        let header = |name: &str| headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str());
        assert_eq!(header("team"), Some("payments"));
        assert_eq!(header("sluice.id"), Some(topic.ids[index].as_str()), "the envelope's id");
        assert_eq!(header("sluice.pod.name"), Some("web-1"));
        assert_eq!(header("sluice.pod.namespace"), Some("shop"));
        assert_eq!(header("sluice.pod.node"), None, "no NODE_NAME, no header");
        let time = header("sluice.ingest_time").expect("ingest time");
        chrono::DateTime::parse_from_rfc3339(time).expect("RFC 3339");
    }
    // The persister stores them as ever.
    assert_eq!(row_count(db).await, 4);
}
