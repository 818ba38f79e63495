//! Sharding: past one slot's throughput, N relays each stream their own slot through their
//! own publication, whose row filter takes one shard's rows (docs/scaling.md, "Scaling out"). No
//! coordination of our own: PostgreSQL splits the rows, the slot keeps each shard's order,
//! and a second relay on the same shard waits as its standby like any relay on a held slot.
//!
//! Shard K of N takes the rows where
//! `((CASE WHEN aggregate_id IS NOT NULL THEN hashtext(aggregate_id) ELSE uuid_hash(id) END)
//! & 2147483647) % N = K`: every row of one aggregate goes through one slot, so an
//! aggregate's events keep their commit order (the order between shards is lost); rows
//! without an aggregate spread by their id. Anyone can compute a row's shard in SQL with the
//! same expression. It stays within what a PostgreSQL 15 row filter accepts (columns,
//! constants, built-in operators, immutable built-in functions); `& 2147483647` rather than
//! `abs()`, because `abs(-2147483648)` raises an error, and an error in a row filter breaks
//! the slot's decoding for good.
//!
//! This module owns the expression and the shard's names (`<publication>_<k>`,
//! `<slot>_<k>`): `setup` creates them, the preflight checks a relay's publication against
//! them, and cleanup deletes only its shard's rows by them. One shard, the default, is no
//! sharding at all: the names as configured and no row filter.

use crate::config::modes::MAX_SHARDS;
use crate::config::names::{parse_identifier, parse_slot_name, OutboxNames};
use crate::contract::columns::{self, ColumnMap};
use crate::error::{ConfigProblem, RelayError};

/// One shard of `count` (`index` < `count`); `count` 1 is the unsharded outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shard {
    index: u32,
    count: u32,
}

impl Shard {
    /// No sharding: one publication without a row filter and one slot, named as configured.
    pub(crate) const UNSHARDED: Shard = Shard { index: 0, count: 1 };

    /// Shard `index` of `count`; the error says what is wrong with them, naming the flags.
    pub(crate) fn new(index: u32, count: u32) -> Result<Shard, RelayError> {
        if count == 0 || count > MAX_SHARDS {
            return Err(ConfigProblem::ShardCount {
                count,
                max: MAX_SHARDS,
            }
            .into());
        }
        if index >= count {
            return Err(ConfigProblem::ShardOutOfRange { index, count }.into());
        }
        Ok(Shard { index, count })
    }

    /// Every shard of `count`, in order.
    pub(crate) fn all(count: u32) -> Result<Vec<Shard>, RelayError> {
        Shard::new(0, count)?;
        Ok((0..count).map(|index| Shard { index, count }).collect())
    }

    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    pub(crate) fn is_sharded(&self) -> bool {
        self.count > 1
    }

    /// Whether an emitted event with this envelope shard hash (`None`: none readable) is this
    /// shard's: the row filter's `hash % N = K`. Logical messages are not row-filtered, so
    /// every shard's walsender sends every event; an event without a readable hash (a
    /// malformed envelope) is shard 0's, which applies the dead-letter policy to it once.
    pub(crate) fn takes_emitted(&self, hash: Option<u32>) -> bool {
        match hash {
            _ if !self.is_sharded() => true,
            Some(hash) => hash % self.count == self.index,
            None => self.index == 0,
        }
    }

    /// The row filter of this shard's publication (a boolean SQL expression on the outbox
    /// table's columns, under the names `map` gives them); `None` when unsharded. With
    /// `aggregate_id` unmapped every row spreads by its id.
    pub(crate) fn row_filter(&self, map: &ColumnMap) -> Option<String> {
        self.is_sharded().then(|| {
            // `id` is required: a map always has it.
            let id = map
                .sql(columns::ID)
                .unwrap_or_else(|| columns::ID.to_string());
            let hash = match map.sql(columns::AGGREGATE_ID) {
                Some(aggregate) => format!(
                    "(CASE WHEN {aggregate} IS NOT NULL THEN hashtext({aggregate}) ELSE \
                     uuid_hash({id}) END)"
                ),
                None => format!("uuid_hash({id})"),
            };
            format!(
                "({hash} & 2147483647) % {count} = {index}",
                count = self.count,
                index = self.index
            )
        })
    }

    /// This shard's names: `<publication>_<k>` and `<slot>_<k>` (the table and the exchange
    /// are every shard's); the names as they are when unsharded.
    pub(crate) fn names(&self, names: &OutboxNames) -> Result<OutboxNames, RelayError> {
        Ok(OutboxNames {
            table: names.table.clone(),
            publication: self.publication(&names.publication)?.into(),
            slot: self.slot(&names.slot)?.into(),
            exchange: names.exchange.clone(),
        })
    }

    /// This shard's publication: `<publication>_<k>`, or `publication` when unsharded.
    pub(crate) fn publication(&self, publication: &str) -> Result<String, RelayError> {
        self.suffixed("--publication", publication, parse_identifier)
    }

    /// This shard's slot: `<slot>_<k>`, or `slot` when unsharded.
    pub(crate) fn slot(&self, slot: &str) -> Result<String, RelayError> {
        self.suffixed("--slot", slot, parse_slot_name)
    }

    /// `name_<k>`, which must still be a valid name (63 bytes at most): the error names the
    /// flag to shorten.
    fn suffixed(
        &self,
        flag: &'static str,
        name: &str,
        parse: fn(&str) -> Result<String, String>,
    ) -> Result<String, RelayError> {
        if !self.is_sharded() {
            return Ok(name.to_string());
        }
        let sharded = format!("{name}_{}", self.index);
        parse(&sharded).map_err(|problem| {
            RelayError::from(ConfigProblem::ShardedNameInvalid {
                count: self.count,
                flag,
                name: name.to_string(),
                sharded: sharded.clone(),
                problem,
            })
        })
    }

    /// Every shard of `count` with its names, in order: what `setup` and `teardown` handle.
    pub(crate) fn every(
        names: &OutboxNames,
        count: u32,
    ) -> Result<Vec<(Shard, OutboxNames)>, RelayError> {
        Shard::all(count)?
            .into_iter()
            .map(|shard| Ok((shard, shard.names(names)?)))
            .collect()
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> OutboxNames {
        OutboxNames {
            table: "outbox".into(),
            publication: "outbox_pub".into(),
            slot: "outbox_slot".into(),
            exchange: "outbox".into(),
        }
    }

    #[test]
    fn the_row_filter_is_the_documented_expression() {
        let shard = Shard::new(1, 3).expect("shard");
        let default = ColumnMap::default();
        assert_eq!(
            shard.row_filter(&default).as_deref(),
            Some(
                "((CASE WHEN aggregate_id IS NOT NULL THEN hashtext(aggregate_id) ELSE \
                 uuid_hash(id) END) & 2147483647) % 3 = 1"
            )
        );
        assert!(!shard.row_filter(&default).expect("filter").contains("abs("));
        assert_eq!(Shard::UNSHARDED.row_filter(&default), None);
    }

    #[test]
    fn the_row_filter_names_the_mapped_columns() {
        let shard = Shard::new(0, 2).expect("shard");
        let debezium = ColumnMap::resolve(columns::Preset::Debezium, &["id=event id".to_string()])
            .expect("map");
        assert_eq!(
            shard.row_filter(&debezium).as_deref(),
            Some(
                "((CASE WHEN \"aggregateid\" IS NOT NULL THEN hashtext(\"aggregateid\") ELSE \
                 uuid_hash(\"event id\") END) & 2147483647) % 2 = 0"
            )
        );
        let no_aggregate =
            ColumnMap::resolve(columns::Preset::Default, &["aggregate_id=".to_string()])
                .expect("map");
        assert_eq!(
            shard.row_filter(&no_aggregate).as_deref(),
            Some("(uuid_hash(id) & 2147483647) % 2 = 0")
        );
        assert_eq!(Shard::new(0, 1).expect("one"), Shard::UNSHARDED);
    }

    #[test]
    fn one_shard_keeps_the_names_and_more_suffix_them() {
        assert_eq!(
            Shard::UNSHARDED.names(&names()).expect("names").publication,
            "outbox_pub"
        );
        let every = Shard::every(&names(), 3).expect("names");
        let published: Vec<(u32, String, String)> = every
            .iter()
            .map(|(s, n)| (s.index(), n.publication.to_string(), n.slot.to_string()))
            .collect();
        assert_eq!(
            published,
            [
                (0, "outbox_pub_0".into(), "outbox_slot_0".into()),
                (1, "outbox_pub_1".into(), "outbox_slot_1".into()),
                (2, "outbox_pub_2".into(), "outbox_slot_2".into()),
            ]
        );
        assert!(every.iter().all(|(_, n)| n.table == "outbox"));
    }

    #[test]
    fn shard_numbers_are_checked_naming_the_flags() {
        let e = Shard::new(3, 3).expect_err("K < N").to_string();
        assert!(
            e.contains("--shard is 3 but --shards is 3") && e.contains("0 to 2"),
            "{e}"
        );
        assert!(Shard::new(0, 0).is_err());
        assert!(Shard::new(0, MAX_SHARDS + 1).is_err());
        assert!(Shard::new(MAX_SHARDS - 1, MAX_SHARDS).is_ok());
    }

    #[test]
    fn a_suffix_that_makes_a_name_too_long_names_the_flag() {
        let mut long = names();
        long.slot = "s".repeat(61).into();
        let e = Shard::new(10, 11)
            .expect("shard")
            .names(&long)
            .expect_err("64 bytes")
            .to_string();
        assert!(
            e.contains("--slot") && e.contains("at most 63 bytes"),
            "{e}"
        );
        // Shard 0 of the same count fits (63 bytes): only the longest suffix fails.
        assert!(Shard::new(0, 11).expect("shard").names(&long).is_ok());
        assert!(Shard::every(&long, 11).is_err());
    }

    #[test]
    fn emitted_events_go_to_the_shard_of_their_hash_and_unreadable_ones_to_shard_0() {
        let shards = Shard::all(4).expect("4 shards");
        for hash in [0u32, 1, 5, 2_147_483_647] {
            let takers: Vec<u32> = shards
                .iter()
                .filter(|s| s.takes_emitted(Some(hash)))
                .map(|s| s.index())
                .collect();
            assert_eq!(takers, vec![hash % 4], "hash {hash}");
        }
        let takers: Vec<u32> = shards
            .iter()
            .filter(|s| s.takes_emitted(None))
            .map(|s| s.index())
            .collect();
        assert_eq!(takers, vec![0]);
        assert!(Shard::UNSHARDED.takes_emitted(None));
        assert!(Shard::UNSHARDED.takes_emitted(Some(7)));
    }
}
