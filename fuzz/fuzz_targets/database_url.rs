//! AFL target: outbox_relay::fuzzing::database_url (the checks are there, beside the tests that replay
//! fuzz/corpus/database_url and fuzz/regressions/database_url).

fn main() {
    afl::fuzz!(|data: &[u8]| outbox_relay::fuzzing::database_url(data));
}
