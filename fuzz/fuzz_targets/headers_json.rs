//! AFL target: outbox_relay::fuzzing::headers_json (the checks are there, beside the tests that replay
//! fuzz/corpus/headers_json and fuzz/regressions/headers_json).

fn main() {
    afl::fuzz!(|data: &[u8]| outbox_relay::fuzzing::headers_json(data));
}
