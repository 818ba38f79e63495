//! AFL target: outbox_relay::fuzzing::timestamptz (the checks are there, beside the tests that replay
//! fuzz/corpus/timestamptz and fuzz/regressions/timestamptz).

fn main() {
    afl::fuzz!(|data: &[u8]| outbox_relay::fuzzing::timestamptz(data));
}
