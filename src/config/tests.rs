use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::config::postgres::redact_url_password;

fn invalid_key(text: &str) -> String {
    match Config::from_toml(text) {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("expected an invalid key, got {other:?}"),
    }
}

#[test]
fn an_empty_file_gives_the_documented_defaults() {
    let config = Config::from_toml("").expect("defaults are valid");
    assert_eq!(config, Config::default());
    assert_eq!(config.buffer.when_full, WhenFull::Block);
    let listener = &config.ingest.listeners["default"];
    assert_eq!(listener.protocol, Protocol::Lines);
    assert_eq!(listener.socket, PathBuf::from("/run/sluice/sluice.sock"));
    assert_eq!(listener.max_record_size, ByteSize::mib(1));
    assert_eq!(listener.socket_mode_bits(), 0o660);
    assert_eq!(listener.max_connections, 1024);
    assert_eq!(listener.idle_timeout, Some(Duration::from_secs(600)));
    assert_eq!(config.ingest.max_json_depth, 64);
    assert_eq!((config.agent.admin_config_endpoint, config.persist.admin_config_endpoint), (None, None));
}

#[test]
fn the_admin_config_endpoint_keys_read_a_bool_and_are_shown_only_when_set() {
    let config = Config::from_toml("[agent]\nadmin_config_endpoint = true\n[persist]\nadmin_config_endpoint = false\n")
        .expect("valid");
    assert_eq!((config.agent.admin_config_endpoint, config.persist.admin_config_endpoint), (Some(true), Some(false)));
    assert!(config.to_redacted_toml().contains("admin_config_endpoint = true"));
    assert!(!Config::default().to_redacted_toml().contains("admin_config_endpoint"), "unset is left out");
    assert!(Config::from_toml("[agent]\nadmin_config_endpoint = \"yes\"\n").is_err());
}

#[test]
fn listeners_replace_the_default_and_take_each_protocol() {
    let config = Config::from_toml(
        "[ingest.listeners.app]\nsocket = \"/s/app.sock\"\n\
         [ingest.listeners.sys]\nprotocol = \"syslog\"\nsocket = \"/s/log\"\n\
         [ingest.listeners.sys_stream]\nprotocol = \"syslog\"\ntransport = \"stream\"\nsocket = \"/s/log.stream\"\n\
         [ingest.listeners.fluent]\nprotocol = \"forward\"\nsocket = \"/s/fluent.sock\"\nidle_timeout = \"forever\"\n\
         [ingest.listeners.fluent.rate_limit]\nrecords_per_second = 100\nkey = \"peer\"\naction = \"drop\"\n",
    )
    .expect("valid");
    let names: Vec<_> = config.ingest.listeners.keys().map(String::as_str).collect();
    assert_eq!(names, ["app", "fluent", "sys", "sys_stream"]);
    assert_eq!(config.ingest.listeners["sys"].transport(), Transport::Datagram);
    assert_eq!(config.ingest.listeners["sys_stream"].transport(), Transport::Stream);
    let fluent = &config.ingest.listeners["fluent"];
    assert_eq!(fluent.idle_timeout, None);
    let limit = fluent.rate_limit.as_ref().expect("set");
    assert_eq!(
        (limit.records_per_second, limit.key, limit.action),
        (Some(100), RateLimitKey::Peer, RateLimitAction::Drop)
    );
    assert_eq!(limit.burst, Duration::from_secs(1));
}

#[test]
fn rejects_listener_settings_that_cannot_work_naming_the_listener() {
    let key = |listener: &str| invalid_key(&format!("[ingest.listeners.a]\nsocket = \"/s/a\"\n{listener}"));
    assert_eq!(key("socket_mode = \"rw\"\n"), "ingest.listeners.a.socket_mode");
    assert_eq!(key("protocol = \"forward\"\ntransport = \"datagram\"\n"), "ingest.listeners.a.transport");
    assert_eq!(key("max_record_size = \"10 B\"\n"), "ingest.listeners.a.max_record_size");
    assert_eq!(key("max_connections = 0\n"), "ingest.listeners.a.max_connections");
    assert_eq!(key("idle_timeout = \"0s\"\n"), "ingest.listeners.a.idle_timeout");
    assert_eq!(key("[ingest.listeners.a.rate_limit]\naction = \"drop\"\n"), "ingest.listeners.a.rate_limit");
    assert_eq!(key("[ingest.listeners.a.rate_limit]\nrecords_per_second = 0\n"), "ingest.listeners.a.rate_limit");
    assert_eq!(
        key("protocol = \"datagram\"\nallow_uids = [1000]\n"),
        "ingest.listeners.a.allow_uids",
        "datagrams carry no peer credentials"
    );
    assert_eq!(
        key("protocol = \"datagram\"\n[ingest.listeners.a.rate_limit]\nrecords_per_second = 5\nkey = \"peer\"\n"),
        "ingest.listeners.a.rate_limit.key"
    );
    assert_eq!(
        invalid_key("[ingest.listeners.a]\nsocket = \"/s/x\"\n[ingest.listeners.b]\nsocket = \"/s/x\"\n"),
        "ingest.listeners.b.socket"
    );
    assert_eq!(invalid_key("[ingest.listeners.\"bad name\"]\n"), "ingest.listeners.bad name");
    assert_eq!(invalid_key("[ingest]\nmax_json_depth = 0\n"), "ingest.max_json_depth");
}

#[test]
fn otlp_keys_apply_to_otlp_listeners_only_and_serve_loopback_alone() {
    let key = |listener: &str| invalid_key(&format!("[ingest.listeners.a]\nsocket = \"/s/a\"\n{listener}"));
    assert_eq!(key("addresses = [\"127.0.0.1:4317\"]\n"), "ingest.listeners.a.addresses", "lines has no addresses");
    assert_eq!(key("export_timeout = \"2s\"\n"), "ingest.listeners.a.export_timeout");
    let otlp = |rest: &str| key(&format!("protocol = \"otlp\"\n{rest}"));
    assert_eq!(otlp("addresses = [\"0.0.0.0:4317\"]\n"), "ingest.listeners.a.addresses", "off the pod");
    assert_eq!(otlp("allow_uids = [1000]\n"), "ingest.listeners.a.allow_uids", "TCP carries no peer credentials");
    assert_eq!(otlp("max_message_size = \"100 B\"\n"), "ingest.listeners.a.max_message_size");
    assert_eq!(otlp("export_timeout = \"2m\"\n"), "ingest.listeners.a.export_timeout");
    assert_eq!(
        invalid_key(
            "[ingest.listeners.a]\nsocket = \"/s/a\"\nprotocol = \"otlp\"\n\
             [ingest.listeners.b]\nsocket = \"/s/b\"\nprotocol = \"otlp\"\n"
        ),
        "ingest.listeners.b.addresses",
        "two otlp listeners cannot both take the default ports"
    );
    let config = Config::from_toml("[ingest.listeners.a]\nprotocol = \"otlp\"\nallow_uids = [7]\naddresses = []\n")
        .expect("the Unix socket alone may check peers");
    assert!(config.ingest.listeners["a"].tcp_addresses().is_empty());
    let config = Config::from_toml("[ingest.listeners.a]\nprotocol = \"otlp\"\n").expect("valid");
    let otlp = &config.ingest.listeners["a"];
    assert_eq!(
        otlp.tcp_addresses().iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["127.0.0.1:4317", "127.0.0.1:4318"]
    );
    assert_eq!(otlp.max_message_bytes(), 4 << 20);
    assert_eq!(otlp.export_timeout, Duration::from_secs(8));
}

#[test]
fn a_multiline_rule_is_one_compiling_pattern_or_preset_within_the_record_limit() {
    let key = |rule: &str| {
        invalid_key(&format!("[ingest.listeners.a]\nsocket = \"/s/a\"\n[ingest.listeners.a.multiline]\n{rule}"))
    };
    assert_eq!(key(""), "ingest.listeners.a.multiline.preset", "one rule is needed");
    assert_eq!(key("preset = \"java\"\nstart = \"^x\"\n"), "ingest.listeners.a.multiline.preset", "only one");
    assert_eq!(key("start = \"(unclosed\"\n"), "ingest.listeners.a.multiline.start");
    assert_eq!(key("continuation = \"(?<=look-behind)\"\n"), "ingest.listeners.a.multiline.continuation");
    assert_eq!(key("preset = \"java\"\nmax_lines = 1\n"), "ingest.listeners.a.multiline.max_lines");
    assert_eq!(key("preset = \"java\"\nmax_bytes = \"2 MiB\"\n"), "ingest.listeners.a.multiline.max_bytes");
    assert_eq!(key("preset = \"java\"\nflush_timeout = \"0s\"\n"), "ingest.listeners.a.multiline.flush_timeout");
    assert_eq!(
        invalid_key("[ingest.listeners.a]\nprotocol = \"syslog\"\n[ingest.listeners.a.multiline]\npreset = \"go\"\n"),
        "ingest.listeners.a.multiline"
    );
    let config = Config::from_toml(
        "[ingest.listeners.a]\nmax_record_size = \"64 KiB\"\n[ingest.listeners.a.multiline]\npreset = \"python\"\n",
    )
    .expect("valid");
    let multiline = config.ingest.listeners["a"].multiline.as_ref().expect("multiline");
    assert_eq!(
        multiline.max_bytes(config.ingest.listeners["a"].max_record_size),
        64 * 1024,
        "never past the record limit"
    );
}

#[test]
fn a_key_template_and_headers_are_checked_at_load_naming_the_key() {
    assert_eq!(invalid_key("[ship]\nkey = \"template\"\n"), "ship.key_template");
    assert_eq!(invalid_key("[ship]\nkey = \"template\"\nkey_template = \"{pod.uid}\"\n"), "ship.key_template");
    assert_eq!(invalid_key("[ship.headers]\n\"sluice.id\" = \"forged\"\n"), "ship.headers.sluice.id");
    let many: String = (0..33).map(|n| format!("h{n} = \"v\"\n")).collect();
    assert_eq!(invalid_key(&format!("[ship.headers]\n{many}")), "ship.headers");
    let config = Config::from_toml(
        "[ship]\nkey = \"template\"\nkey_template = \"{pod.namespace}/{record.user}\"\nmetadata_headers = true\n[ship.headers]\nteam = \"a\"\n",
    )
    .expect("valid");
    assert_eq!(config.ship.headers["team"], "a");
}

#[test]
fn the_example_configs_in_the_repository_are_valid() {
    // The production-shaped examples in config/examples need their Secret's variable; tests/it/cli.rs
    // checks them with `sluice check-config` and the variable set.
    for file in ["config/agent.toml", "config/persist.toml", "config/demo.toml"] {
        let path = crate::test_support::crate_root().join(file);
        Config::load(&path).unwrap_or_else(|error| panic!("{file}: {error}"));
    }
}

#[test]
fn an_unknown_key_is_an_error_naming_the_key() {
    let error = Config::from_toml("[ingest]\nsockt = \"/tmp/x\"\n").expect_err("unknown key");
    let text = error.to_string();
    assert!(text.contains("ingest.sockt"), "{text}");
}

#[test]
fn a_wrong_type_is_an_error_naming_the_key() {
    let error = Config::from_toml("[buffer]\nmax_records = \"many\"\n").expect_err("wrong type");
    assert!(error.to_string().contains("buffer.max_records"), "{error}");
}

#[test]
fn load_names_the_file_in_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[buffer]\nwhen_full = \"sometimes\"\n").expect("write");
    let text = Config::load(&path).expect_err("bad value").to_string();
    assert!(text.contains("bad.toml") && text.contains("buffer.when_full"), "{text}");
}

#[test]
fn sizes_and_durations_read_as_people_write_them() {
    let config = Config::from_toml(
        "[buffer]\nmax_bytes = \"16 MiB\"\n[ship]\nlinger = \"50ms\"\n[agent]\ndrain_timeout = \"1m\"\n",
    )
    .expect("valid");
    assert_eq!(config.buffer.max_bytes, ByteSize::mib(16));
    assert_eq!(config.ship.linger, Duration::from_millis(50));
    assert_eq!(config.agent.drain_timeout, Duration::from_secs(60));
}

#[test]
fn rejects_limits_that_cannot_work() {
    assert_eq!(invalid_key("[buffer]\nmax_bytes = \"1 KiB\"\n"), "buffer.max_bytes");
    assert_eq!(
        invalid_key("[buffer]\nmax_bytes = \"2 MiB\"\n[ingest.listeners.default]\nmax_record_size = \"1 MiB\"\n"),
        "buffer.max_bytes"
    );
    assert_eq!(invalid_key("[buffer]\nmax_records = 0\n"), "buffer.max_records");
    assert_eq!(invalid_key("[ship]\ncompression = \"brotli\"\n"), "ship.compression");
    assert_eq!(invalid_key("[ship]\nkey = \"field\"\n"), "ship.key_field");
    assert_eq!(invalid_key("[kafka]\ntopic = \"no spaces\"\n"), "kafka.topic");
    assert_eq!(invalid_key("[postgres]\nschema = \"Robert'); DROP TABLE logs;--\"\n"), "postgres.schema");
    assert_eq!(invalid_key("[postgres]\nwrite_timeout = \"0s\"\n"), "postgres.write_timeout");
    assert_eq!(invalid_key("[postgres]\nconnect_timeout = \"0s\"\n"), "postgres.connect_timeout");
    assert_eq!(invalid_key("[agent]\nadmin_listen = \"localhost\"\n"), "agent.admin_listen");
    assert_eq!(invalid_key("[persist]\nbatch_max_records = 0\n"), "persist.batch_max_records");
    assert_eq!(invalid_key("[persist]\nbatch_max_bytes = \"100 B\"\n"), "persist.batch_max_bytes");
}

#[test]
fn a_templated_topic_needs_a_default_topic_and_names_kafka_can_take() {
    let template = "[kafka]\ntopic = \"logs.{pod.namespace}\"\n";
    assert_eq!(invalid_key(template), "kafka.default_topic");
    assert_eq!(invalid_key(&format!("{template}default_topic = \"no spaces\"\n")), "kafka.default_topic");
    assert_eq!(invalid_key("[kafka]\ntopic = \"logs/{record.app}\"\ndefault_topic = \"logs\"\n"), "kafka.topic");
    assert_eq!(invalid_key("[kafka]\ntopic = \"logs.{record.}\"\ndefault_topic = \"logs\"\n"), "kafka.topic");
    assert_eq!(invalid_key("[kafka]\ntopic = \"logs\"\ndefault_topic = \"other\"\n"), "kafka.default_topic");
    assert_eq!(invalid_key(&format!("{template}default_topic = \"logs\"\nmax_topics = 0\n")), "kafka.max_topics");
    assert_eq!(invalid_key("[persist]\ntopics = [\"^logs\\\\.(\"]\n"), "persist.topics[0]");
    assert_eq!(invalid_key("[persist]\ntopics = [\"ok\", \"not ok\"]\n"), "persist.topics[1]");
    // Cold review: a template without a literal prefix could route into any topic.
    assert_eq!(invalid_key("[kafka]\ntopic = \"{record.t}\"\ndefault_topic = \"logs\"\n"), "kafka.topic");
    assert_eq!(invalid_key("[kafka]\ntopic = \"__{record.t}\"\ndefault_topic = \"logs\"\n"), "kafka.topic");
    assert_eq!(invalid_key("[kafka]\ntopic = \"_{record.t}\"\ndefault_topic = \"logs\"\n"), "kafka.topic");
    let config = Config::from_toml(&format!("{template}default_topic = \"logs.other\"\n")).expect("valid");
    assert_eq!(config.subscriptions(), vec!["^logs\\..*$".to_string(), "logs.other".to_string()]);
    assert_eq!(Config::default().subscriptions(), vec!["sluice-logs".to_string()]);
}

#[test]
fn redact_rules_are_checked_naming_the_rule() {
    let rule = |body: &str| format!("[[ingest.redact.rules]]\n{body}\n");
    assert_eq!(invalid_key(&rule("name = \"a\"\nfield = \"x\"\nregex = \"y\"")), "ingest.redact.rules[0].field");
    assert_eq!(invalid_key(&rule("name = \"a\"")), "ingest.redact.rules[0].field");
    assert_eq!(invalid_key(&rule("name = \"Bad Name\"\nfield = \"x\"")), "ingest.redact.rules[0].name");
    assert_eq!(invalid_key(&rule("name = \"a\"\nregex = \"(\"")), "ingest.redact.rules[0].regex");
    assert_eq!(invalid_key(&rule("name = \"a\"\nregex = \"x*\"")), "ingest.redact.rules[0].regex");
    let unknown = Config::from_toml(&rule("name = \"a\"\npreset = \"ssn\"")).expect_err("no such preset");
    assert!(unknown.to_string().contains("preset") && unknown.to_string().contains("credit_card"), "{unknown}");
    assert_eq!(
        invalid_key(&format!("{}{}", rule("name = \"a\"\nfield = \"x\""), rule("name = \"a\"\nfield = \"y\""))),
        "ingest.redact.rules[1].name"
    );
    assert_eq!(invalid_key("[ingest.redact]\nmask = \"<\\\"\\\">\"\n"), "ingest.redact.mask");
    assert_eq!(
        invalid_key("[ingest.listeners.default.redact]\nrules = [{ name = \"a\" }]\n"),
        "ingest.listeners.default.redact.rules[0].field"
    );
    let config = Config::from_toml(&rule("name = \"email\"\npreset = \"email\"")).expect("valid");
    assert_eq!(config.ingest.redact.expect("set").rules[0].preset, Some(crate::config::RedactPreset::Email));
}

#[test]
fn typed_columns_are_checked_naming_the_column() {
    let column = |name: &str, body: &str| format!("[persist.columns.{name}]\n{body}\n");
    assert_eq!(invalid_key(&column("record", "pointer = \"/a\"\ntype = \"text\"")), "persist.columns.record");
    assert_eq!(invalid_key(&column("\"User\"", "pointer = \"/a\"\ntype = \"text\"")), "persist.columns.User");
    assert_eq!(invalid_key(&column("a", "pointer = \"a\"\ntype = \"text\"")), "persist.columns.a.pointer");
    let unknown = Config::from_toml(&column("a", "pointer = \"/a\"\ntype = \"int\"")).expect_err("no such type");
    assert!(unknown.to_string().contains("double precision"), "{unknown}");
    let config = Config::from_toml(&column("latency", "pointer = \"/ms\"\ntype = \"double precision\"\nindex = true"))
        .expect("valid");
    assert_eq!(config.persist.columns["latency"].kind, crate::config::ColumnType::DoublePrecision);
}

/// OAUTHBEARER's OIDC client-credentials flow needs librdkafka built with libcurl; its configure
/// leaves libcurl out, silently, without its headers (scripts/lib.sh `ensure_build_deps` installs
/// them). The OIDC properties are then refused at load, naming the key.
#[test]
fn librdkafka_is_built_with_oauth_oidc() {
    let mut client = rdkafka::ClientConfig::new();
    client.set("sasl.oauthbearer.method", "oidc").set("sasl.oauthbearer.client.id", "sluice");
    assert!(
        client.create_native_config().is_ok(),
        "librdkafka was built without libcurl: install libcurl4-openssl-dev (scripts/lib.sh ensure_build_deps), then `cargo clean -p rdkafka-sys`"
    );
}

/// Cold review (issue 15): librdkafka refuses `message.timeout.ms` ≤ `linger.ms`; the config
/// took such a pair, so the agent failed to start (exit 1, no key named) or, on a reload, kept
/// failing to replace its producer.
#[test]
fn refuses_a_linger_as_long_as_the_delivery_timeout_naming_the_linger() {
    assert_eq!(invalid_key("[ship]\nlinger = \"1s\"\ndelivery_timeout = \"1s\"\n"), "ship.linger");
    assert_eq!(invalid_key("[ship]\nlinger = \"5m\"\n"), "ship.linger", "the default delivery_timeout is 2m");
    assert_eq!(
        invalid_key("[ship]\nlinger = \"1s\"\ndelivery_timeout = \"1s 500us\"\n"),
        "ship.linger",
        "both are whole milliseconds to librdkafka"
    );
    Config::from_toml("[ship]\nlinger = \"999ms\"\ndelivery_timeout = \"1s\"\n").expect("shorter is fine");
    // librdkafka's message.timeout.ms is an i32 of milliseconds (~24.8 days).
    assert_eq!(invalid_key("[ship]\ndelivery_timeout = \"25d\"\n"), "ship.delivery_timeout");
    Config::from_toml("[ship]\ndelivery_timeout = \"24d\"\n").expect("24 days fit");
}

#[test]
fn refuses_pass_through_properties_that_would_weaken_delivery() {
    let key = invalid_key("[ship.properties]\nacks = \"1\"\n");
    assert_eq!(key, "ship.properties.\"acks\"");
    let key = invalid_key("[kafka.properties]\n\"enable.idempotence\" = \"false\"\n");
    assert_eq!(key, "kafka.properties.\"enable.idempotence\"");
}

/// Cold review (issue 15): a property librdkafka refuses passed validation and `check-config`;
/// the agent then exited 1, or a reload was taken and no later producer could be made.
#[test]
fn refuses_pass_through_properties_librdkafka_refuses_naming_them() {
    assert_eq!(
        invalid_key("[ship.properties]\n\"batch.num.messages\" = \"0\"\n"),
        "ship.properties.\"batch.num.messages\""
    );
    assert_eq!(
        invalid_key("[kafka.properties]\n\"no.such.property\" = \"1\"\n"),
        "kafka.properties.\"no.such.property\""
    );
    assert_eq!(
        invalid_key("[persist.properties]\n\"fetch.max.bytes\" = \"ten\"\n"),
        "persist.properties.\"fetch.max.bytes\""
    );
    let text =
        Config::from_toml("[ship.properties]\n\"batch.num.messages\" = \"0\"\n").expect_err("refused").to_string();
    assert!(text.contains("librdkafka"), "{text}");
    Config::from_toml("[kafka.properties]\n\"security.protocol\" = \"ssl\"\n\"socket.keepalive.enable\" = \"true\"\n")
        .expect("properties librdkafka takes are taken");
}

/// Issue 30, item 7 (cold review): `delivery.report.only.error = true` passed, and no record was
/// ever reported delivered (each kept its memory: the buffer filled after ~200k records, and at
/// the exit every record Kafka stored was counted lost); `transactional.id` made every produce
/// fail with ERR__STATE, retried for ever. Both, and the others of those two shapes, are refused
/// naming the key; so are two values sluice sets after the maps (they were silently replaced).
#[test]
fn refuses_producer_properties_that_would_stall_the_agent_or_make_it_lie() {
    for (section, property, value) in [
        ("ship", "delivery.report.only.error", "true"),
        ("kafka", "transactional.id", "sluice"),
        ("ship", "api.version.request", "false"),
        ("kafka", "topic.blacklist", "^logs$"),
        ("kafka", "log.queue", "true"),
        ("ship", "message.max.bytes", "2000000"),
        ("kafka", "statistics.interval.ms", "0"),
    ] {
        let text = format!("[{section}.properties]\n\"{property}\" = \"{value}\"\n");
        let error = Config::from_toml(&text).expect_err(property).to_string();
        assert!(error.contains(&format!("{section}.properties.\"{property}\"")), "{error}");
    }
}

#[test]
fn refuses_pass_through_properties_that_would_weaken_tls_verification() {
    let key = invalid_key("[kafka.properties]\n\"enable.ssl.certificate.verification\" = \"false\"\n");
    assert_eq!(key, "kafka.properties.\"enable.ssl.certificate.verification\"");
    let key = invalid_key("[ship.properties]\n\"ssl.endpoint.identification.algorithm\" = \"none\"\n");
    assert_eq!(key, "ship.properties.\"ssl.endpoint.identification.algorithm\"");
    let error = Config::from_toml("[persist.properties]\n\"enable.ssl.certificate.verification\" = \"false\"\n")
        .expect_err("managed");
    assert!(error.to_string().contains("is managed by sluice; use (always verified)"), "{error}");
}

#[test]
fn redacts_passwords_and_secret_properties_when_shown() {
    let config = Config::from_toml(
        "[postgres]\nurl = \"postgres://app:hunter2@db:5432/logs\"\n\
         [kafka.properties]\n\"sasl.password\" = \"hunter2\"\n\"security.protocol\" = \"SASL_SSL\"\n",
    )
    .expect("valid");
    let shown = config.to_redacted_toml();
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("postgres://app:<redacted>@db:5432/logs"), "{shown}");
    assert!(shown.contains("SASL_SSL"), "{shown}");
    // The original is untouched: only the copy for display is redacted.
    assert_eq!(config.postgres.url, "postgres://app:hunter2@db:5432/logs");
}

#[test]
fn redacts_a_password_given_in_key_value_form() {
    assert_eq!(
        redact_url_password("host=db user=app password=hunter2 dbname=logs"),
        "host=db user=app password=<redacted> dbname=logs"
    );
    assert_eq!(redact_url_password("postgres://app@db/logs"), "postgres://app@db/logs");
}

#[test]
fn redacts_the_oauthbearer_config_which_carries_client_secrets() {
    let config = Config::from_toml(
        "[kafka.properties]\n\"sasl.oauthbearer.config\" = \"principal=sluice clientSecret=hunter2\"\n",
    )
    .expect("valid");
    let shown = config.to_redacted_toml();
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("\"sasl.oauthbearer.config\" = \"<redacted>\""), "{shown}");
}

#[test]
fn redacts_a_quoted_key_value_password_with_spaces_and_keeps_the_other_keys() {
    assert_eq!(redact_url_password("host=x password='a b c' user=y"), "host=x password=<redacted> user=y");
    assert_eq!(
        redact_url_password(r"host=x password='it\'s a secret' user=y"),
        "host=x password=<redacted> user=y",
        "an escaped quote does not end the value"
    );
    assert_eq!(redact_url_password(r"password=back\ slash user=y"), "password=<redacted> user=y");
}

#[test]
fn redacts_a_key_value_password_with_spaces_around_the_equals_sign() {
    assert_eq!(redact_url_password("host=x password = hunter2 user=y"), "host=x password = <redacted> user=y");
    assert_eq!(redact_url_password("password  =  'a b'"), "password  =  <redacted>");
    assert_eq!(redact_url_password("host=x passfile=/p user=password"), "host=x passfile=/p user=password");
}

#[test]
fn redacts_every_password_a_url_can_carry() {
    assert_eq!(redact_url_password("postgres://app:hunter2@db:5432/logs"), "postgres://app:<redacted>@db:5432/logs");
    assert_eq!(
        redact_url_password("postgresql://app:hun/ter2@db/logs"),
        "postgresql://app:<redacted>@db/logs",
        "tokio-postgres reads the credentials up to the first @, even past a /"
    );
    assert_eq!(
        redact_url_password("postgres://app@db/logs?sslmode=require&password=hunter2&application_name=x"),
        "postgres://app@db/logs?sslmode=require&password=<redacted>&application_name=x"
    );
    assert_eq!(
        redact_url_password("postgres://app:one@db/logs?pass%77ord=two"),
        "postgres://app:<redacted>@db/logs?pass%77ord=<redacted>",
        "parameter names are percent-decoded"
    );
    assert_eq!(redact_url_password("postgres://db/logs?sslmode=require"), "postgres://db/logs?sslmode=require");
}

#[test]
fn a_password_that_cannot_be_read_hides_the_rest_of_the_string() {
    assert_eq!(redact_url_password("host=x password='never closed user=y"), "host=x password=<redacted>");
    assert_eq!(redact_url_password("host=x =y password=hunter2"), "host=x <redacted>");
    assert_eq!(redact_url_password("host=x password hunter2"), "host=x <redacted>");
    assert_eq!(
        redact_url_password("postgres://db/logs?sslmode=require&password"),
        "postgres://db/logs?sslmode=require&<redacted>"
    );
}

#[test]
fn the_redacted_output_is_itself_a_valid_config() {
    let config = Config::from_toml("[buffer]\nmax_bytes = \"16 MiB\"\n").expect("valid");
    let again = Config::from_toml(&config.to_redacted_toml()).expect("round trip");
    assert_eq!(again, config);
}

#[test]
fn disk_buffer_keys_read_as_documented() {
    let config = Config::from_toml(
        "[buffer]\ntype = \"disk\"\npath = \"/tmp/spool\"\nfsync = \"10ms\"\nblock_timeout = \"forever\"\nwhen_full = \"drop_oldest\"\n",
    )
    .expect("valid");
    assert_eq!(config.buffer.kind, BufferKind::Disk);
    assert_eq!(config.buffer.fsync, Fsync::Interval(Duration::from_millis(10)));
    assert_eq!(config.buffer.block_timeout, None);
    assert_eq!(config.buffer.when_full, WhenFull::DropOldest);
    assert_eq!(config.ack_point(), crate::buffer::ack::AckPoint::Spooled);
    let shown = config.to_redacted_toml();
    assert!(shown.contains("fsync = \"10ms\"") && shown.contains("block_timeout = \"forever\""), "{shown}");
}

#[test]
fn spooled_acknowledgements_need_a_disk_buffer() {
    assert_eq!(invalid_key("[ingest]\nack_point = \"spooled\"\n"), "ingest.ack_point");
    assert_eq!(invalid_key("[buffer]\nfsync = \"0ms\"\n"), "buffer.fsync");
    assert_eq!(invalid_key("[buffer]\ntype = \"disk\"\nmax_disk_bytes = \"100 KiB\"\n"), "buffer.max_disk_bytes");
    assert!(Config::from_toml("[buffer]\nfsync = \"sometimes\"\n").is_err());
}

mod reloading {
    use super::super::reload::{Event, Reloading, changed_keys, concerns_the_file, fingerprint, follow, plan};
    use super::*;

    /// Seen in CI (issue 15, 2026-12-04): the agent's log beside its config file kept the folder
    /// busy, the settle never ended on quiet, and the file was read between the test's truncate
    /// and write — an empty file, applied as every default.
    #[test]
    fn only_events_about_the_config_file_or_a_configmap_swap_count() {
        let name = std::ffi::OsStr::new("agent.toml");
        assert!(concerns_the_file(Some(std::ffi::OsStr::new("agent.toml")), name));
        assert!(concerns_the_file(Some(std::ffi::OsStr::new("..data")), name), "a ConfigMap's symlink swap");
        assert!(concerns_the_file(Some(std::ffi::OsStr::new("..2026_12_04_23_00_00.123")), name));
        assert!(concerns_the_file(None, name), "the folder itself moved or went away");
        assert!(!concerns_the_file(Some(std::ffi::OsStr::new("agent.log")), name), "a log beside it");
        assert!(!concerns_the_file(Some(std::ffi::OsStr::new("agent.toml.swp")), name));
    }

    /// A file changed between the start's load and the watcher's first look (a ConfigMap
    /// updated as the pod starts) passed for what ran, until the file changed again (seen as a
    /// flaky reload test under load).
    #[tokio::test]
    async fn a_change_made_before_the_watcher_starts_is_applied() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "[buffer]\nwhen_full = \"drop_oldest\"\n").expect("write");
        let running = std::sync::RwLock::new(Config::default());
        let stop = tokio_util::sync::CancellationToken::new();
        let mut applied = Vec::new();
        let reloading = Reloading { path, log: None, dry_run: false };
        let follow = follow(&reloading, Role::Agent, &running, stop.clone(), |_, new| {
            applied.push(new.buffer.when_full);
            Ok(())
        });
        // Until the change is applied (30 s: a hang detector, however busy the machine), then stop.
        let applied_then_stop = async {
            while running.read().expect("lock").buffer.when_full != WhenFull::DropOldest {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stop.cancel();
        };
        let both = async { tokio::join!(follow, applied_then_stop) };
        let _ = tokio::time::timeout(Duration::from_secs(30), both).await;
        assert_eq!(applied, vec![WhenFull::DropOldest]);
        assert_eq!(running.read().expect("lock").buffer.when_full, WhenFull::DropOldest);
    }

    /// Found with the dry-run test (issue 33): `--dry-run` over a file that names no sink (and a
    /// disk buffer) had every reload warn that `ship.sink` and `buffer.type` need a restart, and
    /// a restart would not change them.
    #[test]
    fn a_dry_run_agent_stays_one_across_reloads_and_needs_no_restart_for_it() {
        let file = "[buffer]\ntype = \"disk\"\npath = \"/var/lib/sluice\"\nwhen_full = \"drop_oldest\"\n";
        let mut running = Config::from_toml(file).expect("the file");
        running.dry_run();
        let new = Config::from_toml(file).expect("the file, read again");
        assert!(!plan(Role::Agent, &running, &new).restart.is_empty(), "what the pin is for");
        let reloading = Reloading { path: "agent.toml".into(), log: None, dry_run: true };
        let Event::Valid(pinned) = reloading.as_started(Event::Valid(Box::new(new))) else { panic!("valid") };
        let plan = plan(Role::Agent, &running, &pinned);
        assert!(plan.restart.is_empty(), "{:?}", plan.restart);
        assert_eq!(plan.effective.ship.sink, crate::config::Sink::Stdout);
    }

    /// What the watcher reports within `within`, or `None`.
    async fn next_within(watcher: &mut super::super::reload::Watcher, within: Duration) -> Option<WhenFull> {
        match tokio::time::timeout(within, watcher.next()).await {
            Ok(super::super::reload::Event::Valid(config)) => Some(config.buffer.when_full),
            Ok(super::super::reload::Event::Invalid(error)) => panic!("{error}"),
            Err(_) => None,
        }
    }

    /// Issue 15: the file was read every 2 s, an idle agent's most frequent wake-up. Its folder
    /// is watched now, so a change is seen at once (well before the 2 s a poll would take) and
    /// nothing wakes in between.
    #[tokio::test]
    async fn a_file_written_in_place_is_noticed_without_polling() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "").expect("write");
        let mut watcher = super::super::reload::Watcher::new(path.clone()).expect("watcher");
        std::fs::write(&path, "[buffer]\nwhen_full = \"drop_newest\"\n").expect("write");
        assert_eq!(next_within(&mut watcher, Duration::from_millis(1900)).await, Some(WhenFull::DropNewest));
    }

    /// A ConfigMap volume: `agent.toml` → `..data/agent.toml`, `..data` → a timestamped folder;
    /// an update writes a new folder and renames a new `..data` link over the old one.
    #[tokio::test]
    async fn a_configmap_update_by_symlink_swap_is_noticed_without_polling() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().expect("tempdir");
        let version = |name: &str, text: &str| {
            std::fs::create_dir(dir.path().join(name)).expect("mkdir");
            std::fs::write(dir.path().join(name).join("agent.toml"), text).expect("write");
        };
        version("..v1", "");
        symlink("..v1", dir.path().join("..data")).expect("symlink");
        symlink("..data/agent.toml", dir.path().join("agent.toml")).expect("symlink");
        let mut watcher = super::super::reload::Watcher::new(dir.path().join("agent.toml")).expect("watcher");
        version("..v2", "[buffer]\nwhen_full = \"drop_oldest\"\n");
        symlink("..v2", dir.path().join("..data_tmp")).expect("symlink");
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).expect("rename");
        assert_eq!(next_within(&mut watcher, Duration::from_millis(1900)).await, Some(WhenFull::DropOldest));
    }

    fn config(text: &str) -> Config {
        Config::from_toml(text).expect("valid")
    }

    #[test]
    fn changed_keys_are_dotted_paths_down_to_the_leaf() {
        let old = config("[ship.properties]\n\"socket.timeout.ms\" = \"1000\"\n");
        let new =
            config("[buffer]\nwhen_full = \"drop_oldest\"\n[ship.properties]\n\"socket.timeout.ms\" = \"2000\"\n");
        assert_eq!(changed_keys(&old, &new), vec!["buffer.when_full", "ship.properties.socket.timeout.ms"]);
        assert!(changed_keys(&old, &old).is_empty());
    }

    #[test]
    fn the_agent_applies_policy_ship_and_log_changes_and_keeps_the_rest_until_a_restart() {
        let old = config("");
        let new = config(
            "[log]\nlevel = \"debug\"\n[buffer]\nwhen_full = \"drop_newest\"\nmax_bytes = \"32 MiB\"\n\
             [ship]\nlinger = \"50ms\"\n[ingest.listeners.default]\nsocket = \"/elsewhere.sock\"\n[persist]\nbatch_max_records = 10\n",
        );
        let plan = plan(Role::Agent, &old, &new);
        assert_eq!(plan.live, vec!["buffer.when_full", "log.level", "ship.linger"]);
        assert_eq!(
            plan.restart,
            vec!["buffer.max_bytes", "ingest.listeners.default.socket"],
            "persist keys are not the agent's"
        );
        assert_eq!(plan.effective.buffer.when_full, WhenFull::DropNewest);
        assert_eq!(plan.effective.ship.linger, Duration::from_millis(50));
        assert_eq!(plan.effective.buffer.max_bytes, old.buffer.max_bytes, "kept until a restart");
        assert_eq!(plan.effective.ingest.listeners, old.ingest.listeners);
    }

    #[test]
    fn the_agent_applies_a_topic_change_live() {
        let old = config("");
        let new = config("[kafka]\ntopic = \"logs.{record.app}\"\ndefault_topic = \"logs\"\nmax_topics = 8\n");
        let agent = plan(Role::Agent, &old, &new);
        assert_eq!(agent.live, vec!["kafka.default_topic", "kafka.max_topics", "kafka.topic"]);
        assert_eq!(agent.effective.kafka, new.kafka);
        assert_eq!(plan(Role::Persist, &old, &new).restart.len(), 3, "the persister resubscribes at a restart");
    }

    #[test]
    fn the_persister_applies_batch_limits_and_log_level_only() {
        let old = config("");
        let new =
            config("[persist]\nbatch_max_records = 10\ngroup_id = \"other\"\n[buffer]\nwhen_full = \"drop_newest\"\n");
        let plan = plan(Role::Persist, &old, &new);
        assert_eq!(plan.live, vec!["persist.batch_max_records"]);
        assert_eq!(plan.restart, vec!["persist.group_id"]);
        assert_eq!(plan.effective.persist.batch_max_records, 10);
        assert_eq!(plan.effective.persist.group_id, old.persist.group_id);
    }

    #[test]
    fn the_fingerprint_changes_with_the_config_and_only_then() {
        let a = config("");
        let b = config("[ship]\nlinger = \"50ms\"\n");
        assert_eq!(fingerprint(&a), fingerprint(&config("")));
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a).len(), 8);
    }
}

#[test]
fn secret_kafka_properties_come_from_the_environment_and_are_never_shown() {
    // SAFETY of the test: a variable name no other test uses.
    let variable = "SLUICE_TEST_ONLY_SASL_PASSWORD_51";
    let text = format!("[kafka.properties_from_env]\n\"sasl.password\" = \"{variable}\"\n");
    assert_eq!(invalid_key(&text), "kafka.properties_from_env.\"sasl.password\"", "unset variable");
    // std::env::set_var is unsafe in edition 2024 and this crate forbids unsafe code, so the
    // positive case runs in a child process: tests/it/cli.rs.
}

mod postgres_tls {
    use tokio_postgres::config::SslMode;

    use super::*;

    fn postgres(url: &str, ca_file: Option<&str>) -> PostgresConfig {
        PostgresConfig { url: url.into(), ca_file: ca_file.map(PathBuf::from), ..PostgresConfig::default() }
    }

    #[test]
    fn a_ca_file_without_sslmode_in_the_url_requires_tls() {
        let config = postgres("postgres://app@db/logs", Some("/ca.crt"));
        assert_eq!(config.ssl_mode(), SslMode::Require, "prefer would fall back to plaintext");
        assert_eq!(postgres("host=db user=app", Some("/ca.crt")).ssl_mode(), SslMode::Require);
        assert_eq!(
            config.describe_tls(),
            "required (ca_file is set and the URL sets no sslmode): certificate and host name verified \
             against the system's CAs and ca_file /ca.crt"
        );
    }

    #[test]
    fn the_urls_sslmode_is_kept_whether_or_not_a_ca_file_is_given() {
        assert_eq!(postgres("postgres://db/logs?sslmode=prefer", Some("/ca.crt")).ssl_mode(), SslMode::Prefer);
        assert_eq!(postgres("postgres://db/logs?sslmode=disable", Some("/ca.crt")).ssl_mode(), SslMode::Disable);
        assert_eq!(postgres("host=db sslmode = require", None).ssl_mode(), SslMode::Require);
        assert_eq!(
            postgres("postgres://db/logs?sslmode=require", None).describe_tls(),
            "required (the URL's sslmode): certificate and host name verified against the system's CAs"
        );
        assert_eq!(postgres("host=db sslmode=disable", None).describe_tls(), "disabled (the URL's sslmode): plaintext");
    }

    #[test]
    fn without_a_ca_file_or_sslmode_tls_is_preferred_and_the_description_says_it_may_fall_back() {
        let config = postgres("postgres://app@db/logs", None);
        assert_eq!(config.ssl_mode(), SslMode::Prefer);
        let described = config.describe_tls();
        assert!(described.starts_with("prefer (the URL sets no sslmode)"), "{described}");
        assert!(described.contains("falls back to plaintext"), "{described}");
    }
}

/// Issue 12, item 2: 2 MiB with 512 KiB records passed validation, and a 450 KiB line then
/// waited forever: librdkafka's queue (a fifth of the budget) could never take its envelope.
#[test]
fn a_budget_that_cannot_take_the_largest_record_is_refused_naming_both_keys() {
    let text = "[buffer]\nmax_bytes = \"2 MiB\"\n[ingest.listeners.default]\nmax_record_size = \"512 KiB\"\n";
    match Config::from_toml(text) {
        Err(ConfigError::Invalid { key, message, .. }) => {
            assert_eq!(key, "buffer.max_bytes");
            assert!(message.contains("ingest.listeners.default.max_record_size"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_smallest_budget_allowed_takes_two_of_the_largest_messages() {
    let record = ByteSize::kib(256);
    let text = |budget: u64| {
        format!("[buffer]\nmax_bytes = \"{budget} B\"\n[ingest.listeners.default]\nmax_record_size = \"{record}\"\n")
    };
    let config = Config::from_toml(&text(2 * 1024 * 1024)).expect("2 MiB takes 256 KiB records");
    let largest = config.largest_message();
    assert_eq!(largest, 2 * 256 * 1024 + 4 * 1024, "twice the record (JSON escaping) plus room for the envelope");
    assert!(Config::from_toml(&text(2 * largest)).is_ok());
    assert!(Config::from_toml(&text(2 * largest - 1)).is_err());
}

/// Found trying the binary as a new user would (issue 33): a wrong type was told in Rust's words
/// (`expected usize`, `expected parsable string`).
#[test]
fn a_wrong_type_or_size_is_told_in_the_configs_words_not_rusts() {
    let message = |text: &str| match Config::from_toml(text) {
        Err(ConfigError::Parse { message, .. }) => message,
        other => panic!("expected a parse error, got {other:?}"),
    };
    let count = message("[kafka]\nmax_topics = \"x\"\n");
    assert!(
        count.contains("key `kafka.max_topics`") && count.ends_with("expected a whole number, 0 or more"),
        "{count}"
    );
    let size = message("[buffer]\nmax_bytes = \"lots\"\n");
    assert!(size.contains("key `buffer.max_bytes`") && size.contains("\"64 MiB\""), "{size}");
    assert!(!size.contains("parsable") && !count.contains("usize"));
    // "64MB" is read, as documented: powers of 1000.
    let decimal = Config::from_toml("[buffer]\nmax_bytes = \"64MB\"\n").expect("a size");
    assert_eq!(decimal.buffer.max_bytes.as_u64(), 64_000_000);
}

/// Found by the cold review (issue 33): printing settles what it prints, so a dry run over a
/// disk config emptied the spool a real run owed to Kafka into stdout, counted delivered.
#[test]
fn the_stdout_sink_refuses_a_disk_buffer_and_a_dry_run_uses_memory() {
    let disk = "[buffer]\ntype = \"disk\"\npath = \"/var/lib/sluice\"\n[ingest]\nack_point = \"spooled\"\n";
    assert_eq!(invalid_key(&format!("{disk}[ship]\nsink = \"stdout\"\n")), "ship.sink");
    let mut config = Config::from_toml(disk).expect("a disk config");
    config.dry_run();
    assert_eq!((config.ship.sink, config.buffer.kind), (crate::config::Sink::Stdout, BufferKind::Memory));
    config.validate("agent.toml").expect("a dry run's config is valid");
}

#[test]
fn a_url_naming_several_hosts_may_take_connect_timeout_for_each_of_them() {
    let config = Config::from_toml(
        "[postgres]\nurl = \"postgres://app@pg-1:5432,pg-2:5432,pg-3:5432/logs?target_session_attrs=read-write\"\n\
         connect_timeout = \"3s\"\n",
    )
    .expect("valid");
    assert_eq!(config.postgres.connect_budget(), Duration::from_secs(10), "3 hosts × 3 s, and a second");
    assert_eq!(PostgresConfig::default().connect_budget(), Duration::from_secs(11), "one host: 10 s and a second");
    assert_eq!(config.postgres.write_timeout, Duration::from_secs(60), "the default");
}
