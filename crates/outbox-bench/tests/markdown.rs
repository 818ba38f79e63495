//! The Markdown report of the committed fixture (tests/fixtures/results.json) against its
//! snapshot (tests/fixtures/results.md, rendered before the report code was split into
//! src/report/): a change to the report's text shows here. After an intended change, render
//! the snapshot again from the fixture.

use std::path::Path;

use outbox_bench::measurement::results::Results;

#[test]
fn the_fixture_renders_as_its_snapshot() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let json = std::fs::read_to_string(dir.join("results.json")).expect("the fixture");
    let results: Results = serde_json::from_str(&json).expect("the fixture parses");
    let snapshot = std::fs::read_to_string(dir.join("results.md")).expect("the snapshot");
    assert_eq!(results.markdown(), snapshot);
}
