//! TLS to PostgreSQL: the persister verifies the server's certificate.

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
    let services = services();
    let pipeline = start_pipeline("tls", 1, |config| {
        config.set("postgres", "url", require_tls(&services.pg)).set("postgres", "ca_file", ca());
    })
    .await;
    send_lines(&pipeline.config.socket(), &[b"over tls".to_vec()]).await;
    wait_for_rows(&pipeline.db, 1, WAIT).await;
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
    let services = services();
    let topic = unique("untrusted");
    create_topic(&services.kafka, &topic, 1).await;
    let mut config = TestConfig::new(&services, &topic);
    // sslmode=require without the CA that signed the server's certificate.
    config.set("postgres", "url", require_tls(&services.pg));
    config.table["postgres"].as_table_mut().expect("postgres").remove("ca_file");
    let path = config.write();
    let persister =
        Process::spawn("persist", &["persist", "--config", path.to_str().expect("path")], config.dir.path());
    eventually("the verification failure is logged", || async {
        persister.log_text().contains("certificate verify failed").then_some(())
    })
    .await;
    let (status, body) = http_get(config.persist_admin(), "/readyz").await.expect("readyz");
    assert_eq!(status, 503, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_and_a_persister_ship_through_sasl_ssl_with_scram_and_a_private_ca() {
    let services = services();
    let broker = PrivateBroker::start_sasl_ssl().await;
    let (sasl_bootstrap, ca) = broker.sasl_ssl.clone().expect("a SASL_SSL listener");
    let topic = unique("sasl");
    create_topic(&broker.bootstrap, &topic, 1).await;
    let mut config = TestConfig::new(&services, &topic);
    config.set("kafka", "brokers", sasl_bootstrap);
    let mut properties = toml::Table::new();
    for (key, value) in [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanisms", "SCRAM-SHA-512"),
        ("sasl.username", "sluice"),
        ("ssl.ca.location", ca.to_str().expect("path")),
    ] {
        properties.insert(key.into(), value.into());
    }
    config.set("kafka", "properties", properties);
    let mut from_env = toml::Table::new();
    from_env.insert("sasl.password".into(), "SLUICE_TEST_SASL_PASSWORD".into());
    config.set("kafka", "properties_from_env", from_env);
    config.env.push(("SLUICE_TEST_SASL_PASSWORD".into(), SASL_PASSWORD.into()));

    let _persister = start_persister(&config).await;
    let agent = start_agent(&config).await;
    let db = pg(&services, &config.schema()).await;
    let lines: Vec<Vec<u8>> = (0..100).map(|n| numbered(&topic, n).into_bytes()).collect();
    send_lines(&config.socket(), &lines).await;
    assert_eq!(wait_for_rows(&db, 100, WAIT).await, 100);
    assert!(!agent.log_text().contains(SASL_PASSWORD), "the password is never logged");
    let (_, shown) = http_get(config.agent_admin(), "/config").await.expect("/config");
    assert!(!shown.contains(SASL_PASSWORD) && shown.contains("SLUICE_TEST_SASL_PASSWORD"), "{shown}");
}
