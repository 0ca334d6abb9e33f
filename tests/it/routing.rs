//! Where a record goes and what it carries to Kafka besides its envelope, read back from the real
//! broker and PostgreSQL: a topic per record from a template (and the default topic for what it
//! cannot route, counted), the persister subscribed by pattern, a topic change by reload or
//! restart (records already accepted keep theirs), a key rendered from a template over the pod
//! and the record, static headers, and the record's metadata as headers.

use std::time::Duration;

use crate::support::*;
use sluice::telemetry;

/// Rows per `kafka_topic`, sorted.
async fn rows_per_topic(db: &tokio_postgres::Client) -> Vec<(String, i64)> {
    let rows =
        db.query("SELECT kafka_topic, count(*) FROM logs GROUP BY 1 ORDER BY 1", &[]).await.expect("rows per topic");
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// The topic of the row whose record's `n` is `n`.
async fn topic_of(db: &tokio_postgres::Client, n: i64) -> String {
    let sql = format!("SELECT kafka_topic FROM logs WHERE (record->>'n')::int = {n}");
    db.query_one(&sql, &[]).await.expect(&sql).get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_template_routes_each_record_and_the_persister_reads_them_by_pattern() {
    let setup = Scenario::new("topics").without_topic().build().await;
    // A `-` in the name: the persister's pattern, derived from the template, must take it.
    let base = format!("{}-log", setup.topic);
    // Two topics exist; `{base}.web` does not yet: the broker creates it on the first record,
    // and the persister's pattern finds it at its next metadata refresh.
    for name in ["cart", "other"] {
        create_topic(&setup.bootstrap, &format!("{base}.{name}"), 1).await;
    }
    let mut setup = setup;
    setup
        .config
        .set("kafka", "topic", format!("{base}.{{record.service}}"))
        .set("kafka", "default_topic", format!("{base}.other"))
        .set("kafka", "max_topics", 2)
        .persist_property("topic.metadata.refresh.interval.ms", "1000");
    // A templated topic's producer does not create topics unless told to.
    let mut create = toml::Table::new();
    create.insert("allow.auto.create.topics".into(), "true".into());
    setup.config.set("ship", "properties", toml::Value::Table(create));
    let _persister = setup.persister().await;
    let agent = setup.agent().await;
    let db = setup.db().await;
    let records = [
        r#"{"service":"cart","n":1}"#,
        r#"{"service":"web","n":2}"#,
        r#"{"n":3}"#,
        r#"{"service":"no spaces allowed","n":4}"#,
        r#"{"service":"third","n":5}"#,
        r#"{"service":"cart","n":6}"#,
    ];
    send_lines(&setup.config.socket(), &records.map(|r| r.as_bytes().to_vec())).await;
    until_rows(&db, 6).await;

    let (cart, web, other) = (format!("{base}.cart"), format!("{base}.web"), format!("{base}.other"));
    assert_eq!(rows_per_topic(&db).await, vec![(cart.clone(), 2), (other.clone(), 3), (web.clone(), 1)]);
    assert_eq!(topic_of(&db, 2).await, web, "a topic the broker created, found by the pattern");
    for (n, why) in [(3, "missing_field"), (4, "invalid_topic"), (5, "max_topics")] {
        assert_eq!(topic_of(&db, n).await, other, "{why}");
    }
    let metrics = scrape(setup.config.agent_admin()).await;
    for why in ["missing_field", "invalid_topic", "max_topics"] {
        assert_eq!(metrics.count(telemetry::INGEST_TOPIC_DEFAULTS, &[("reason", why)]), 1.0, "{why}");
    }
    assert_eq!(metrics.value(telemetry::INGEST_TOPICS, &[]), Some(2.0), "cart and web; third was one too many");
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_broker_does_not_know_sends_its_records_to_the_default_topic() {
    let setup = Scenario::new("unknowntopic").without_topic().build().await;
    let base = setup.topic.clone();
    create_topic(&setup.bootstrap, &format!("{base}.other"), 1).await;
    let mut properties = toml::Table::new();
    // The broker would create it: this producer must not ask it to, and gives up waiting soon.
    properties.insert("allow.auto.create.topics".into(), "false".into());
    properties.insert("topic.metadata.propagation.max.ms".into(), "1000".into());
    let mut setup = setup;
    setup
        .config
        .set("kafka", "topic", format!("{base}.{{record.service}}"))
        .set("kafka", "default_topic", format!("{base}.other"))
        .set("ship", "properties", toml::Value::Table(properties));
    let _persister = setup.persister().await;
    let _agent = setup.agent().await;
    let db = setup.db().await;
    send_lines(&setup.config.socket(), &[br#"{"service":"nosuch","n":1}"#.to_vec()]).await;
    until_rows(&db, 1).await;
    assert_eq!(topic_of(&db, 1).await, format!("{base}.other"));
    until_metric(setup.config.agent_admin(), telemetry::INGEST_TOPIC_DEFAULTS, &[("reason", "unknown_topic")], 1.0)
        .await;
    // Counted once Kafka's answer is in, which may come after the row.
    until_metric(setup.config.agent_admin(), telemetry::SHIP_DELIVERED, &[], 1.0).await;
    // For a while the topic's next records go straight to the default one.
    send_lines(&setup.config.socket(), &[br#"{"service":"nosuch","n":2}"#.to_vec()]).await;
    until_rows(&db, 2).await;
    assert_eq!(topic_of(&db, 2).await, format!("{base}.other"));
    until_metric(setup.config.agent_admin(), telemetry::INGEST_TOPIC_DEFAULTS, &[("reason", "unknown_topic")], 2.0)
        .await;
}

/// A topic change — by a restart or a reload — applies to records read from then on; records
/// already accepted (spooled while Kafka was away, or in memory) keep the topic they were read
/// under, and the persister, subscribed to both, stores each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_change_applies_to_new_records_and_spooled_ones_keep_theirs() {
    let setup = Scenario::new("topicmove").without_topic().disk_buffer().build().await;
    let base = setup.topic.clone();
    let (first, second, third) = (format!("{base}.first"), format!("{base}.second"), format!("{base}.third"));
    for topic in [&first, &second, &third] {
        create_topic(&setup.bootstrap, topic, 1).await;
    }
    let mut setup = setup;
    setup.config.set("kafka", "topic", first.clone()).set("agent", "drain_timeout", "2s");
    setup.config.set("persist", "topics", vec![first.clone(), second.clone(), format!("^{}\\.third$", base)]);
    let line = |n: i64| format!(r#"{{"n":{n}}}"#).into_bytes();

    // Kafka away: three records wait in the spool under the first topic.
    let brokers = setup.bootstrap.clone();
    setup.config.set("kafka", "brokers", setup.unreachable_kafka());
    let (path, mut offline) = setup.listening_agent().await;
    send_lines(&setup.config.socket(), &[line(1), line(2), line(3)]).await;
    until_metric(setup.config.agent_admin(), telemetry::SPOOL_RECORDS, &[], 3.0).await;
    offline.signal("TERM");
    assert!(offline.wait(Duration::from_secs(20)).await.success(), "{}", offline.log_text());

    // Restarted with Kafka and the second topic: the spooled three still go to the first.
    setup.config.set("kafka", "brokers", brokers).set("kafka", "topic", second.clone());
    setup.config.write_to(&path);
    let _persister = setup.persister().await;
    let mut agent = setup.config.spawn_agent_at(&path).await;
    wait_ready(&mut agent, setup.config.agent_admin()).await;
    let db = setup.db().await;
    send_lines(&setup.config.socket(), &[line(4), line(5)]).await;
    until_rows(&db, 5).await;

    // Reloaded with the third: new records go there.
    setup.config.set("kafka", "topic", third.clone());
    setup.config.write_to(&path);
    agent.signal("HUP");
    until_metric_at_least(setup.config.agent_admin(), telemetry::CONFIG_RELOADS, &[("result", "applied")], 1.0).await;
    send_lines(&setup.config.socket(), &[line(6)]).await;
    until_rows(&db, 6).await;

    for (n, topic) in [(1, &first), (2, &first), (3, &first), (4, &second), (5, &second), (6, &third)] {
        assert_eq!(&topic_of(&db, n).await, topic, "record {n}");
    }
    assert_eq!(row_count(&db).await, 6, "each once");
}

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

/// Labels and annotations from a Downward API volume (here a folder the test writes, as the
/// kubelet does: a symlink swap) reach each row, route records by a template, and follow a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_labels_reach_each_row_route_by_template_and_follow_a_change() {
    let setup = Scenario::new("podinfo").without_topic().build().await;
    let base = setup.topic.clone();
    for team in ["payments", "search"] {
        create_topic(&setup.bootstrap, &format!("{base}.{team}"), 1).await;
    }
    create_topic(&setup.bootstrap, &format!("{base}.other"), 1).await;
    let podinfo = setup.config.dir.path().join("podinfo");
    // As the kubelet writes it: files behind `..data`, swapped atomically.
    let publish = |version: &str, labels: &str, annotations: &str| {
        let folder = podinfo.join(format!("..{version}"));
        std::fs::create_dir_all(&folder).expect("folder");
        std::fs::write(folder.join("labels"), labels).expect("labels");
        std::fs::write(folder.join("annotations"), annotations).expect("annotations");
        std::os::unix::fs::symlink(format!("..{version}"), podinfo.join("..data_tmp")).expect("symlink");
        std::fs::rename(podinfo.join("..data_tmp"), podinfo.join("..data")).expect("swap");
    };
    std::fs::create_dir_all(&podinfo).expect("podinfo");
    publish("v1", "team=\"payments\"\npod-template-hash=\"abc123\"\n", "sluice.dev/owner=\"ann\"\nbig=\"x\"\n");
    for file in ["labels", "annotations"] {
        std::os::unix::fs::symlink(format!("..data/{file}"), podinfo.join(file)).expect("link");
    }
    let mut setup = setup;
    setup.config.set("kafka", "topic", format!("{base}.{{pod.labels.team}}")).set(
        "kafka",
        "default_topic",
        format!("{base}.other"),
    );
    let mut pod_info = toml::Table::new();
    pod_info.insert("path".into(), podinfo.display().to_string().into());
    pod_info.insert("annotations".into(), vec!["sluice.dev/*".to_string()].into());
    pod_info.insert("interval".into(), "1s".into());
    setup.config.set("agent", "pod_info", toml::Value::Table(pod_info));
    let _persister = setup.persister().await;
    let _agent = setup.agent().await;
    let db = setup.db().await;
    send_lines(&setup.config.socket(), &[br#"{"n":1}"#.to_vec()]).await;
    until_rows(&db, 1).await;
    let row = db
        .query_one(
            "SELECT kafka_topic, pod_labels::text, pod_annotations::text FROM logs WHERE (record->>'n')::int = 1",
            &[],
        )
        .await
        .expect("row");
    assert_eq!(row.get::<_, String>(0), format!("{base}.payments"));
    assert_eq!(
        row.get::<_, Option<String>>(1).as_deref(),
        Some(r#"{"team": "payments"}"#),
        "excluded by default: pod-template-hash"
    );
    assert_eq!(
        row.get::<_, Option<String>>(2).as_deref(),
        Some(r#"{"sluice.dev/owner": "ann"}"#),
        "only what is listed"
    );
    let metrics = scrape(setup.config.agent_admin()).await;
    assert_eq!(metrics.value(telemetry::POD_INFO_SKIPPED, &[("kind", "labels"), ("reason", "not_allowed")]), Some(1.0));
    assert_eq!(
        metrics.value(telemetry::POD_INFO_SKIPPED, &[("kind", "annotations"), ("reason", "not_allowed")]),
        Some(1.0)
    );

    // The team changes (a relabel): records read after the agent sees it go to the new topic.
    publish("v2", "team=\"search\"\n", "");
    until_scrape(setup.config.agent_admin(), "the new labels read", |metrics| {
        metrics.value(telemetry::POD_INFO_ENTRIES, &[("kind", "annotations")]) == Some(0.0)
    })
    .await;
    send_lines(&setup.config.socket(), &[br#"{"n":2}"#.to_vec()]).await;
    until_rows(&db, 2).await;
    let row = db
        .query_one(
            "SELECT kafka_topic, pod_labels::text, pod_annotations::text FROM logs WHERE (record->>'n')::int = 2",
            &[],
        )
        .await
        .expect("row");
    assert_eq!(row.get::<_, String>(0), format!("{base}.search"));
    assert_eq!(row.get::<_, Option<String>>(1).as_deref(), Some(r#"{"team": "search"}"#));
    assert_eq!(row.get::<_, Option<String>>(2), None);
}
