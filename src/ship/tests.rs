use super::*;

fn production(code: RDKafkaErrorCode) -> KafkaError {
    KafkaError::MessageProduction(code)
}

#[test]
fn only_errors_about_the_record_itself_are_final() {
    for code in [RDKafkaErrorCode::MessageSizeTooLarge, RDKafkaErrorCode::InvalidRecord] {
        assert_eq!(classify(&production(code)), Disposition::GiveUp, "{code:?}");
    }
    for code in [
        RDKafkaErrorCode::MessageTimedOut,
        RDKafkaErrorCode::QueueFull,
        RDKafkaErrorCode::AllBrokersDown,
        RDKafkaErrorCode::UnknownTopicOrPartition,
        RDKafkaErrorCode::TopicAuthorizationFailed,
        RDKafkaErrorCode::NotEnoughReplicas,
    ] {
        assert_eq!(classify(&production(code)), Disposition::Retry, "{code:?}");
    }
}

#[test]
fn reasons_are_librdkafka_error_names_in_snake_case() {
    assert_eq!(reason(&production(RDKafkaErrorCode::MessageTimedOut)), "message_timed_out");
    assert_eq!(reason(&production(RDKafkaErrorCode::MessageSizeTooLarge)), "message_size_too_large");
    assert_eq!(reason(&KafkaError::Canceled), "other");
}

#[test]
fn librdkafka_queue_limits_follow_the_buffer_budget() {
    let config = Config::from_toml(
        "[buffer]\nmax_bytes = \"8 MiB\"\nmax_records = 5000\n[ingest.listeners.default]\nmax_record_size = \"256 KiB\"\n",
    )
    .expect("valid");
    let buffer = Buffer::for_config(&config);
    let client = producer_config(&config, &buffer);
    // 8 MiB / 5, and 5000 / 5.
    assert_eq!(client.get("queue.buffering.max.kbytes"), Some("1640"));
    assert_eq!(client.get("queue.buffering.max.messages"), Some("1001"));
    assert_eq!(buffer.max_bytes(), 8 * 1024 * 1024 - 8 * 1024 * 1024 / 5, "leases get the rest");
    assert_eq!(client.get("acks"), Some("all"));
    assert_eq!(client.get("enable.idempotence"), Some("true"));
}

/// Issue 12, item 2: librdkafka's queue was a fifth of the budget even when the largest record
/// allowed was bigger: such a record got QUEUE_FULL forever.
#[test]
fn librdkafkas_queue_and_message_limit_take_the_largest_message_a_listener_allows() {
    let config = Config::from_toml(
        "[buffer]\nmax_bytes = \"2 MiB\"\n[ingest.listeners.default]\nmax_record_size = \"256 KiB\"\n",
    )
    .expect("valid");
    let buffer = Buffer::for_config(&config);
    let client = producer_config(&config, &buffer);
    let largest = config.largest_message() as usize;
    let queue: usize = client.get("queue.buffering.max.kbytes").and_then(|v| v.parse().ok()).expect("kbytes");
    assert!(queue * 1024 >= largest, "queue {queue} KiB, largest message {largest} B");
    let message: usize = client.get("message.max.bytes").and_then(|v| v.parse().ok()).expect("message.max.bytes");
    assert!(message >= largest + 1024, "message.max.bytes {message}");
    assert_eq!(buffer.max_bytes() + queue * 1024 - 1024, 2 * 1024 * 1024, "leases + librdkafka's share = the budget");
    assert!(buffer.max_bytes() >= buffer.cost(largest, 0), "the leases hold the largest message too");
}

/// librdkafka's default message.max.bytes (1,000,000) is below the default record limit (1 MiB)
/// once enveloped: a maximum-size record was given up as message_size_too_large.
#[test]
fn the_default_record_limit_fits_librdkafkas_message_limit() {
    let config = Config::default();
    let buffer = Buffer::for_config(&config);
    let client = producer_config(&config, &buffer);
    let message: u64 = client.get("message.max.bytes").and_then(|v| v.parse().ok()).expect("message.max.bytes");
    assert!(message > 2 * 1024 * 1024, "{message}");
}
