//! `outbox-relay teardown --yes`: drops the slot, then the publication.
//!
//! A slot nobody reads is the classic way a logical replication consumer takes a primary
//! down: it pins every WAL segment written since its confirmed position until the disk fills
//! (or `max_slot_wal_keep_size` invalidates it). A relay that is retired for good must
//! therefore take its slot with it. The reverse danger is dropping a slot that is still
//! needed: rows committed from then on reach no slot. Hence `--yes`, and a refusal while a
//! process streams from the slot (after a few seconds' grace for a walsender whose relay has
//! just stopped).
//!
//! The slot goes first: it is what pins WAL, and a role may be allowed to drop it (every
//! REPLICATION role may) but not the publication (only its owner may). The table and the
//! exchange stay: they hold the application's data and other consumers' bindings.
//!
//! `--shards N` drops every shard's slot, then every shard's publication, and refuses before
//! dropping anything while any shard's slot is streamed: a half-done teardown would leave
//! some shards delivering and others not.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::catalog::slot::{read_slot, SlotReport};
use crate::config::TeardownArgs;
use crate::db;
use crate::error::{CatalogError, SlotError};
use crate::error::{ConfigProblem, RelayError};
use crate::shard::Shard;
use outbox_common::quote::quote_ident;

pub(crate) async fn run(args: TeardownArgs) -> Result<(), RelayError> {
    let names = &args.names;
    let shards = Shard::all(args.shards.shards)?;
    let slots = shards
        .iter()
        .map(|shard| shard.slot(&names.slot))
        .collect::<Result<Vec<_>, _>>()?;
    let publications = shards
        .iter()
        .map(|shard| shard.publication(&names.publication))
        .collect::<Result<Vec<_>, _>>()?;
    if !args.yes {
        let (slots, publications, all) = match shards.len() {
            1 => (
                format!("the replication slot {}", quoted(&slots)),
                format!("the publication {}", quoted(&publications)),
                "both",
            ),
            n => (
                format!("the {n} replication slots {}", quoted(&slots)),
                format!("the {n} publications {}", quoted(&publications)),
                "them all",
            ),
        };
        return Err(ConfigProblem::TeardownUnconfirmed {
            slots,
            publications,
            all,
        }
        .into());
    }
    let client = db::connect(&args.connections.database_url()?).await?;
    for slot in &slots {
        refuse_if_active(&client, slot).await?;
    }
    let mut slot_notes = Vec::new();
    for slot in &slots {
        slot_notes.push(drop_slot(&client, slot).await?);
    }
    let slot_note = slot_notes.join(" ");
    // Every publication this role may drop goes, even when an earlier one is a DBA's: the
    // first refusal is the error, and each is named on its own line.
    let mut not_owned = None;
    for publication in &publications {
        match drop_publication(&client, publication, &slot_note).await {
            Err(RelayError::Catalog(CatalogError::PublicationNotOwned {
                publication,
                owner,
                slot_note,
            })) => {
                if publications.len() > 1 {
                    outln!(
                        "publication {publication}: not dropped (owned by {owner}, who must run \
                         DROP PUBLICATION {};)",
                        quote_ident(&publication)
                    );
                }
                not_owned.get_or_insert(RelayError::Catalog(CatalogError::PublicationNotOwned {
                    publication,
                    owner,
                    slot_note,
                }));
            }
            result => result?,
        }
    }
    if let Some(e) = not_owned {
        return Err(e);
    }
    outln!("teardown complete; left in place: the outbox table and the exchange");
    Ok(())
}

/// `"a"`, or `"a", "b", "c"`.
fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|name| format!("\"{name}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How long teardown waits for a slot's walsender to go before refusing: a relay stopped a
/// moment ago (`systemctl stop … && outbox-relay teardown --yes`) leaves a walsender that
/// exits within milliseconds of noticing, and refusing then would be a false alarm.
const RELEASE_GRACE: Duration = Duration::from_secs(5);
const RELEASE_POLL: Duration = Duration::from_millis(100);

/// The slot's report once no process streams from it, or the last one read after
/// [`RELEASE_GRACE`] (still active) or `None` if it does not exist.
async fn read_slot_once_released(
    client: &Client,
    slot: &str,
) -> Result<Option<SlotReport>, RelayError> {
    let deadline = Instant::now() + RELEASE_GRACE;
    loop {
        let report = read_slot(client, slot).await?;
        let active = report.as_ref().is_some_and(|r| r.active_pid.is_some());
        if !active || Instant::now() >= deadline {
            return Ok(report);
        }
        tokio::time::sleep(RELEASE_POLL).await;
    }
}

/// An error if a process streams from `slot`.
async fn refuse_if_active(client: &Client, slot: &str) -> Result<(), RelayError> {
    match read_slot_once_released(client, slot).await? {
        Some(report) => match report.active_pid {
            Some(pid) => Err(RelayError::Slot(SlotError::Active {
                slot: slot.to_string(),
                pid: pid.to_string(),
            })),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

/// Drops the slot unless a process streams from it. Returns a sentence saying what happened.
async fn drop_slot(client: &Client, slot: &str) -> Result<String, RelayError> {
    let Some(report) = read_slot(client, slot).await? else {
        outln!("slot {slot}: does not exist");
        return Ok(format!("The slot \"{slot}\" did not exist."));
    };
    if let Some(pid) = report.active_pid {
        return Err(RelayError::Slot(SlotError::Active {
            slot: slot.to_string(),
            pid: pid.to_string(),
        }));
    }
    match client
        .execute("SELECT pg_catalog.pg_drop_replication_slot($1)", &[&slot])
        .await
    {
        Ok(_) => {
            outln!("slot {slot}: dropped (the WAL it held can be recycled)");
            Ok(format!("The slot \"{slot}\" was dropped."))
        }
        // A relay started between the check and the drop.
        Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) => {
            Err(RelayError::Slot(SlotError::Active {
                slot: slot.to_string(),
                pid: e
                    .as_db_error()
                    .and_then(|db| db.message().split("PID ").nth(1).map(str::to_string))
                    .unwrap_or_else(|| "unknown".into()),
            }))
        }
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {
            outln!("slot {slot}: does not exist");
            Ok(format!("The slot \"{slot}\" did not exist."))
        }
        Err(e) => Err(e.into()),
    }
}

async fn drop_publication(
    client: &Client,
    publication: &str,
    slot_note: &str,
) -> Result<(), RelayError> {
    let owner: Option<String> = client
        .query_opt(
            "SELECT pg_catalog.pg_get_userbyid(pubowner)::text FROM pg_catalog.pg_publication \
             WHERE pubname = $1",
            &[&publication],
        )
        .await?
        .map(|row| row.get(0));
    let Some(owner) = owner else {
        outln!("publication {publication}: does not exist");
        return Ok(());
    };
    let dropped = client
        .batch_execute(&format!(
            "DROP PUBLICATION IF EXISTS {}",
            quote_ident(publication)
        ))
        .await;
    match dropped {
        Ok(()) => {
            outln!("publication {publication}: dropped");
            Ok(())
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            Err(RelayError::Catalog(CatalogError::PublicationNotOwned {
                publication: publication.to_string(),
                owner,
                slot_note: slot_note.to_string(),
            }))
        }
        Err(e) => Err(e.into()),
    }
}
