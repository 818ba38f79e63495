//! The nemesis: one campaign of mixed, overlapping faults drawn from a seeded schedule
//! (`common::nemesis`), against the whole production topology on the lab's hosts, judged
//! from outside at the end.
//!
//! - a PostgreSQL 17+ primary and streaming standby on pg1/pg2 (a failover slot,
//!   `synchronized_standby_slots`), writers committing a steady ~100 rows/s through the
//!   multi-host URL;
//! - the lab's 3-node cluster; the outbox's exchange routes to two quorum queues: one the
//!   consumers apply, one the test reads only at the end (every delivery, to count repeats
//!   and to check ACK);
//! - two relays (one active, one standby) on relay0/relay1, through the multi-host URL and the
//!   broker list;
//! - two `outbox-inbox consume` replicas on relay2/relay3, each through a node of its own,
//!   applying an effect per message into the lab's PostgreSQL;
//! - two bad inputs among the faults: rows routed to an exchange the relays may use
//!   (`--allowed-exchanges <exchange>.undeclared.*`) and nobody declared, and the outbox table
//!   renamed while the application writes under the new name. At each heal the slot must
//!   not have passed the first such row; then the exchange is declared and bound to both
//!   queues, or the table renamed back and the relays (both stopped) started again.
//!
//! Every fault heals after its time; the schedule keeps the system survivable (a quorum of
//! nodes, one relay and one consumer, one PostgreSQL fault at a time): see the schedule's
//! rules. After the last fault and a quiet period, the oracles: every row on the final
//! primary has its effect exactly once and nothing else has one; at least one relay is ready
//! within [`READY_WITHIN`]; the test's queue holds every row (L0, none invented), each repeat
//! within the window of a fault that can make the relays deliver it again, no row more often
//! than those faults can ([`repeats_by_fault`]), and ACK holds on the slot once the relays
//! are stopped. One `FIGURES`
//! line, then a line per fault kind: count and the worst time until a row committed after
//! such a fault's heal had its effect.
//!
//! Promotions: a primary crash (immediate stop) or a planned switchover (clean stop) is
//! followed, the fault's time later, by the standby's promotion, as an HA manager would do it
//! once the standby's copy of the slot is ready; at the heal the old primary comes back as
//! the new one's standby on its own host and port (so the multi-host URL still names both):
//! after a switchover as it is, its stale slots dropped as docs/high-availability.md says,
//! after a crash rebuilt from an online copy. The ACK oracle is the writers' own record of where
//! each commit ended (`check_ack_of_commits`): a `test_decoding` slot would not survive
//! several promotions.
//!
//! `OUTBOX_NEMESIS_SEED` replays a schedule, or several in turn (`42,random`: a fixed
//! schedule, CI's, and a fresh one, printed); `OUTBOX_NEMESIS_MINUTES` sets each campaign's length
//! (3 by default; CI's 1.5); `scripts/test.sh --nemesis MINUTES [--seed S]` runs a long one,
//! and `--broken` runs it against relays that acknowledge before the confirm
//! (`OUTBOX_NEMESIS_BROKEN=1`: their `ack-before-confirm` switch on), to show that it fails.

use super::common;
use super::dead_peers::{
    effects, effects_database, spawn_relay_via_with, spawn_replica_with, writers_url, PEER_TIMEOUT,
};
use super::{blocking, exclusive, MINUTE};

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::amqp::{
    declare_bound_queue_with_args, delete_queue, quorum_queue_arguments, try_declare_and_bind,
    try_publish_into,
};
use common::failover::{FailoverPair, PairOptions, Rejoin};
use common::faults::{
    acknowledged_rows_delivered, acks_before_markers, check_ack_of_commits, connect_retrying,
    report, secs, Commit, Tally, WriteTo, Writers, MARKER_PREFIX,
};
use common::http::{http_get, metric_sum, wait_http};
use common::lab::Lab;
use common::nemesis::{Fault, FaultKind, Host, Plan, RelayRole, Schedule, Seed, Step, Topology};
use common::outbox::{wait_slot_confirmed_flush, Outbox};
use common::pg::{first_column, pg_connect, wait_count};
use common::{Consumer, RelayProcess};
use outbox_relay::metrics::STREAM_SKIPPED_TOTAL;
use tokio::time::Instant;

/// Whether the campaign runs against relays broken on purpose (`OUTBOX_NEMESIS_BROKEN=1`,
/// `scripts/test.sh --nemesis … --broken`): it must then fail.
fn broken() -> bool {
    std::env::var("OUTBOX_NEMESIS_BROKEN").is_ok_and(|v| v == "1")
}

/// A campaign's length unless `OUTBOX_NEMESIS_MINUTES` says otherwise.
const DEFAULT_MINUTES: f64 = 3.0;
/// A relay answers `/readyz` 200 within this of the last fault's heal.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// Every row on the final primary has its effect within this of the last fault's heal.
const APPLIED_WITHIN: Duration = Duration::from_secs(180);
/// Writers: 2 connections, transactions of 1-5 rows, 50 ms apart: about 100 rows/s, a
/// steady load that an hour's campaign can hold in its queues.
const WRITERS: usize = 2;
const MAX_TXN_ROWS: usize = 5;
const WRITE_PAUSE: Duration = Duration::from_millis(50);
/// The relays' and the consumers' hosts: relay0-1, relay2-3.
const RELAY_HOSTS: [usize; 2] = [0, 1];
const CONSUMER_HOSTS: [usize; 2] = [2, 3];
/// The node each consumer connects through (the inbox takes one URL).
const CONSUMER_NODES: [usize; 2] = [0, 2];
/// The effect both consumers run: one row per application.
const EFFECT_SQL: &str = "INSERT INTO effect (message_id, applied_by) \
                          VALUES ($1, host(inet_client_addr()))";

/// How long the test's queue may take to be read at the end (an hour's campaign: some
/// 360,000 messages).
const DRAIN_WITHIN: Duration = Duration::from_secs(600);
/// How long a consumer restarted with the after-commit failpoint may take to reach it (it
/// applies about 50 messages/s; a fault of its node may hold it up longer: then it is
/// stopped and counted as not aborted).
const AT_COMMIT_WITHIN: Duration = Duration::from_secs(10);
/// How long a promotion waits for the standby's copy of the slot to be ready, and a heal
/// for the old primary to stream again as a standby with its copy ready.
const PROMOTION_WAITS: Duration = Duration::from_secs(90);
/// The relays' cleanup deletes delivered rows while the faults go on, as in production but
/// sooner than the default hour (the first hour-long campaign's oracle took the rows its
/// default retention deleted at the end for rows the final primary lacked).
const CLEANUP_FLAGS: [&str; 4] = ["--retention", "2m", "--cleanup-interval", "15s"];
/// How long a renamed outbox table may take to stop both relays: the active one at the
/// first row written under the new name (it may be behind, held by a broker fault), the
/// standby once it takes the slot and finds no table of the configured name.
const RELAYS_STOP_WITHIN: Duration = Duration::from_secs(60);
/// How long one attempt to declare an exchange through a node may take before the next
/// node is tried (a paused node never answers).
const DECLARE_ATTEMPT: Duration = Duration::from_secs(10);
/// The outbox table's name while a rename lasts.
const RENAMED_TABLE: &str = "outbox_renamed";
/// How often ACK is read while the faults run: the slot's confirmed_flush_lsn on the primary,
/// then a marker into the test's queue.
const ACK_READING_EVERY: Duration = Duration::from_secs(3);
/// How long one reading may take (its slot read, its marker's publish): a node or server
/// cut off costs that reading only.
const ACK_READING_WITHIN: Duration = Duration::from_secs(2);
/// What the final primary's history holds, whatever the cleanup deleted: a trigger copies
/// each row's id and created_at in the row's own transaction, so a failover keeps or loses
/// the copy with the row, and the cleanup never touches it. Not in the publication.
const WRITTEN_SQL: &str = "CREATE TABLE outbox_written (id uuid PRIMARY KEY, \
     created_at timestamptz NOT NULL);
     CREATE FUNCTION outbox_written() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN INSERT INTO outbox_written VALUES (NEW.id, NEW.created_at); RETURN NULL; END $$;
     CREATE TRIGGER outbox_written AFTER INSERT ON outbox FOR EACH ROW \
     EXECUTE FUNCTION outbox_written();";

/// A process the campaign stops and starts again, with what it needs to start again.
struct Slot {
    process: Option<RelayProcess>,
    metrics: Option<SocketAddrV4>,
}

/// Where a campaign's relays deliver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Destination {
    /// The outbox's exchange, routing to two quorum queues: the consumers' and the test's.
    Queues,
    /// A stream replicated on the three nodes (`run --stream`), read whole at the end; no
    /// consumers.
    Stream,
}

/// What the faults act on.
struct World {
    lab: &'static Lab,
    /// Written by the PostgreSQL faults only, which never overlap (the schedule's rules).
    pair: tokio::sync::RwLock<FailoverPair>,
    /// The outbox's database.
    db: String,
    outbox: Outbox,
    relay_url: String,
    brokers: String,
    /// The consumers' database and queue (empty for a stream: no consumers).
    effects_url: String,
    consumer_queue: String,
    /// The relays' flags beyond the kit's: the cleanup, and the exchanges rows may name.
    relay_flags: Vec<String>,
    /// The exchanges an undeclared-exchange fault routes rows to: this and a number.
    undeclared_prefix: String,
    undeclared: AtomicUsize,
    relays: Vec<Mutex<Slot>>,
    consumers: Vec<Mutex<Slot>>,
    /// How many consumers the after-commit failpoint aborted (see `Fault::ConsumerKill9`).
    consumer_aborts_at_commit: AtomicUsize,
}

impl World {
    /// The lab's host of `host` (the primary's is whichever server is the primary now).
    async fn lab_host(&self, host: Host) -> &'static common::netns::Host {
        let lab = self.lab;
        match host {
            Host::Rabbit(i) => lab.rabbit_host(i),
            Host::PgPrimary => {
                let (pg1, pg2) = lab.pg_pair_hosts();
                let primary = self.pair.read().await.primary.addr();
                if pg1.addr() == primary {
                    pg1
                } else {
                    pg2
                }
            }
            Host::Relay(i) => lab.relay_host(RELAY_HOSTS[i]),
            Host::Consumer(j) => lab.relay_host(CONSUMER_HOSTS[j]),
        }
    }

    fn start_relay(&self, i: usize) {
        let host = self.lab.relay_host(RELAY_HOSTS[i]);
        let urls = (self.relay_url.as_str(), self.brokers.as_str());
        let flags: Vec<&str> = self.relay_flags.iter().map(String::as_str).collect();
        let env: &[(&str, &str)] = match broken() {
            true => &[("OUTBOX_FAILPOINTS", "ack-before-confirm=on")],
            false => &[],
        };
        let (process, at) = spawn_relay_via_with(&self.outbox, host, urls, &flags, env);
        let mut slot = self.relays[i].lock().unwrap();
        slot.process = Some(process);
        slot.metrics = Some(at);
    }

    fn start_consumer(&self, j: usize) {
        self.start_consumer_with(j, &[]);
    }

    /// Consumer `j` with more environment (a failpoint armed).
    fn start_consumer_with(&self, j: usize, env: &[(&str, &str)]) {
        let host = self.lab.relay_host(CONSUMER_HOSTS[j]);
        let amqp = self.lab.cluster.url(CONSUMER_NODES[j]);
        let urls = (self.effects_url.as_str(), amqp.as_str());
        let process = spawn_replica_with(host, urls, &self.consumer_queue, EFFECT_SQL, env);
        self.consumers[j].lock().unwrap().process = Some(process);
    }

    /// The relay whose host holds the slot now; relay 0 when none does (both reconnecting).
    async fn active_relay(&self) -> usize {
        let url = writers_url(&self.relay_url);
        let addr = ask_once(&url, Duration::from_secs(5), |client| async move {
            let row = client
                .query_opt(
                    "SELECT host(r.client_addr) FROM pg_replication_slots s \
                     JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1",
                    &[&self.outbox.slot],
                )
                .await
                .ok()??;
            row.get::<_, Option<String>>(0)
        })
        .await;
        (0..RELAY_HOSTS.len())
            .find(|&i| Some(self.lab.relay_host(RELAY_HOSTS[i]).addr().to_string()) == addr)
            .unwrap_or(0)
    }

    /// The queues every message reaches: the consumers' and the test's.
    fn queues(&self) -> [&str; 2] {
        [&self.consumer_queue, &self.outbox.queue]
    }

    async fn relay_of(&self, role: RelayRole) -> usize {
        let active = self.active_relay().await;
        match role {
            RelayRole::Active => active,
            RelayRole::Standby => (active + 1) % RELAY_HOSTS.len(),
        }
    }
}

/// When a step ran and healed, from the campaign's start and on the wall clock (the rows'
/// `created_at` and the effects' `applied_at` are read against the latter).
struct Ran {
    step: Step,
    /// How late the fault started (the runtime busy): 0 when on time.
    late: Duration,
    began: SystemTime,
    healed: SystemTime,
    /// When the fault's target was whole again: the heal, or later the end of the restart
    /// of a node the fault left paused (mid-campaign, or by the final check of the cluster).
    /// A node's restart ends the relays' sessions through it: what they deliver again is
    /// written up to this moment, not only up to the heal.
    recovered: SystemTime,
    /// A PostgreSQL stop's: where the slot resumed.
    rewind: Option<Rewind>,
    /// Whether the fault found its target: a kill or a SIGTERM a running process.
    landed: bool,
}

/// What a PostgreSQL stop can take back: the slot resumes `from` its persisted position (a
/// restart: the state file, saved only at checkpoints and when `restart_lsn` moves, about
/// every 15 s here) or its standby copy's (a promotion: what the sync worker last copied),
/// and every row committed above that and before the stop (`to` bounds those: the server's
/// WAL end read after it) may be delivered again.
#[derive(Clone, Copy, Debug)]
struct Rewind {
    from: u64,
    to: u64,
}

impl Rewind {
    /// The rows of `commits` this stop may deliver again; a commit whose end the writer
    /// could not note (its connection broke right after the COMMIT) counts as one of them.
    fn rows(&self, commits: &[common::faults::Commit]) -> usize {
        commits
            .iter()
            .filter(|c| c.ended_by.is_none_or(|at| at > self.from && at <= self.to))
            .map(|c| c.ids.len())
            .sum()
    }
}

/// The commits the writers saw succeed, split into those on the final primary and those it
/// lacks (a commit is whole: one row missing is all of them). A commit may vanish only with a
/// fault that can take one away ([`FaultKind::can_lose_commits`]: a crashed primary, its
/// standby asynchronous); otherwise a vanished one is an error naming it.
fn surviving_commits(
    commits: &[common::faults::Commit],
    on_primary: &std::collections::HashSet<&str>,
    kinds: &[FaultKind],
) -> Result<(Vec<common::faults::Commit>, Vec<common::faults::Commit>), String> {
    let (surviving, vanished): (Vec<_>, Vec<_>) = commits
        .iter()
        .cloned()
        .partition(|c| c.ids.iter().all(|id| on_primary.contains(id.as_str())));
    if vanished.is_empty() || kinds.iter().any(|k| k.can_lose_commits()) {
        return Ok((surviving, vanished));
    }
    Err(format!(
        "{} commits the writers saw succeed are not on the final primary, and no fault of the \
         campaign could take one away (first: {:?})",
        vanished.len(),
        vanished[0].ids
    ))
}

#[test]
fn a_commit_may_vanish_only_with_a_crashed_primary() {
    let commit = |ids: &[&str]| common::faults::Commit {
        ids: ids.iter().map(|id| id.to_string()).collect(),
        ended_by: None,
    };
    let commits = [commit(&["a", "b"]), commit(&["c"]), commit(&["d"])];
    let on_primary: std::collections::HashSet<&str> = ["a", "b", "d"].into_iter().collect();
    let restarts = [FaultKind::PgRestart, FaultKind::PgSwitchover];
    assert_eq!(
        surviving_commits(&commits, &on_primary, &restarts).map(|_| ()),
        Err(
            "1 commits the writers saw succeed are not on the final primary, and no fault \
             of the campaign could take one away (first: [\"c\"])"
                .into()
        )
    );
    let crashed = [FaultKind::PgRestart, FaultKind::PgPrimaryCrash];
    let (surviving, vanished) =
        surviving_commits(&commits, &on_primary, &crashed).expect("a crash may lose c");
    assert_eq!((surviving.len(), vanished.len()), (2, 1));
    let everything: std::collections::HashSet<&str> = ["a", "b", "c", "d"].into_iter().collect();
    let (surviving, vanished) =
        surviving_commits(&commits, &everything, &restarts).expect("nothing vanished");
    assert_eq!((surviving.len(), vanished.len()), (3, 0));
}

#[test]
fn a_rewind_takes_back_the_rows_committed_above_where_the_slot_resumed_up_to_the_stop() {
    let commit = |ended_by: Option<u64>, rows: usize| common::faults::Commit {
        ids: (0..rows).map(|i| format!("{ended_by:?}-{i}")).collect(),
        ended_by,
    };
    let commits = [
        commit(Some(100), 1), // at the resumed position: the slot is past it
        commit(Some(101), 2),
        commit(Some(200), 3), // the WAL end read after the stop
        commit(Some(201), 4), // after the stop: delivered for the first time
        commit(None, 5),      // its end never noted: counted
    ];
    let rewind = Rewind { from: 100, to: 200 };
    assert_eq!(rewind.rows(&commits), 2 + 3 + 5);
    assert_eq!(Rewind { from: 200, to: 200 }.rows(&commits[..4]), 0);
}

/// What [`take_ack_readings`] read while the faults ran.
#[derive(Default)]
struct AckReadings {
    /// Each marker's id and the slot position read before it was published.
    markers: Vec<(String, u64)>,
    /// Every slot position read, and when.
    positions: Vec<(SystemTime, u64)>,
}

/// What one fault can make the relays deliver again. A relay delivers a row again only by
/// resuming below it from the slot in a new session, so the row must be one the slot had not
/// passed when the fault began (its commit ends `after` the last position read before that,
/// or above where a PostgreSQL stop made the slot resume, if lower: [`Rewind`]), and one
/// committed before the sessions the fault ended did (by `until`: when its target was whole
/// again, [`Ran::recovered`], and its settle time); each at most `replays` times
/// ([`Fault::replays`]).
#[derive(Clone, Copy, Debug)]
struct ReplayWindow {
    kind: FaultKind,
    began: SystemTime,
    after: u64,
    until: SystemTime,
    replays: usize,
}

impl ReplayWindow {
    fn of(ran: &Ran, positions: &[(SystemTime, u64)]) -> ReplayWindow {
        let read_before = positions
            .iter()
            .filter(|(at, _)| *at <= ran.began)
            .map(|&(_, position)| position)
            .max()
            .unwrap_or(0);
        let kind = ran.step.fault.kind();
        ReplayWindow {
            kind,
            began: ran.began,
            after: ran.rewind.map_or(read_before, |r| r.from.min(read_before)),
            until: ran.recovered + kind.settle(),
            replays: ran.step.fault.replays(ran.step.lasts),
        }
    }

    /// Whether a row whose commit ended at `ended_by` (unknown: `None`), created at
    /// `created`, is one this fault can deliver again.
    fn holds(&self, ended_by: Option<u64>, created: SystemTime) -> bool {
        self.replays > 0 && ended_by.is_none_or(|end| end > self.after) && created <= self.until
    }
}

/// A row of the campaign: where its commit ended (if the writer could note it) and when it
/// was written.
type RowAt = (Option<u64>, SystemTime);

/// The repeats in the test's queue (`counts`: deliveries per id), each to the faults that
/// could have made it: per kind, and an error naming the first row delivered again more
/// often than the windows holding it allow (none holding it: a repeat no fault explains).
/// A row's repeats go to the windows holding it, the one begun last first.
fn repeats_by_fault(
    counts: &HashMap<String, usize>,
    rows: &HashMap<&str, RowAt>,
    windows: &[ReplayWindow],
) -> Result<BTreeMap<FaultKind, usize>, String> {
    let mut by_kind = BTreeMap::new();
    let mut repeated: Vec<(&String, usize)> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| (id, n - 1))
        .collect();
    repeated.sort_unstable();
    let mut unexplained = Vec::new();
    for (id, mut repeats) in repeated {
        let &(ended_by, created) = rows
            .get(id.as_str())
            .ok_or_else(|| format!("{id} was delivered again but is not a committed row"))?;
        let mut holding: Vec<&ReplayWindow> = windows
            .iter()
            .filter(|w| w.holds(ended_by, created))
            .collect();
        let allowed: usize = holding.iter().map(|w| w.replays).sum();
        if repeats > allowed {
            unexplained.push((id, repeats, allowed, ended_by, created));
            continue;
        }
        holding.sort_by_key(|w| std::cmp::Reverse(w.began));
        for w in holding {
            let share = repeats.min(w.replays);
            *by_kind.entry(w.kind).or_default() += share;
            repeats -= share;
        }
    }
    let Some(&(id, repeats, allowed, ended_by, _)) = unexplained.first() else {
        return Ok(by_kind);
    };
    // Each row with the windows near it in time, and why none takes its repeat: what the next
    // look needs to tell a relay that repeats without cause from a window drawn too narrow.
    let origin = windows.iter().map(|w| w.began).min();
    let offset = |at: SystemTime| {
        origin
            .and_then(|o| at.duration_since(o).ok())
            .map_or("?".into(), |d| format!("+{:.1} s", d.as_secs_f64()))
    };
    let near = |ended_by: Option<u64>, created: SystemTime| -> Vec<String> {
        windows
            .iter()
            .filter(|w| {
                created + Duration::from_secs(60) >= w.began
                    && created <= w.until + Duration::from_secs(60)
            })
            .map(|w| {
                let why = if w.replays == 0 {
                    "replays nothing".to_string()
                } else if ended_by.is_some_and(|end| end <= w.after) {
                    format!(
                        "acknowledged before (slot at {})",
                        common::pg::format_lsn(w.after)
                    )
                } else {
                    format!("written after its end {}", offset(w.until))
                };
                format!("{} from {}: {why}", w.kind, offset(w.began))
            })
            .collect()
    };
    let examples: Vec<String> = unexplained
        .iter()
        .take(5)
        .map(|&(id, repeats, _, ended_by, created)| {
            format!(
                "{id}: {} deliveries, commit ending at {}, written {}, faults near it: {:?}",
                repeats + 1,
                ended_by.map_or("unknown".into(), common::pg::format_lsn),
                offset(created),
                near(ended_by, created)
            )
        })
        .collect();
    Err(format!(
        "{id} (commit ending at {}) was delivered {} times, but the faults whose windows hold \
         it can make it repeat {allowed} times; {} rows so, {} repeats (times from the first \
         fault's start):\n{}",
        ended_by.map_or("unknown".into(), common::pg::format_lsn),
        repeats + 1,
        unexplained.len(),
        unexplained.iter().map(|u| u.1 - u.2).sum::<usize>(),
        examples.join("\n")
    ))
}

/// A node left paused and restarted after the heal ends the relays' sessions through it
/// then: the fault's window reaches to the restart (and its settle time), not to the heal.
#[test]
fn a_window_reaches_to_the_restart_of_a_node_the_fault_left_paused() {
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let step = Step {
        at: Duration::from_secs(100),
        fault: Fault::RabbitPause { node: 1 },
        lasts: Duration::from_secs(10),
    };
    let ran = |recovered| Ran {
        step,
        late: Duration::ZERO,
        began: at(100),
        healed: at(110),
        recovered,
        rewind: None,
        landed: true,
    };
    let positions = [(at(99), 1_000)];
    let settle = FaultKind::RabbitPause.settle();
    // Written after the heal's settle time, before the restart: only the restart replays it.
    let row = (Some(2_000), at(110) + settle + Duration::from_secs(5));
    let healed_only = ReplayWindow::of(&ran(at(110)), &positions);
    assert!(!healed_only.holds(row.0, row.1));
    let restarted = ReplayWindow::of(&ran(at(110) + settle + Duration::from_secs(30)), &positions);
    assert!(restarted.holds(row.0, row.1));
    assert!(
        !restarted.holds(Some(900), row.1),
        "acknowledged before the fault"
    );
}

#[test]
fn a_repeat_must_lie_in_the_window_of_a_fault_that_can_replay_it() {
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let window = |kind, began: u64, after: u64, until: u64, replays| ReplayWindow {
        kind,
        began: at(began),
        after,
        until: at(until),
        replays,
    };
    let kill = window(FaultKind::RelayKill9, 100, 1_000, 130, 1);
    let flap = window(FaultKind::PartitionFlapping, 110, 1_500, 150, 3);
    let alarm = window(FaultKind::RabbitMemoryAlarm, 200, 5_000, 220, 0);
    let rows: HashMap<&str, RowAt> = [
        ("acked", (Some(900), at(90))), // the slot had passed it when the kill began
        ("in-kill", (Some(1_200), at(105))), // the kill's only
        ("in-both", (Some(1_600), at(112))), // the kill's and the flapping's
        ("late", (Some(9_000), at(300))), // committed after every window
        ("alarm", (Some(6_000), at(205))), // an alarm ends no session
        ("unnoted", (None, at(120))),   // its end unknown: any window up to its time
    ]
    .into_iter()
    .collect();
    let windows = [kill, flap, alarm];
    let counts = |pairs: &[(&str, usize)]| -> HashMap<String, usize> {
        pairs.iter().map(|(id, n)| (id.to_string(), *n)).collect()
    };

    let fine = counts(&[("in-kill", 2), ("in-both", 5), ("unnoted", 2), ("late", 1)]);
    let by_kind = repeats_by_fault(&fine, &rows, &windows).expect("each repeat explained");
    assert_eq!(by_kind[&FaultKind::PartitionFlapping], 3 + 1);
    assert_eq!(by_kind[&FaultKind::RelayKill9], 1 + 1);

    for (id, n) in [
        ("acked", 2),
        ("late", 2),
        ("alarm", 2),
        ("in-kill", 3),
        ("in-both", 6),
    ] {
        let error = repeats_by_fault(&counts(&[(id, n)]), &rows, &windows);
        assert!(
            error.as_ref().is_err_and(|e| e.starts_with(id)),
            "{id} delivered {n} times must be caught: {error:?}"
        );
    }
    let invented = repeats_by_fault(&counts(&[("nobody", 2)]), &rows, &windows);
    assert!(
        invented.is_err(),
        "a repeated id that is no row: {invented:?}"
    );
}

/// The current WAL position of the server `url` names, asked until it answers: a network
/// fault overlapping a PostgreSQL one may hold the connection up for its time.
async fn wal_end_after(url: &str) -> u64 {
    let what = "after a PostgreSQL fault";
    ask_until(url, PROMOTION_WAITS, what, |client| async move {
        let row = client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .ok()?;
        Some(common::pg::parse_lsn(row.get(0)))
    })
    .await
}

/// `ask` on a connection of its own to `url`, again every 200 ms until it answers (5 s at
/// most a try); panics after `within`, saying when (`what`) it was asked.
async fn ask_until<T, F, Fut>(url: &str, within: Duration, what: &str, ask: F) -> T
where
    F: Fn(tokio_postgres::Client) -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(answer) = ask_once(url, Duration::from_secs(5), &ask).await {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "nemesis: {url} did not answer for {} {what}",
            secs(within)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `ask` on a connection of its own to `url`, once, all of it within `within`: `None` when the
/// server did not answer in time (a fault in the way) or `ask` found nothing.
async fn ask_once<T, F, Fut>(url: &str, within: Duration, ask: F) -> Option<T>
where
    F: FnOnce(tokio_postgres::Client) -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    tokio::time::timeout(within, async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .ok()?;
        tokio::spawn(connection);
        ask(client).await
    })
    .await
    .ok()
    .flatten()
}

/// `slot`'s `confirmed_flush` as the stopped server `server` saved it: what the slot resumes
/// from when the server starts again. From `pg_replslot/SLOT/state`, a
/// `ReplicationSlotOnDisk` (PostgreSQL 16-18): magic, checksum, version and length (4 bytes
/// each), then `ReplicationSlotPersistentData`: the name (64 bytes), database, persistency,
/// xmin, catalog_xmin (4 each), restart_lsn (8), the invalidation cause (4, padded to 8),
/// confirmed_flush (8) at byte 112.
fn persisted_confirmed_flush(server: &common::pg::PgServer, slot: &str) -> u64 {
    const SLOT_MAGIC: u32 = 0x0105_1CA1;
    let path = server
        .dir()
        .join("data/pg_replslot")
        .join(slot)
        .join("state");
    let state = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let u32_at = |at: usize| u32::from_le_bytes(state[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(state[at..at + 8].try_into().unwrap());
    assert!(
        state.len() >= 120 && u32_at(0) == SLOT_MAGIC,
        "{}: not a replication slot's state file",
        path.display()
    );
    let name = &state[16..16 + slot.len() + 1];
    assert_eq!(
        name,
        [slot.as_bytes(), &[0]].concat(),
        "{}: the layout is not PostgreSQL 16-18's (the name is not at byte 16)",
        path.display()
    );
    u64_at(112)
}

/// Runs one step: waits for its start, does the fault, waits its time, heals.
async fn run_step(world: Arc<World>, started: Instant, step: Step) -> Ran {
    tokio::time::sleep_until(started + step.at).await;
    let late = started.elapsed().saturating_sub(step.at);
    let began = SystemTime::now();
    let lasts = step.lasts;
    let lab = world.lab;
    let mut rewind = None;
    let mut landed = true;
    let running = |process: &Option<RelayProcess>| {
        process
            .as_ref()
            .is_some_and(|process| process.try_exit().is_none())
    };
    match step.fault {
        Fault::RelayKill9 { relay } | Fault::RelaySigterm { relay } => {
            let i = world.relay_of(relay).await;
            let process = world.relays[i].lock().unwrap().process.take();
            landed = running(&process);
            if let Some(process) = process {
                if matches!(step.fault, Fault::RelayKill9 { .. }) {
                    process.kill9();
                } else {
                    process.sigterm();
                    let _ = process.wait_exit(lasts).await;
                    process.kill9();
                }
            }
            tokio::time::sleep(lasts).await;
            world.start_relay(i);
        }
        Fault::ConsumerKill9 { consumer } => {
            // Killed wherever it is, then once more exactly between an effect's COMMIT and
            // the message's ack (the inbox's after-commit failpoint, within its first
            // messages): the redelivered message must find its effect already applied.
            let process = world.consumers[consumer].lock().unwrap().process.take();
            landed = running(&process);
            if let Some(process) = process {
                process.kill9();
            }
            tokio::time::sleep(lasts).await;
            let hit = format!("after-commit=abort@{}", 1 + step.at.as_millis() % 20);
            world.start_consumer_with(consumer, &[("OUTBOX_INBOX_FAILPOINTS", &hit)]);
            let armed = world.consumers[consumer].lock().unwrap().process.take();
            if let Some(armed) = armed {
                let aborted = armed.wait_exit(AT_COMMIT_WITHIN).await.is_some();
                armed.kill9();
                world
                    .consumer_aborts_at_commit
                    .fetch_add(usize::from(aborted), Ordering::Relaxed);
            }
            world.start_consumer(consumer);
        }
        Fault::PgRestart => {
            let pair = world.pair.read().await;
            blocking(|| pair.primary.stop_immediate());
            let from = persisted_confirmed_flush(&pair.primary, &world.outbox.slot);
            tokio::time::sleep(lasts).await;
            blocking(|| pair.primary.start_again());
            let to = wal_end_after(&pair.primary.url("postgres")).await;
            rewind = Some(Rewind { from, to });
        }
        Fault::PgPrimaryCrash | Fault::PgSwitchover => {
            let crash = matches!(step.fault, Fault::PgPrimaryCrash);
            let mut pair = world.pair.write().await;
            // An HA manager promotes only a standby whose copy of the slot would survive it.
            let ready = pair
                .wait_failover_ready(&world.outbox.slot, PROMOTION_WAITS)
                .await;
            ready.unwrap_or_else(|e| panic!("nemesis, before {}: {e}", step.fault));
            if crash {
                blocking(|| pair.primary.stop_immediate());
            } else {
                blocking(|| pair.primary.stop());
            }
            // The primary is gone: the standby's copy no longer moves.
            let copy = pair.standby_copy(&world.outbox.slot).await;
            let from = copy.and_then(|c| c.confirmed_flush).unwrap_or_else(|| {
                panic!(
                    "nemesis, {}: the standby has no copy of the slot",
                    step.fault
                )
            });
            tokio::time::sleep(lasts).await;
            pair.fail_over(&world.db).await;
            let to = wal_end_after(&pair.primary.url("postgres")).await;
            rewind = Some(Rewind { from, to });
            let how = if crash {
                Rejoin::Rebuilt
            } else {
                Rejoin::AsItIs
            };
            let rejoined = blocking(|| pair.rejoin(how, &world.outbox.slot, PROMOTION_WAITS));
            let took = rejoined.unwrap_or_else(|e| panic!("nemesis, {}: {e}", step.fault));
            println!(
                "nemesis: {} healed: the old primary rejoined ({how:?}) in {}",
                step.fault,
                secs(took)
            );
        }
        Fault::RabbitKill9 { node } => {
            blocking(|| lab.cluster.kill9(node));
            tokio::time::sleep(lasts).await;
            blocking(|| lab.cluster.restart(node));
        }
        Fault::RabbitPause { node } => {
            lab.cluster.pause(node);
            tokio::time::sleep(lasts).await;
            lab.cluster.resume(node);
        }
        Fault::RabbitMemoryAlarm { node } => {
            let set = |watermark: &str| {
                let out = blocking(|| {
                    lab.cluster
                        .ctl(node, &["set_vm_memory_high_watermark", watermark])
                });
                assert!(
                    out.status.success(),
                    "set_vm_memory_high_watermark {watermark} on node {node}: {out:?}"
                );
            };
            set("0.0000001");
            tokio::time::sleep(lasts).await;
            set("0.4");
        }
        Fault::PartitionMinority { node } => {
            let others: Vec<&common::netns::Host> = (0..lab.cluster.len())
                .filter(|&i| i != node)
                .map(|i| lab.rabbit_host(i))
                .collect();
            let cut = lab.net.partition(&[lab.rabbit_host(node)], &others);
            tokio::time::sleep(lasts).await;
            cut.heal();
        }
        Fault::PartitionOneWay { from, to } => {
            let (from, to) = (world.lab_host(from).await, world.lab_host(to).await);
            let cut = lab.net.cut(&[from], &[to]);
            tokio::time::sleep(lasts).await;
            cut.heal();
        }
        Fault::PartitionFlapping { hosts, every } => {
            let (a, b) = (world.lab_host(hosts.0).await, world.lab_host(hosts.1).await);
            let until = Instant::now() + lasts;
            while Instant::now() < until {
                let cut = lab.net.partition(&[a], &[b]);
                tokio::time::sleep(every).await;
                cut.heal();
                tokio::time::sleep(every).await;
            }
        }
        Fault::HostVanish { host } => {
            let gone = lab.net.vanish(world.lab_host(host).await);
            tokio::time::sleep(lasts).await;
            gone.heal();
        }
        Fault::UndeclaredExchange => {
            // The application routes rows to an exchange the relays may use and nobody
            // declared; the relay must wait at the first one, acknowledging nothing from it.
            let n = world.undeclared.fetch_add(1, Ordering::Relaxed);
            let exchange = format!("{}{n}", world.undeclared_prefix);
            let to = WriteTo {
                exchange: Some(exchange.clone()),
                ..WriteTo::default()
            };
            let url = writers_url(&world.relay_url);
            let writer =
                Writers::start_noting_positions_to(&url, &to, 1, MAX_TXN_ROWS, WRITE_PAUSE);
            tokio::time::sleep(lasts).await;
            // A PostgreSQL fault may have kept every commit off so far (seed 42's tenth
            // minute: 4 s inside a vanished primary, no row held): the fault is a held row,
            // so it lasts until there is one.
            writer.wait_committed(1, 2 * PROMOTION_WAITS).await;
            let held = writer.stop_with_commits().await;
            assert_not_acknowledged(&world, &held, &step).await;
            let node = declare_and_bind(&world, &exchange).await;
            println!(
                "nemesis: {} healed: {} rows held, {exchange} declared and bound through \
                 node {node}",
                step.fault,
                held.iter().map(|c| c.ids.len()).sum::<usize>()
            );
        }
        Fault::TableRename => {
            // The application writes to the table under its new name; the relays stop
            // before acknowledging a row of it, and renamed back it all arrives.
            let url = writers_url(&world.relay_url);
            let rename = |from: &str, to: &str| format!("ALTER TABLE {from} RENAME TO {to}");
            let ddl = connect_retrying(&url, PROMOTION_WAITS).await;
            ddl.batch_execute(&rename("outbox", RENAMED_TABLE))
                .await
                .unwrap_or_else(|e| panic!("nemesis, {}: rename: {e}", step.fault));
            let to = WriteTo {
                table: RENAMED_TABLE.into(),
                exchange: None,
            };
            let writer =
                Writers::start_noting_positions_to(&url, &to, 1, MAX_TXN_ROWS, WRITE_PAUSE);
            tokio::time::sleep(lasts).await;
            // Rows under the new name are what stops the relays (as for a held row above).
            writer.wait_committed(1, 2 * PROMOTION_WAITS).await;
            let renamed = writer.stop_with_commits().await;
            let stopped = if renamed.is_empty() {
                // Nothing under the new name: nothing stops them (they warn and wait).
                Vec::new()
            } else {
                relays_stopped(&world, &step).await
            };
            assert_not_acknowledged(&world, &renamed, &step).await;
            let ddl = connect_retrying(&url, PROMOTION_WAITS).await;
            ddl.batch_execute(&rename(RENAMED_TABLE, "outbox"))
                .await
                .unwrap_or_else(|e| panic!("nemesis, {}: rename back: {e}", step.fault));
            restart_relays(&world).await;
            println!(
                "nemesis: {} healed: {} rows written under the new name; stopped: {}",
                step.fault,
                renamed.iter().map(|c| c.ids.len()).sum::<usize>(),
                stopped.join("; ")
            );
        }
    }
    let healed = SystemTime::now();
    // What an operator does: a node the fault left paused past its settle time (the plan's
    // "recovered") is restarted. Seed 42's hour, 2026-12-04: a node cut off as the minority
    // was still paused 89 s after the heal, and the next fault on it (a memory alarm) could
    // not run.
    for node in step.fault.may_leave_paused() {
        let settle = step.fault.kind().settle();
        if blocking(|| lab.cluster.repair_if_stuck(node, settle)) {
            println!(
                "nemesis: {}: node {node} still paused {} after the heal; restarted it",
                step.fault,
                secs(settle)
            );
        }
    }
    Ran {
        step,
        late,
        began,
        healed,
        recovered: SystemTime::now(),
        rewind,
        landed,
    }
}

/// The ACK oracle while a row is held (`step`'s rows, by `commits`, in commit order): the
/// slot, read on the primary, has not passed the first of them that the primary has (a
/// failover may have lost the first ones; the relay never saw those). Each commit ended at
/// or before its noted position, so a slot at or past it acknowledged that commit.
async fn assert_not_acknowledged(world: &World, commits: &[Commit], step: &Step) {
    if commits.is_empty() {
        return;
    }
    let url = writers_url(&world.relay_url);
    let what = format!("at the heal of {}", step.fault);
    let ids: Vec<&str> = commits
        .iter()
        .flat_map(|c| &c.ids)
        .map(String::as_str)
        .collect();
    let (ids, slot_name) = (&ids, &world.outbox.slot);
    let (kept, confirmed) = ask_until(&url, 2 * PROMOTION_WAITS, &what, |client| async move {
        let kept = client
            .query(
                "SELECT id::text FROM outbox_written WHERE id = ANY($1::text[]::uuid[])",
                &[ids],
            )
            .await
            .ok()?;
        let kept: std::collections::HashSet<String> = kept.iter().map(|r| r.get(0)).collect();
        let confirmed = common::pg::try_slot_confirmed_flush(&client, slot_name)
            .await
            .ok()??;
        Some((kept, confirmed))
    })
    .await;
    let first = commits
        .iter()
        .find(|c| c.ids.iter().any(|id| kept.contains(id)));
    let Some(Commit {
        ids,
        ended_by: Some(ended_by),
    }) = first
    else {
        return;
    };
    assert!(
        confirmed < *ended_by,
        "nemesis, {}: the slot was acknowledged to {} at the heal, at or past the commit of \
         row {} (ended by {}), which no relay could deliver; relay logs:\n{}",
        step.fault,
        common::pg::format_lsn(confirmed),
        ids[0],
        common::pg::format_lsn(*ended_by),
        relay_logs(world)
    );
}

/// Declares the `exchange` rows were routed to and binds the campaign's queues to it, through
/// whichever node answers first (at most one node is impaired at a time); returns that node.
async fn declare_and_bind(world: &World, exchange: &str) -> usize {
    let cluster = &world.lab.cluster;
    let deadline = Instant::now() + PROMOTION_WAITS;
    let mut failures = Vec::new();
    for node in (0..cluster.len()).cycle() {
        let url = cluster.url(node);
        let queues = world.queues();
        match try_declare_and_bind(&url, exchange, &queues, "#", DECLARE_ATTEMPT).await {
            Ok(()) => return node,
            Err(e) => failures.push(format!("node {node}: {e}")),
        }
        assert!(
            Instant::now() < deadline,
            "nemesis: no node declared exchange {exchange} within {}: {failures:?}",
            secs(PROMOTION_WAITS)
        );
    }
    unreachable!("a cycle over the nodes ends by a return or the deadline's panic")
}

/// Waits for both relays to exit (a renamed table stops each) and returns how each ended.
async fn relays_stopped(world: &World, step: &Step) -> Vec<String> {
    let deadline = Instant::now() + RELAYS_STOP_WITHIN;
    let mut stopped = Vec::new();
    for (i, slot) in world.relays.iter().enumerate() {
        let process = slot.lock().unwrap().process.take();
        let Some(process) = process else {
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let exited = process.wait_exit(left).await;
        let log = process.log();
        // Back in its slot: its log stays in the reports until it is started again.
        slot.lock().unwrap().process = Some(process);
        let Some(status) = exited else {
            panic!(
                "nemesis, {}: relay {i} still runs {} after the heal began, with the outbox \
                 table renamed; its log:\n{log}",
                step.fault,
                secs(RELAYS_STOP_WITHIN)
            );
        };
        let error = common::relay::final_error(&log).unwrap_or("no final error");
        stopped.push(format!("relay {i} ({status}): {error}"));
    }
    stopped
}

/// Starts every relay again, stopping first any that still runs (SIGTERM, as an operator's
/// restart does).
async fn restart_relays(world: &World) {
    for i in 0..world.relays.len() {
        let process = world.relays[i].lock().unwrap().process.take();
        if let Some(process) = process {
            process.sigterm();
            let _ = process.wait_exit(PEER_TIMEOUT).await;
            process.kill9();
        }
        world.start_relay(i);
    }
}

fn campaign_minutes() -> f64 {
    match std::env::var("OUTBOX_NEMESIS_MINUTES") {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("OUTBOX_NEMESIS_MINUTES={text:?}: not a number")),
        Err(_) => DEFAULT_MINUTES,
    }
}

/// The newest pinned major version with failover slots, or `OUTBOX_TEST_PG_MAJOR` if 17+.
fn campaign_major() -> u32 {
    let asked = common::pg::pg_major();
    if asked >= common::failover::FIRST_FAILOVER_MAJOR {
        return asked;
    }
    common::pg::supported_majors()
        .into_iter()
        .filter(|&m| m >= common::failover::FIRST_FAILOVER_MAJOR)
        .min()
        .expect("a pinned PostgreSQL 17+ (crates/outbox-testkit/postgres-versions)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "campaigns on the partition lab: scripts/test.sh runs a short one with the partitions, or a long one with --nemesis MINUTES"]
async fn a_seeded_campaign_of_mixed_faults_loses_nothing_and_applies_each_effect_once() {
    campaigns(Destination::Queues).await;
}

/// The campaign with the relays delivering into a stream: its oracle is exactly once. The
/// stream, read whole at the end, holds every row of the final primary once, each writer's
/// rows in the order it committed them, and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "campaigns on the partition lab: scripts/test.sh runs a short one with the partitions, or a long one with --nemesis MINUTES"]
async fn a_seeded_campaign_of_mixed_faults_into_a_stream_stores_each_row_once_in_commit_order() {
    campaigns(Destination::Stream).await;
}

/// The campaigns of `OUTBOX_NEMESIS_SEED`, one after the other, into `destination`.
async fn campaigns(destination: Destination) {
    let seeds = Seed::list_from_env().unwrap_or_else(|e| panic!("{e}"));
    let minutes = campaign_minutes();
    let (lab, _lock) = exclusive().await;
    for seed in seeds {
        campaign(lab, seed, minutes, destination).await;
    }
}

/// One campaign of `minutes` from `seed`, on the lab, with its oracles and figures.
/// Takes ACK readings until `stop`: every [`ACK_READING_EVERY`], the slot's
/// confirmed_flush_lsn on the primary, then a marker published into the test's queue through
/// the next broker node. A reading whose slot read or marker did not make it in
/// [`ACK_READING_WITHIN`] (a fault in the way) is dropped. The readings, each its marker's id
/// and the position read ([`acks_before_markers`] checks them at the end); and every
/// position read, with when it was read (where each fault's [`ReplayWindow`] begins).
async fn take_ack_readings(world: Arc<World>, stop: Arc<AtomicBool>) -> AckReadings {
    let mut readings = AckReadings::default();
    let mut attempt = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(ACK_READING_EVERY).await;
        attempt += 1;
        let url = world.pair.read().await.primary.url(&world.db);
        let slot = &world.outbox.slot;
        let read = ask_once(&url, ACK_READING_WITHIN, |client| async move {
            common::pg::try_slot_confirmed_flush(&client, slot)
                .await
                .ok()
                .flatten()
        });
        let Some(confirmed) = read.await else {
            continue;
        };
        readings.positions.push((SystemTime::now(), confirmed));
        let marker = format!("{MARKER_PREFIX}ack-{attempt}");
        let node = world.lab.cluster.url(attempt % world.lab.cluster.len());
        let queue = &world.outbox.queue;
        if try_publish_into(&node, queue, &marker, ACK_READING_WITHIN).await {
            readings.markers.push((marker, confirmed));
        }
    }
    readings
}

async fn campaign(lab: &'static Lab, seed: Seed, minutes: f64, destination: Destination) {
    let plan = Plan::new(seed, Duration::from_secs_f64(minutes * 60.0));
    let topology = match destination {
        Destination::Queues => Topology::default(),
        Destination::Stream => Topology::stream(),
    };
    let schedule = Schedule::generate(plan, topology);
    println!("nemesis into {destination:?}: {minutes} min\n{schedule}");

    let _pair_hosts = blocking(|| lab.lock_pg_pair());
    let began = Instant::now();
    let repairs_before = lab.cluster.repairs();
    let major = campaign_major();
    let pair = blocking(|| {
        FailoverPair::start_on(lab.pg_pair_hosts(), major, PairOptions::default(), &[])
    });
    let mut outbox = pair.outbox(&lab.cluster.url(1), "nemesis").await;
    outbox
        .client
        .batch_execute(WRITTEN_SQL)
        .await
        .expect("the written-rows table and its trigger");
    let db = outbox.database().to_string();
    let relay_url = pair.multi_host_url(&db);
    // Rows of an undeclared-exchange fault name `<exchange>.undeclared.<n>`, which the relays
    // may route to; nothing declares one before its fault's heal.
    let undeclared_prefix = format!("{}.undeclared.", outbox.exchange);
    let mut relay_flags: Vec<String> = CLEANUP_FLAGS.iter().map(|f| f.to_string()).collect();
    delete_queue(&outbox.amqp_url, &outbox.queue).await;
    let (consumer_queue, effects_db) = match destination {
        Destination::Queues => {
            // Two quorum queues on the outbox's exchange, led by different nodes: the
            // consumers' and the test's (read at the end only, so no fault can cut the test
            // off from it).
            let consumer_queue = format!("{}_fx", outbox.queue);
            let tally_queue = format!("{}_tally", outbox.queue);
            for (queue, node) in [(&consumer_queue, 0), (&tally_queue, 2)] {
                let url = lab.cluster.url(node);
                let arguments = quorum_queue_arguments();
                declare_bound_queue_with_args(&url, &outbox.exchange, queue, "#", arguments).await;
            }
            outbox.queue = tally_queue;
            relay_flags.extend([
                "--allowed-exchanges".into(),
                format!("{undeclared_prefix}*"),
            ]);
            let effects = effects_database(lab, "nemesis_fx").await;
            (consumer_queue, Some(effects))
        }
        Destination::Stream => {
            // The test's markers reach the stream the way they reach a queue: published to
            // it by name over AMQP.
            outbox.queue = format!("{}_stream", outbox.queue);
            create_stream(lab, &outbox.queue).await;
            relay_flags.extend([
                "--stream".into(),
                outbox.queue.clone(),
                "--stream-port".into(),
                lab.cluster.stream_port(0).to_string(),
            ]);
            (String::new(), None)
        }
    };
    let (effects_url, effects_client) = match effects_db {
        Some((url, client)) => (url, Some(client)),
        None => (String::new(), None),
    };
    let world = Arc::new(World {
        lab,
        pair: tokio::sync::RwLock::new(pair),
        db,
        relay_url,
        brokers: lab.cluster.url_list(),
        effects_url,
        consumer_queue,
        relay_flags,
        undeclared_prefix,
        undeclared: AtomicUsize::new(0),
        relays: (0..RELAY_HOSTS.len())
            .map(|_| {
                Mutex::new(Slot {
                    process: None,
                    metrics: None,
                })
            })
            .collect(),
        consumers: (0..CONSUMER_HOSTS.len())
            .map(|_| {
                Mutex::new(Slot {
                    process: None,
                    metrics: None,
                })
            })
            .collect(),
        consumer_aborts_at_commit: AtomicUsize::new(0),
        outbox,
    });
    for i in 0..RELAY_HOSTS.len() {
        world.start_relay(i);
    }
    for j in 0..topology.consumers {
        world.start_consumer(j);
    }
    let ready = world
        .pair
        .read()
        .await
        .wait_failover_ready(&world.outbox.slot, MINUTE)
        .await;
    ready.unwrap_or_else(|e| panic!("nemesis: {e}"));
    let writers = Writers::start_noting_positions(
        &writers_url(&world.relay_url),
        WRITERS,
        MAX_TXN_ROWS,
        WRITE_PAUSE,
    );
    match &effects_client {
        Some(effects_client) => {
            let sql = "SELECT count(*) FROM effect";
            let applied = wait_count(effects_client, sql, MINUTE, |n| n >= 200);
            assert!(
                applied.await.is_ok(),
                "nemesis: effects are applied before the first fault"
            );
        }
        None => acknowledged_before_faults(&world, &writers).await,
    }
    let setup_took = began.elapsed();

    // ACK while the faults run, read every few seconds and checked at the end.
    let readings_stop = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn(take_ack_readings(world.clone(), readings_stop.clone()));
    let skips_stop = Arc::new(AtomicBool::new(false));
    let skips = tokio::spawn(watch_skips(world.clone(), skips_stop.clone()));

    // The campaign: every step on a task of its own, overlapping as scheduled.
    let started = Instant::now();
    let tasks: Vec<_> = schedule
        .steps
        .iter()
        .map(|&step| tokio::spawn(run_step(world.clone(), started, step)))
        .collect();
    let mut ran = Vec::new();
    for task in tasks {
        ran.push(
            task.await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
        );
    }
    readings_stop.store(true, Ordering::Relaxed);
    // The premise of every oracle below: each kind the schedule drew acted at least once (a
    // kill or a SIGTERM finds a running process unless another fault has it down).
    let missed: Vec<String> = ran
        .iter()
        .filter(|r| !r.landed)
        .map(|r| r.step.to_string())
        .collect();
    let never: Vec<FaultKind> = schedule
        .counts()
        .into_iter()
        .filter(|&(_, scheduled)| scheduled > 0)
        .map(|(kind, _)| kind)
        .filter(|&kind| !ran.iter().any(|r| r.landed && r.step.fault.kind() == kind))
        .collect();
    assert!(
        never.is_empty(),
        "nemesis ({seed}): no fault of kind {never:?} found its target (steps that did not: \
         {missed:?}); relay logs:\n{}",
        relay_logs(&world)
    );
    let readings = reader
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let last_heal = ran
        .iter()
        .map(|r| r.healed)
        .max()
        .unwrap_or_else(SystemTime::now);
    let healed_at = Instant::now();

    // Ready again: a relay answers /readyz 200 (a majority of nodes is enough for that; the
    // kit makes the cluster whole after, which may take a paused node's restart).
    let ready_again = async {
        loop {
            for slot in &world.relays {
                let at = slot.lock().unwrap().metrics;
                if let Some(at) = at {
                    let ok = |(status, _): &(u16, String)| *status == 200;
                    if wait_http(at, "/readyz", Duration::from_secs(1), ok)
                        .await
                        .is_some()
                    {
                        return healed_at.elapsed();
                    }
                }
            }
            assert!(
                healed_at.elapsed() < READY_WITHIN,
                "nemesis ({seed}): no relay ready {} after the last fault; relay logs:\n{}",
                secs(READY_WITHIN),
                relay_logs(&world)
            );
        }
    };
    let ready_after = ready_again.await;
    assert!(
        ready_after <= READY_WITHIN,
        "nemesis ({seed}): a relay was ready only {} after the last fault (bound {})",
        secs(ready_after),
        secs(READY_WITHIN)
    );
    let repairs = lab.cluster.repairs();
    blocking(|| lab.cluster.ensure_healthy());
    if lab.cluster.repairs() > repairs {
        // Nodes still paused at the end, restarted now: the latest fault that can leave a
        // node paused did, and the restart can make the relays deliver again what was
        // written up to now.
        if let Some(last) = ran
            .iter_mut()
            .filter(|r| !r.step.fault.may_leave_paused().is_empty())
            .max_by_key(|r| r.began)
        {
            last.recovered = SystemTime::now();
        }
    }
    tokio::time::sleep(common::nemesis::QUIET).await;
    let by_writer = writers.stop_with_commits_by_writer().await;
    let commits: Vec<Commit> = by_writer.iter().flatten().cloned().collect();

    // The final primary's rows are the truth (a commit in doubt during a fault may or may
    // not have happened): each has its effect exactly once, nothing else has one.
    let primary_url = world.pair.read().await.primary.url(&world.db);
    let primary = pg_connect(&primary_url).await;
    let rows = first_column(&primary, "SELECT id::text FROM outbox_written", &[]).await;
    let Some(effects_client) = effects_client else {
        let campaigned = Campaigned {
            seed,
            major,
            minutes,
            ran,
            missed: missed.len(),
            readings,
            by_writer,
            rows,
            primary,
            ready_after,
            setup_took,
            skips: (skips_stop, skips),
            repairs: lab.cluster.repairs() - repairs_before,
        };
        return judge_stream(world, campaigned).await;
    };
    // The watcher holds a handle on the world, which the queue's oracles take whole below.
    skips_stop.store(true, Ordering::Relaxed);
    skips
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let every = rows.len() as i64;
    let sql = "SELECT count(DISTINCT message_id) FROM effect";
    let applied = wait_count(&effects_client, sql, APPLIED_WITHIN, |n| n >= every).await;
    assert!(
        applied.is_ok(),
        "nemesis ({seed}): {applied:?} of {every} rows have their effect {} after the last \
         fault; relay logs:\n{}",
        secs(APPLIED_WITHIN),
        relay_logs(&world)
    );
    let effects = effects(&effects_client).await;
    let twice: Vec<&String> = effects
        .iter()
        .filter(|(_, (n, _))| *n > 1)
        .map(|(id, _)| id)
        .collect();
    assert!(
        twice.is_empty(),
        "nemesis ({seed}): effects applied twice: {twice:?}"
    );
    let wanted: std::collections::HashSet<&str> = rows.iter().map(String::as_str).collect();
    let phantoms: Vec<&String> = effects
        .keys()
        .filter(|id| !wanted.contains(id.as_str()))
        .collect();
    assert!(
        phantoms.is_empty(),
        "nemesis ({seed}): effects of messages whose rows the final primary lacks: {:?}",
        &phantoms[..phantoms.len().min(5)]
    );

    // The test's queue: every row, nothing invented, repeats within the bound; ACK once the
    // relays are stopped.
    stop_relays(&world).await;
    for slot in &world.consumers {
        let process = slot.lock().unwrap().process.take();
        if let Some(process) = process {
            process.kill9();
        }
    }
    let world = Arc::try_unwrap(world).unwrap_or_else(|_| panic!("every step has ended"));
    let aborts_at_commit = world.consumer_aborts_at_commit.load(Ordering::Relaxed);
    let mut outbox = world.outbox;
    outbox.amqp_url = lab.cluster.url(2);
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    // An hour's queue holds some 360,000 messages: read them first, so that the ACK check's
    // barrier waits only for what follows them.
    consumer.wait_for(rows.len(), DRAIN_WITHIN).await;
    let on_primary: std::collections::HashSet<&str> = rows.iter().map(String::as_str).collect();
    let kinds: Vec<FaultKind> = ran.iter().map(|r| r.step.fault.kind()).collect();
    let crashes = kinds.iter().filter(|k| k.can_lose_commits()).count();
    let (surviving, vanished) = surviving_commits(&commits, &on_primary, &kinds)
        .unwrap_or_else(|e| panic!("nemesis ({seed}): {e}"));
    let ack = check_ack_of_commits(&primary, &outbox, &surviving, &mut consumer).await;
    // The barrier above is behind every marker: each reading's marker has arrived, if ever.
    let arrivals: Vec<&str> = consumer
        .received()
        .iter()
        .filter_map(|r| r.message_id.as_deref())
        .collect();
    let readings_checked = acks_before_markers(&surviving, &arrivals, &readings.markers)
        .unwrap_or_else(|violation| {
            panic!(
                "nemesis ({seed}): {violation} but arrived after the marker published once the \
                 slot was read so, while the faults ran"
            )
        });
    let tally = Tally::of(consumer.received());
    common::faults::assert_nothing_lost_or_invented(&tally, &rows);

    // DUP: each repeat lies in the window of a fault that can make the relays deliver it
    // again, and no row repeats more often than those faults can replay it.
    let created: HashMap<String, SystemTime> = primary
        .query("SELECT id::text, created_at FROM outbox_written", &[])
        .await
        .expect("read the outbox")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let ended_by: HashMap<&str, Option<u64>> = commits
        .iter()
        .flat_map(|c| c.ids.iter().map(move |id| (id.as_str(), c.ended_by)))
        .collect();
    // A row on the primary whose writer saw its commit fail (in doubt) has no noted end.
    let rows_at: HashMap<&str, RowAt> = created
        .iter()
        .map(|(id, at)| {
            let end = ended_by.get(id.as_str()).copied().flatten();
            (id.as_str(), (end, *at))
        })
        .collect();
    let windows: Vec<ReplayWindow> = ran
        .iter()
        .map(|r| ReplayWindow::of(r, &readings.positions))
        .collect();
    let repeats = repeats_by_fault(&tally.counts, &rows_at, &windows)
        .unwrap_or_else(|e| panic!("nemesis ({seed}): DUP: {e}"));
    // What each kind's faults could have delivered again, for the report: rows held x replays.
    let mut replayable: BTreeMap<FaultKind, usize> = BTreeMap::new();
    for w in &windows {
        let held = rows_at
            .values()
            .filter(|(end, at)| w.holds(*end, *at))
            .count();
        *replayable.entry(w.kind).or_default() += held * w.replays;
    }
    let rewound: usize = ran
        .iter()
        .filter_map(|r| r.rewind)
        .map(|w| w.rows(&commits))
        .sum();

    // Per kind: how many, and the worst time from a fault's heal until a row committed after
    // it had its effect.
    let applied_at: HashMap<String, SystemTime> = effects_client
        .query(
            "SELECT message_id, min(applied_at) FROM effect GROUP BY 1",
            &[],
        )
        .await
        .expect("read the effects")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // Per kind: how many, the worst time from a heal until a row committed after it had its
    // effect, and the worst commit-to-effect time of a row committed while such a fault
    // lasted (the stall it caused).
    let latency = |id: &String, at: &SystemTime| {
        let applied = applied_at.get(id)?;
        applied.duration_since(*at).ok()
    };
    let mut by_kind: BTreeMap<FaultKind, Figures> = BTreeMap::new();
    for r in &ran {
        let again = created
            .iter()
            .filter(|(_, at)| **at >= r.healed)
            .filter_map(|(id, _)| applied_at.get(id))
            .min()
            .and_then(|at| at.duration_since(r.healed).ok())
            .unwrap_or_default();
        let stall = created
            .iter()
            .filter(|(_, at)| **at >= r.began && **at <= r.healed)
            .filter_map(|(id, at)| latency(id, at))
            .max()
            .unwrap_or_default();
        let entry = by_kind.entry(r.step.fault.kind()).or_default();
        entry.count += 1;
        entry.taken_back += r.rewind.map_or(0, |w| w.rows(&commits));
        entry.again = entry.again.max(again);
        entry.stall = entry.stall.max(stall);
    }
    let worst_latency = created
        .iter()
        .filter_map(|(id, at)| latency(id, at))
        .max()
        .unwrap_or_default();
    let worst_late = ran.iter().map(|r| r.late).max().unwrap_or_default();
    let after_last: Duration = applied_at
        .values()
        .filter_map(|at| at.duration_since(last_heal).ok())
        .min()
        .unwrap_or_default();
    report(
        "n1 nemesis campaign",
        &[
            ("seed", seed.to_string()),
            ("PostgreSQL", major.to_string()),
            ("minutes", format!("{minutes}")),
            ("faults", ran.len().to_string()),
            (
                "faults that found no running target",
                missed.len().to_string(),
            ),
            ("rows", rows.len().to_string()),
            ("lost", "0".into()),
            ("effects applied twice", "0".into()),
            (
                "repeats in the test's queue",
                tally.duplicates().to_string(),
            ),
            (
                "deliveries again the faults could make (rows held x replays)",
                replayable.values().sum::<usize>().to_string(),
            ),
            ("rows PostgreSQL stops took back", rewound.to_string()),
            (
                "commits the writers saw succeed that the final primary lacks",
                format!("{} (primary crashes: {crashes})", vanished.len()),
            ),
            ("last heal to a relay ready", secs(ready_after)),
            ("last heal to an effect applied", secs(after_last)),
            (
                "acknowledged rows checked",
                ack.acknowledged_rows.to_string(),
            ),
            (
                "ACK readings while the faults ran, checked",
                format!("{readings_checked} of {}", readings.markers.len()),
            ),
            ("worst commit to effect", secs(worst_latency)),
            ("latest fault start late by", secs(worst_late)),
            ("setup", secs(setup_took)),
            ("peer timeout", secs(PEER_TIMEOUT)),
            (
                "consumers aborted at a commit",
                aborts_at_commit.to_string(),
            ),
            (
                "paused nodes restarted after a heal",
                (lab.cluster.repairs() - repairs_before).to_string(),
            ),
        ],
    );
    for (kind, figures) in &by_kind {
        println!(
            "FIGURES n1 nemesis {}: count {}, worst heal to delivering again {}, worst \
             commit to effect of a row committed during it {}, repeats attributed {} (could \
             deliver again: {}, rows taken back: {})",
            kind.name(),
            figures.count,
            secs(figures.again),
            secs(figures.stall),
            repeats.get(kind).copied().unwrap_or(0),
            replayable.get(kind).copied().unwrap_or(0),
            figures.taken_back
        );
    }
}

/// Creates `stream` through node 0, replicated on the three nodes (the broker's default).
async fn create_stream(lab: &Lab, stream: &str) {
    let port = lab.cluster.stream_port(0);
    let environment = crate::streams::environment_at(&lab.cluster.addr(0).to_string(), port).await;
    environment
        .stream_creator()
        .create(stream)
        .await
        .unwrap_or_else(|e| panic!("nemesis: create the stream {stream}: {e:?}"));
}

/// The stream campaign's start: 200 rows committed and acknowledged (the slot past them),
/// so the relays deliver before the first fault.
async fn acknowledged_before_faults(world: &World, writers: &Writers) {
    assert!(
        writers.wait_committed(200, MINUTE).await,
        "nemesis: the writers committed 200 rows within a minute"
    );
    let primary = pg_connect(&world.pair.read().await.primary.url(&world.db)).await;
    let written = common::pg::current_wal_lsn(&primary).await;
    let slot = &world.outbox.slot;
    if let Err(at) = wait_slot_confirmed_flush(&primary, slot, written, MINUTE).await {
        panic!(
            "nemesis: the slot is at {} a minute after 200 rows, short of {}; relay logs:\n{}",
            common::pg::format_lsn(at),
            common::pg::format_lsn(written),
            relay_logs(world)
        );
    }
}

/// The rows the stream campaign's relays read again and did not send, because the stream
/// held them: each relay process's `outbox_relay_stream_skipped_total`, read every second
/// until `stop`, summed over the processes (by their metrics address; what a process
/// skipped after its last reading, before a kill, goes uncounted).
async fn watch_skips(world: Arc<World>, stop: Arc<AtomicBool>) -> usize {
    let mut latest: HashMap<SocketAddrV4, usize> = HashMap::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        for slot in &world.relays {
            let at = slot.lock().unwrap().metrics;
            let Some(at) = at else {
                continue;
            };
            let Some((200, page)) = http_get(at, "/metrics").await else {
                continue;
            };
            if let Some(skipped) = metric_sum(&page, STREAM_SKIPPED_TOTAL) {
                latest.insert(at, skipped as usize);
            }
        }
        if stopping {
            return latest.values().sum();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Stops the relays that run (SIGTERM, then what `stop` does).
async fn stop_relays(world: &World) {
    for slot in &world.relays {
        let process = slot.lock().unwrap().process.take();
        if let Some(process) = process {
            process.stop().await;
        }
    }
}

/// What a campaign hands its stream oracles.
struct Campaigned {
    seed: Seed,
    major: u32,
    minutes: f64,
    ran: Vec<Ran>,
    /// Steps that found no running target.
    missed: usize,
    readings: AckReadings,
    /// Each main writer's commits, in its order.
    by_writer: Vec<Vec<Commit>>,
    /// The final primary's rows.
    rows: Vec<String>,
    primary: tokio_postgres::Client,
    ready_after: Duration,
    setup_took: Duration,
    /// [`watch_skips`]: its stop and its task.
    skips: (Arc<AtomicBool>, tokio::task::JoinHandle<usize>),
    /// Paused nodes restarted after a heal.
    repairs: usize,
}

/// The stream campaign's oracles, once every fault has healed: the slot reaches the final
/// primary's WAL end (every row acknowledged), the relays stop, and the stream, read whole
/// from offset 0, holds every row of the final primary exactly once and nothing else; each
/// writer's rows in the order it committed them; every acknowledged commit (ACK, at the end
/// and at the readings taken while the faults ran).
async fn judge_stream(world: Arc<World>, run: Campaigned) {
    let (lab, seed) = (world.lab, run.seed);
    let slot = &world.outbox.slot;
    let end = common::pg::current_wal_lsn(&run.primary).await;
    if let Err(at) = wait_slot_confirmed_flush(&run.primary, slot, end, APPLIED_WITHIN).await {
        panic!(
            "nemesis ({seed}): the slot is at {} {} after the last fault, short of the WAL end \
             {}; relay logs:\n{}",
            common::pg::format_lsn(at),
            secs(APPLIED_WITHIN),
            common::pg::format_lsn(end),
            relay_logs(&world)
        );
    }
    let (skips_stop, skips) = run.skips;
    skips_stop.store(true, Ordering::Relaxed);
    let skipped = skips
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    stop_relays(&world).await;
    let confirmed = common::pg::try_slot_confirmed_flush(&run.primary, slot)
        .await
        .expect("read the slot")
        .expect("the slot has a position");

    let node = lab.cluster.addr(2).to_string();
    let environment = crate::streams::environment_at(&node, lab.cluster.stream_port(2)).await;
    let messages = crate::streams::read_messages(&environment, &world.outbox.queue).await;
    let arrivals: Vec<&str> = messages
        .iter()
        .enumerate()
        .map(|(at, (id, _))| {
            id.as_deref().unwrap_or_else(|| {
                panic!("nemesis ({seed}): the stream's message {at} has no message_id")
            })
        })
        .collect();
    let tally = Tally::of_ids(arrivals.iter().copied());
    common::faults::assert_nothing_lost_or_invented(&tally, &run.rows);
    let mut twice: Vec<(&String, &usize)> = tally.counts.iter().filter(|(_, n)| **n > 1).collect();
    twice.sort();
    assert!(
        twice.is_empty(),
        "nemesis ({seed}): exactly once: {} rows are in the stream more than once ({} copies \
         too many), e.g. {:?}",
        twice.len(),
        tally.duplicates(),
        &twice[..twice.len().min(5)]
    );
    // Each writer's commits went in one after the other: their rows, in that order.
    let position: HashMap<&str, usize> = arrivals
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, i))
        .collect();
    for (writer, commits) in run.by_writer.iter().enumerate() {
        let mut previous: Option<(&str, usize)> = None;
        // A commit the final primary lacks is in no position (surviving_commits judges it).
        for id in commits.iter().flat_map(|c| &c.ids) {
            let Some(&at) = position.get(id.as_str()) else {
                continue;
            };
            if let Some((before, was_at)) = previous {
                assert!(
                    at > was_at,
                    "nemesis ({seed}): writer {writer} committed row {before} before row {id}, \
                     but the stream holds {id} at {at}, before {before} at {was_at}"
                );
            }
            previous = Some((id, at));
        }
    }
    let commits: Vec<Commit> = run.by_writer.iter().flatten().cloned().collect();
    let on_primary: std::collections::HashSet<&str> = run.rows.iter().map(String::as_str).collect();
    let kinds: Vec<FaultKind> = run.ran.iter().map(|r| r.step.fault.kind()).collect();
    let (surviving, vanished) = surviving_commits(&commits, &on_primary, &kinds)
        .unwrap_or_else(|e| panic!("nemesis ({seed}): {e}"));
    let delivered: std::collections::HashSet<String> = tally.counts.keys().cloned().collect();
    let ended = surviving.iter().map(|c| (c.ended_by, &c.ids));
    let acknowledged_rows = acknowledged_rows_delivered(confirmed, ended, &delivered)
        .unwrap_or_else(|violation| {
            panic!("nemesis ({seed}): {violation} but is not in the stream")
        });
    let readings_checked = acks_before_markers(&surviving, &arrivals, &run.readings.markers)
        .unwrap_or_else(|violation| {
            panic!(
                "nemesis ({seed}): {violation} but was stored after the marker published once \
                 the slot was read so, while the faults ran"
            )
        });
    let rewound: usize = run
        .ran
        .iter()
        .filter_map(|r| r.rewind)
        .map(|w| w.rows(&commits))
        .sum();
    let crashes = kinds.iter().filter(|k| k.can_lose_commits()).count();
    let mut by_kind: BTreeMap<FaultKind, usize> = BTreeMap::new();
    for kind in &kinds {
        *by_kind.entry(*kind).or_default() += 1;
    }
    report(
        "n2 nemesis campaign into a stream",
        &[
            ("seed", seed.to_string()),
            ("PostgreSQL", run.major.to_string()),
            ("minutes", format!("{}", run.minutes)),
            ("faults", run.ran.len().to_string()),
            (
                "faults that found no running target",
                run.missed.to_string(),
            ),
            ("rows", run.rows.len().to_string()),
            ("lost", "0".into()),
            ("rows in the stream twice", "0".into()),
            (
                "rows read again and not sent (the stream held them)",
                skipped.to_string(),
            ),
            ("rows PostgreSQL stops took back", rewound.to_string()),
            (
                "commits the writers saw succeed that the final primary lacks",
                format!("{} (primary crashes: {crashes})", vanished.len()),
            ),
            ("last heal to a relay ready", secs(run.ready_after)),
            ("acknowledged rows checked", acknowledged_rows.to_string()),
            (
                "ACK readings while the faults ran, checked",
                format!("{readings_checked} of {}", run.readings.markers.len()),
            ),
            ("setup", secs(run.setup_took)),
            (
                "paused nodes restarted after a heal",
                run.repairs.to_string(),
            ),
        ],
    );
    for (kind, count) in by_kind {
        println!(
            "FIGURES n2 nemesis into a stream {}: count {count}",
            kind.name()
        );
    }
}

/// What the report says of one fault kind.
#[derive(Default)]
struct Figures {
    count: usize,
    /// The worst time from a heal until a row committed after it had its effect.
    again: Duration,
    /// The worst commit-to-effect time of a row committed while such a fault lasted.
    stall: Duration,
    /// Rows such a fault's PostgreSQL stops may deliver again (see [`Rewind`]).
    taken_back: usize,
}

fn relay_logs(world: &World) -> String {
    world
        .relays
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            let log = slot.lock().unwrap().process.as_ref().map(|p| p.log());
            format!(
                "--- relay {i}:\n{}",
                log.unwrap_or_else(|| "(not running)".into())
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
