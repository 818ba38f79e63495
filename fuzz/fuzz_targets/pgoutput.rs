//! AFL target: outbox_relay::fuzzing::pgoutput (the checks are there, beside the tests that replay
//! fuzz/corpus/pgoutput and fuzz/regressions/pgoutput).

fn main() {
    afl::fuzz!(|data: &[u8]| outbox_relay::fuzzing::pgoutput(data));
}
