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
    let config = Config::from_toml("[buffer]\nmax_bytes = \"8 MiB\"\nmax_records = 5000\n").expect("valid");
    let buffer = Buffer::new(&config.buffer);
    let client = producer_config(&config, &buffer);
    // 8 MiB / 5, and 5000 / 5.
    assert_eq!(client.get("queue.buffering.max.kbytes"), Some("1640"));
    assert_eq!(client.get("queue.buffering.max.messages"), Some("1001"));
    assert_eq!(buffer.max_bytes(), 8 * 1024 * 1024 - 8 * 1024 * 1024 / 5, "leases get the rest");
    assert_eq!(client.get("acks"), Some("all"));
    assert_eq!(client.get("enable.idempotence"), Some("true"));
}
