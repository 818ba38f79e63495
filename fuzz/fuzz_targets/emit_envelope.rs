//! AFL target: outbox_relay::fuzzing::emit_envelope (the checks are there, beside the tests that replay
//! fuzz/corpus/emit_envelope and fuzz/regressions/emit_envelope).

fn main() {
    afl::fuzz!(|data: &[u8]| outbox_relay::fuzzing::emit_envelope(data));
}
