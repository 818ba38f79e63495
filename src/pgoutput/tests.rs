//! Unit and property tests for the decoder. Messages are built with one encoder (`encode`), the
//! inverse of `decode`, so every test states its message as data.

use bytes::Bytes;
use pgwire_replication::Lsn;
use proptest::prelude::*;

use super::*;

fn lsn(s: &str) -> Lsn {
    Lsn::parse(s).expect("test LSN")
}

fn outbox_relation() -> Relation {
    let column = |flags, name: &str, type_oid, type_modifier| Column {
        flags,
        name: name.into(),
        type_oid,
        type_modifier,
    };
    Relation {
        oid: 16385,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: vec![
            column(1, "id", 20, -1),
            column(0, "exchange", 1043, 259),
            column(0, "payload", 3802, -1),
            column(0, "headers", 17, -1),
        ],
    }
}

fn outbox_insert() -> Insert {
    Insert {
        relation_oid: 16385,
        tuple: Tuple(vec![
            TupleValue::Text(Bytes::from_static(b"42")),
            TupleValue::Null,
            TupleValue::UnchangedToast,
            TupleValue::Binary(Bytes::from_static(&[0, 1, 2, 0xff])),
        ]),
    }
}

/// One valid message of every kind we decode.
fn samples() -> Vec<LogicalMessage> {
    vec![
        LogicalMessage::Begin(Begin {
            final_lsn: lsn("16/B374D848"),
            commit_time: 774_000_000_123_456,
            xid: 4_000_000_000,
        }),
        LogicalMessage::Commit(Commit {
            flags: 0,
            commit_lsn: lsn("16/B374D848"),
            end_lsn: lsn("16/B374D878"),
            commit_time: 774_000_000_123_456,
        }),
        LogicalMessage::Origin(Origin {
            commit_lsn: lsn("0/1"),
            name: "node_a".into(),
        }),
        LogicalMessage::Relation(outbox_relation()),
        LogicalMessage::Type(TypeMessage {
            oid: 16400,
            namespace: "public".into(),
            name: "mood".into(),
        }),
        LogicalMessage::Insert(outbox_insert()),
        LogicalMessage::Truncate(Truncate {
            options: 3,
            relation_oids: vec![16385, 16390],
        }),
        LogicalMessage::Message(LogicalDecodingMessage {
            transactional: false,
            lsn: lsn("16/B374D900"),
            prefix: "outbox.heartbeat".into(),
            content: Bytes::from_static(b"{\"at\":1}"),
        }),
    ]
}

fn round_trip(m: LogicalMessage) {
    assert_eq!(decode(&encode(&m)), Ok(m));
}

#[test]
fn relation() {
    let r = outbox_relation();
    let LogicalMessage::Relation(got) =
        decode(&encode(&LogicalMessage::Relation(r.clone()))).expect("valid Relation")
    else {
        panic!("not a Relation");
    };
    assert_eq!(got, r);
    assert_eq!(got.qualified_name(), "public.outbox");
    assert_eq!(got.column_index("payload"), Some(2));
    assert_eq!(got.column_index("Payload"), None, "names match exactly");
    assert_eq!(got.columns[1].type_modifier, 259);
}

#[test]
fn relation_without_columns() {
    round_trip(LogicalMessage::Relation(Relation {
        columns: vec![],
        ..outbox_relation()
    }));
}

#[test]
fn insert_with_every_value_kind() {
    let data = encode(&LogicalMessage::Insert(outbox_insert()));
    let LogicalMessage::Insert(got) = decode(&data).expect("valid Insert") else {
        panic!("not an Insert");
    };
    assert_eq!(got, outbox_insert());
    // Zero copy: the values point into the input buffer.
    let input = data.as_ptr_range();
    for value in &got.tuple.0 {
        if let TupleValue::Text(b) | TupleValue::Binary(b) = value {
            assert!(input.contains(&b.as_ptr()), "{value:?} was copied");
        }
    }
}

#[test]
fn insert_with_empty_values() {
    round_trip(LogicalMessage::Insert(Insert {
        relation_oid: 1,
        tuple: Tuple(vec![
            TupleValue::Text(Bytes::new()),
            TupleValue::Binary(Bytes::new()),
        ]),
    }));
    round_trip(LogicalMessage::Insert(Insert {
        relation_oid: 1,
        tuple: Tuple(vec![]),
    }));
}

#[test]
fn begin_and_commit() {
    let data = Enc::default()
        .u8(b'B')
        .i64(0x16_B374_D848)
        .i64(5)
        .i32(-1)
        .done();
    let Ok(LogicalMessage::Begin(b)) = decode(&data) else {
        panic!("not a Begin");
    };
    assert_eq!(b.final_lsn.to_string(), "16/B374D848");
    assert_eq!(b.xid, u32::MAX, "xid is unsigned");
    assert_eq!(b.commit_time, 5);
    for m in samples().into_iter().take(2) {
        round_trip(m);
    }
}

#[test]
fn lsn_uses_all_64_bits() {
    round_trip(LogicalMessage::Commit(Commit {
        flags: 0,
        commit_lsn: Lsn::from_u64(u64::MAX),
        end_lsn: Lsn::from_u64(1 << 63),
        commit_time: -1,
    }));
}

#[test]
fn type_origin_truncate_message() {
    for m in samples().into_iter().skip(2) {
        round_trip(m);
    }
    round_trip(LogicalMessage::Truncate(Truncate {
        options: 0,
        relation_oids: vec![],
    }));
    round_trip(LogicalMessage::Message(LogicalDecodingMessage {
        transactional: true,
        lsn: lsn("0/0"),
        prefix: String::new(),
        content: Bytes::new(),
    }));
}

#[test]
fn message_content_is_not_copied() {
    let data = encode(&samples()[7]);
    let Ok(LogicalMessage::Message(m)) = decode(&data) else {
        panic!("not a Message");
    };
    assert!(data.as_ptr_range().contains(&m.content.as_ptr()));
}

#[test]
fn message_flags_other_than_transactional_are_ignored() {
    let data = Enc::default()
        .u8(b'M')
        .u8(0b11)
        .i64(1)
        .cstr("p")
        .counted(b"x")
        .done();
    let Ok(LogicalMessage::Message(m)) = decode(&data) else {
        panic!("not a Message");
    };
    assert!(m.transactional);
}

#[test]
fn update_and_delete_are_skipped() {
    for tag in [b'U', b'D'] {
        let data = Enc::default().u8(tag).u32(16385).u8(b'K').i16(0).done();
        assert_eq!(decode(&data), Ok(LogicalMessage::Skipped(tag)));
    }
}

#[test]
fn unknown_tags_are_skipped() {
    // 'S' stream start and 'b' begin prepare belong to later protocol versions.
    for tag in [b'Z', b'S', b'b', 0, 0xff] {
        assert_eq!(
            decode(&Bytes::from(vec![tag])),
            Ok(LogicalMessage::Skipped(tag))
        );
    }
}

#[test]
fn empty_buffer() {
    assert_eq!(decode(&Bytes::new()), Err(DecodeError::Empty));
}

#[test]
fn every_truncation_is_an_error() {
    for m in samples() {
        let full = encode(&m);
        for len in 0..full.len() {
            let prefix = full.slice(..len);
            let result = decode(&prefix);
            assert!(
                matches!(
                    result,
                    Err(DecodeError::Empty
                        | DecodeError::Truncated { .. }
                        | DecodeError::UnterminatedString { .. })
                ),
                "{len}-byte prefix of {m:?}: {result:?}"
            );
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    for m in samples() {
        let mut data = encode(&m).to_vec();
        data.push(0);
        let err = decode(&Bytes::from(data)).expect_err("trailing byte accepted");
        assert!(
            matches!(err, DecodeError::TrailingBytes { count: 1, .. }),
            "{err}"
        );
    }
}

#[test]
fn truncated_column_length_message() {
    let data = Enc::default()
        .u8(b'I')
        .u32(1)
        .u8(b'N')
        .i16(4)
        .raw(b"n")
        .raw(b"u")
        .u8(b't')
        .counted(b"x")
        .u8(b't')
        .u8(0)
        .done();
    let err = decode(&data).expect_err("truncated");
    assert_eq!(
        err.to_string(),
        "Insert message truncated: expected 4 bytes for column 3 length, 1 left"
    );
}

#[test]
fn truncated_value_message() {
    let data = Enc::default()
        .u8(b'I')
        .u32(1)
        .u8(b'N')
        .i16(1)
        .u8(b'b')
        .i32(10)
        .raw(b"abc")
        .done();
    assert_eq!(
        decode(&data).expect_err("truncated").to_string(),
        "Insert message truncated: expected 10 bytes for column 0 value, 3 left"
    );
}

#[test]
fn negative_lengths_are_errors() {
    let insert = |count: i16, len: i32| {
        Enc::default()
            .u8(b'I')
            .u32(1)
            .u8(b'N')
            .i16(count)
            .u8(b't')
            .i32(len)
            .done()
    };
    assert_eq!(
        decode(&insert(1, -1)).expect_err("negative").to_string(),
        "Insert message has a negative column 0 length: -1"
    );
    assert_eq!(
        decode(&insert(-1, 0)).expect_err("negative").to_string(),
        "Insert message has a negative column count: -1"
    );
    let relation = Enc::default()
        .u8(b'R')
        .u32(1)
        .cstr("s")
        .cstr("t")
        .u8(b'd')
        .i16(i16::MIN)
        .done();
    assert!(matches!(
        decode(&relation),
        Err(DecodeError::NegativeLength {
            kind: MessageKind::Relation,
            field: Field::ColumnCount,
            value: -32768,
        })
    ));
    let truncate = Enc::default().u8(b'T').i32(i32::MIN).u8(0).done();
    assert!(matches!(
        decode(&truncate),
        Err(DecodeError::NegativeLength {
            field: Field::RelationCount,
            ..
        })
    ));
    let message = Enc::default()
        .u8(b'M')
        .u8(0)
        .i64(1)
        .cstr("p")
        .i32(-5)
        .done();
    assert_eq!(
        decode(&message).expect_err("negative").to_string(),
        "Logical decoding message has a negative content length: -5"
    );
}

#[test]
fn huge_counts_fail_without_allocating_them() {
    let truncate = Enc::default().u8(b'T').i32(i32::MAX).u8(0).u32(7).done();
    assert_eq!(
        decode(&truncate).expect_err("short").to_string(),
        "Truncate message truncated: expected 4 bytes for relation OID 1, 0 left"
    );
    let message = Enc::default()
        .u8(b'M')
        .u8(0)
        .i64(1)
        .cstr("p")
        .i32(i32::MAX)
        .done();
    assert!(matches!(
        decode(&message),
        Err(DecodeError::Truncated {
            field: Field::Content,
            expected: 2_147_483_647,
            left: 0,
            ..
        })
    ));
}

#[test]
fn bad_markers_are_errors() {
    let update_like = Enc::default().u8(b'I').u32(1).u8(b'K').i16(0).done();
    assert_eq!(
        decode(&update_like).expect_err("bad marker").to_string(),
        "Insert message has unexpected byte 0x4b for new tuple marker, expected 'N'"
    );
    let bad_kind = Enc::default()
        .u8(b'I')
        .u32(1)
        .u8(b'N')
        .i16(2)
        .raw(b"nx")
        .done();
    assert_eq!(
        decode(&bad_kind).expect_err("bad kind").to_string(),
        "Insert message has unexpected byte 0x78 for column 1 kind, expected one of 'n', 'u', 't', 'b'"
    );
}

#[test]
fn strings_must_be_terminated_utf8() {
    let unterminated = Enc::default()
        .u8(b'Y')
        .u32(1)
        .cstr("public")
        .raw(b"mood")
        .done();
    assert_eq!(
        decode(&unterminated).expect_err("no NUL").to_string(),
        "Type message truncated: no NUL terminator for name in the 4 bytes left"
    );
    let invalid = Enc::default().u8(b'O').i64(1).raw(b"n\xffode\0").done();
    let err = decode(&invalid).expect_err("invalid UTF-8");
    assert_eq!(
        err.to_string(),
        "Origin message has invalid UTF-8 in origin name"
    );
    assert!(std::error::Error::source(&err).is_some(), "source attached");
}

const TAGS: &[u8] = b"BCORYITMUD";

fn text() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,12}"
}

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn relation_strategy() -> impl Strategy<Value = Relation> {
    let column = (any::<u8>(), text(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| Column {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    );
    (
        any::<u32>(),
        text(),
        text(),
        any::<u8>(),
        proptest::collection::vec(column, 0..8),
    )
        .prop_map(
            |(oid, namespace, name, replica_identity, columns)| Relation {
                oid,
                namespace,
                name,
                replica_identity,
                columns,
            },
        )
}

fn insert_strategy() -> impl Strategy<Value = Insert> {
    let value = prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::UnchangedToast),
        bytes(32).prop_map(TupleValue::Text),
        bytes(32).prop_map(TupleValue::Binary),
    ];
    (any::<u32>(), proptest::collection::vec(value, 0..16)).prop_map(|(relation_oid, values)| {
        Insert {
            relation_oid,
            tuple: Tuple(values),
        }
    })
}

fn message_strategy() -> impl Strategy<Value = LogicalDecodingMessage> {
    (any::<bool>(), any::<u64>(), text(), bytes(64)).prop_map(
        |(transactional, lsn, prefix, content)| LogicalDecodingMessage {
            transactional,
            lsn: Lsn::from_u64(lsn),
            prefix,
            content,
        },
    )
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = decode(&Bytes::from(data));
    }

    #[test]
    fn arbitrary_bodies_never_panic(
        tag in proptest::sample::select(TAGS),
        body in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut data = vec![tag];
        data.extend(body);
        let _ = decode(&Bytes::from(data));
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        which in 0..8usize,
        at in any::<proptest::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<proptest::sample::Index>(),
    ) {
        let mut data = encode(&samples()[which]).to_vec();
        let i = at.index(data.len());
        data[i] = byte;
        data.truncate(cut.index(data.len() + 1));
        let _ = decode(&Bytes::from(data));
    }

    #[test]
    fn relation_round_trips(r in relation_strategy()) {
        let m = LogicalMessage::Relation(r);
        prop_assert_eq!(decode(&encode(&m)), Ok(m));
    }

    #[test]
    fn insert_round_trips(i in insert_strategy()) {
        let m = LogicalMessage::Insert(i);
        prop_assert_eq!(decode(&encode(&m)), Ok(m));
    }

    #[test]
    fn message_round_trips(msg in message_strategy()) {
        let m = LogicalMessage::Message(msg);
        prop_assert_eq!(decode(&encode(&m)), Ok(m));
    }
}

/// The pgoutput fuzz target's seeds (fuzz/corpus/pgoutput/) are these samples and a few edge
/// cases, encoded. `OUTBOX_WRITE_FUZZ_SEEDS=1 cargo test --lib pgoutput::tests::fuzz_seeds`
/// writes them again after a change.
#[test]
fn fuzz_seeds_are_the_samples() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/pgoutput");
    let names = [
        "begin", "commit", "origin", "relation", "type", "insert", "truncate", "message",
    ];
    let mut seeds: Vec<(&str, Bytes)> = names
        .into_iter()
        .zip(samples().iter().map(encode))
        .collect();
    seeds.push((
        "insert_empty_values",
        encode(&LogicalMessage::Insert(Insert {
            relation_oid: 1,
            tuple: Tuple(vec![
                TupleValue::Text(Bytes::new()),
                TupleValue::Binary(Bytes::new()),
            ]),
        })),
    ));
    seeds.push((
        "update",
        Enc::default().u8(b'U').u32(16385).u8(b'K').i16(0).done(),
    ));
    let write = std::env::var_os("OUTBOX_WRITE_FUZZ_SEEDS").is_some();
    for (name, data) in seeds {
        let path = dir.join(name);
        if write {
            std::fs::create_dir_all(&dir).expect("seed folder");
            std::fs::write(&path, &data).expect("seed written");
        }
        let committed = std::fs::read(&path).unwrap_or_default();
        assert_eq!(
            committed,
            data.to_vec(),
            "{} is not the encoded sample: OUTBOX_WRITE_FUZZ_SEEDS=1 writes it",
            path.display()
        );
    }
}
