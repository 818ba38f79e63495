//! AFL target: outbox_relay::fuzzing::amqp_url (the checks are there, beside the tests that replay
//! fuzz/corpus/amqp_url and fuzz/regressions/amqp_url).

fn main() {
    afl::fuzz!(|data: &[u8]| outbox_relay::fuzzing::amqp_url(data));
}
