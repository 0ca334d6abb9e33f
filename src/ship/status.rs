//! Whether Kafka may hold a message librdkafka reports as failed: librdkafka's own answer
//! (`rd_kafka_message_status`), which rdkafka's safe API does not expose.
//!
//! Owns: the crate's one `unsafe` call. Why it is needed: a produce request that fails after the
//! broker may have appended it (the connection cut while the answer was on its way, a request
//! timeout, `NOT_ENOUGH_REPLICAS_AFTER_APPEND`) puts its messages back in librdkafka's queue as
//! "possibly persisted"; if the drain then purges them, their report says only
//! `ERR__PURGE_QUEUE`, the same as for a message never sent. Without the status such a record
//! was counted `drain_timeout` ("not stored") while Kafka held it. Must not: keep the pointer
//! beyond the delivery report it came with, or call anything else through it.

use rdkafka::bindings::{rd_kafka_message_status, rd_kafka_msg_status_t};
use rdkafka::message::BorrowedMessage;

/// True when librdkafka says Kafka may hold `message` although its delivery failed.
#[expect(unsafe_code, reason = "rdkafka has no safe accessor for a message's persistence status; see the module doc")]
pub(super) fn possibly_persisted(message: &BorrowedMessage<'_>) -> bool {
    // SAFETY: `message` is the message of the delivery report being served: librdkafka keeps it
    // alive for as long as the report is (the `BorrowedMessage` borrows the report's event), and
    // `rd_kafka_message_status` only reads its status field.
    let status = unsafe { rd_kafka_message_status(message.ptr().cast_const()) };
    status == rd_kafka_msg_status_t::RD_KAFKA_MSG_STATUS_POSSIBLY_PERSISTED
}
