//! The manual's commands, run as written. Every `outbox-relay` and `outbox-inbox` line of the
//! `sh` blocks of README.md and docs/ runs here (or, for docs/migrating.md, in
//! tests/migration_tables.rs) against a real PostgreSQL and RabbitMQ, in the page's order,
//! with only what the page's own `export` lines set given by the test (the URLs) plus a slot
//! and exchange name of its own: the relay reads those from `OUTBOX_SLOT` and
//! `OUTBOX_EXCHANGE`, so the command lines stay the page's. A command that serves (`run`,
//! `poll`, `consume`) must deliver a row and exit 0 on SIGTERM; any other must exit 0.
//! The other programs the pages show are listed in [`NOT_RUN_HERE`] with what checks them,
//! and the `cargo test` filters the pages (and the lab's scenario catalogue) give must each
//! name a test that exists.

use outbox_testkit as common;

use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::amqp::{declare_bound_queue, declare_exchange, delete_queue, publish_confirmed};
use common::manual::{self, checkout, sh_commands};
use common::pg::{pg_connect, query_value, wait_count};
use common::relay::{binary, inbox_binary, TEST_LOG};
use common::{free_port, services, unique_name, Consumer, RelayProcess};
use tokio_postgres::Client;

const DEADLINE: Duration = Duration::from_secs(60);

/// Pages whose `outbox-relay` lines another test runs as written.
const RUN_ELSEWHERE: &[(&str, &str)] = &[(
    "docs/migrating.md",
    "tests/migration_tables.rs (each guide's setup and run)",
)];

/// The programs the pages show that no test here runs, and what checks each instead.
const NOT_RUN_HERE: &[(&str, &str)] = &[
    ("export", "the URLs: each session here sets its own"),
    (
        "cargo",
        "CI builds as the pages do; `cargo test` filters are checked below",
    ),
    (
        "scripts/test.sh",
        ".ci/run runs it; its options are checked below",
    ),
    (
        "scripts/bench.sh",
        "its options are checked below; the benchmark is run by hand",
    ),
    (
        "scripts/fuzz.sh",
        "scripts/test.sh runs `scripts/fuzz.sh --all`; targets checked below",
    ),
    (
        "scripts/demo.sh",
        "README's demo; it runs the same setup and run as the quickstart",
    ),
    (
        "docker",
        "tests/packaging.rs checks docker-compose.yml and the Dockerfile",
    ),
    (
        "curl",
        "the management API of the quickstart's broker; a queue is bound here instead",
    ),
    (
        "kubectl",
        "scripts/check-deploy.sh validates deploy/kubernetes (tests/packaging.rs)",
    ),
    (
        "rabbitmqadmin",
        "broker administration; the tests declare the same objects over AMQP",
    ),
    (
        "rabbitmqctl",
        "broker policy; tests/dead_letter.rs sets the same policy",
    ),
    (
        "rabbitmq-plugins",
        "broker setup; the kit's stream nodes enable rabbitmq_stream in their enabled_plugins",
    ),
    (
        "rabbitmq-streams",
        "tests/streams.rs makes super streams over the stream protocol, and checks that the \
         relay's error names this command",
    ),
    (
        "psql",
        "run here where the page runs one (docs/table-layouts.md)",
    ),
    (
        "target/release/examples/inbox_bench",
        "the benchmark's own binaries, run by hand",
    ),
    (
        "target/release/examples/stream_bench",
        "the benchmark's own binaries, run by hand",
    ),
];

/// README.md and every page of docs/.
fn pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_string()];
    let docs = checkout().join("docs");
    let mut found: Vec<String> = std::fs::read_dir(&docs)
        .expect("read docs/")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| {
            format!(
                "docs/{}",
                path.file_name().unwrap_or_default().to_string_lossy()
            )
        })
        .collect();
    found.sort();
    pages.extend(found);
    pages
}

/// The program a command line runs: its first word after `NAME=value` assignments.
fn program(words: &[String]) -> Option<&str> {
    words
        .iter()
        .map(String::as_str)
        .find(|word| !is_assignment(word))
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })
}

/// The relay's and the consumer's binaries by the names the pages use.
fn is_ours(program: &str) -> bool {
    matches!(
        program.rsplit('/').next(),
        Some("outbox-relay" | "outbox-inbox")
    )
}

/// Pages whose own session in this file runs their commands (see the tests below).
const RUN_HERE: &[&str] = &[
    "README.md",
    "docs/consumers.md",
    "docs/deployment.md",
    "docs/emit.md",
    "docs/getting-started.md",
    "docs/polling.md",
    "docs/recovery.md",
    "docs/scaling.md",
    "docs/table-layouts.md",
];

#[test]
fn every_command_the_manual_shows_is_run_or_checked_by_a_test() {
    let mut unaccounted = Vec::new();
    for page in pages() {
        for words in sh_commands(&manual::page(&page)) {
            let Some(program) = program(&words) else {
                continue;
            };
            let accounted = if is_ours(program) {
                RUN_HERE.contains(&page.as_str()) || RUN_ELSEWHERE.iter().any(|(p, _)| *p == page)
            } else {
                NOT_RUN_HERE.iter().any(|(p, _)| *p == program)
            };
            if !accounted {
                unaccounted.push(format!("{page}: {}", words.join(" ")));
            }
        }
    }
    assert!(
        unaccounted.is_empty(),
        "commands no test runs or checks (run them in a session here, or name what checks \
         them in NOT_RUN_HERE):\n{}",
        unaccounted.join("\n")
    );
}

// ---------------------------------------------------------------------------------
// What the pages name: tests, script options, fuzz targets

/// Every test's full name as libtest sees it in `--test main` (`module::path::function`).
fn test_names() -> BTreeSet<String> {
    fn walk(dir: &Path, module: &str, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let stem = path
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let here = match (module.is_empty(), stem.as_str()) {
                (true, "main") => String::new(),
                (true, _) => stem.clone(),
                (false, _) => format!("{module}::{stem}"),
            };
            if path.is_dir() {
                walk(&path, &here, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let mut marked = false;
                for line in text.lines().map(str::trim) {
                    if line.starts_with("#[test]") || line.starts_with("#[tokio::test") {
                        marked = true;
                    } else if let Some(rest) = line
                        .strip_prefix("async fn ")
                        .or_else(|| line.strip_prefix("fn "))
                        .filter(|_| marked)
                    {
                        let name: String = rest
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        out.insert(format!("{here}::{name}"));
                        marked = false;
                    }
                }
            }
        }
    }
    let mut names = BTreeSet::new();
    walk(&checkout().join("tests"), "", &mut names);
    names
}

/// The filter of a `cargo test --test main FILTER …` line: its first free word after `main`.
fn cargo_test_filter(words: &[String]) -> Option<&str> {
    let at = words.iter().position(|w| w == "main")?;
    words[at + 1..]
        .iter()
        .map(String::as_str)
        .take_while(|w| *w != "--")
        .find(|w| !w.starts_with('-'))
}

/// Where the benchmark's options (`scripts/bench.sh --…`) are declared.
const BENCH_ARGS: &str = "crates/outbox-bench/src/scenarios/suite/args.rs";

/// Pages outside the manual whose test filters and script options are checked too: the lab's
/// catalogue of fault scenarios, which tells how to rerun each.
const LAB_PAGES: &[&str] = &["crates/outbox-bench/lab/scenarios.md"];

#[test]
fn the_test_filters_script_options_and_fuzz_targets_the_manual_gives_exist() {
    let tests = test_names();
    assert!(
        tests.contains("manual_commands::the_test_filters_script_options_and_fuzz_targets_the_manual_gives_exist"),
        "the reader of tests/ finds this very test"
    );
    let script_options = |script: &str| -> String {
        std::fs::read_to_string(checkout().join(script)).unwrap_or_default()
    };
    let mut wrong = Vec::new();
    let lab = LAB_PAGES.iter().map(|page| page.to_string());
    for page in pages().into_iter().chain(lab) {
        for words in sh_commands(&manual::page(&page)) {
            let Some(program) = program(&words) else {
                continue;
            };
            let at = words.iter().position(|w| w == program).unwrap_or(0);
            let args = &words[at + 1..];
            match program {
                "cargo" if args.first().map(String::as_str) == Some("test") => {
                    if let Some(filter) = cargo_test_filter(args) {
                        if !tests.iter().any(|name| name.contains(filter)) {
                            wrong.push(format!("{page}: no test matches {filter:?}"));
                        }
                    }
                }
                "scripts/test.sh" | "scripts/bench.sh" | "scripts/fuzz.sh" => {
                    let script = script_options(program);
                    // bench.sh hands its options to the benchmark's clap arguments.
                    let bench = script_options(BENCH_ARGS);
                    for option in args.iter().filter(|a| a.starts_with("--")) {
                        let field = format!("pub {}:", option[2..].replace('-', "_"));
                        let known = match program {
                            "scripts/bench.sh" => bench.contains(&field),
                            _ => {
                                [")", "|"]
                                    .iter()
                                    .any(|end| script.contains(&format!("{option}{end}")))
                                    || script.contains(&format!("|{option}"))
                            }
                        };
                        if !known {
                            wrong.push(format!("{page}: {program} has no option {option}"));
                        }
                    }
                    if program == "scripts/fuzz.sh" {
                        if let Some(target) = args.first().filter(|a| !a.starts_with('-')) {
                            let file = format!("fuzz/fuzz_targets/{target}.rs");
                            if !checkout().join(&file).is_file() {
                                wrong.push(format!("{page}: no fuzz target {file}"));
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------------
// A page's commands, run as a user at a shell would

/// One page's `outbox-relay`, `outbox-inbox` and `psql` lines, run in order in a database of
/// their own. Each test takes the lines one by one, naming what it expects next, so a page
/// that changes its steps fails here until the test follows.
struct Session {
    page: &'static str,
    lines: VecDeque<Vec<String>>,
    db_url: String,
    client: Client,
    amqp_url: String,
    slot: String,
    exchange: String,
    queue: String,
    /// Where a server serves /metrics: a port of its own, since the tests run side by side.
    metrics_addr: String,
}

impl Session {
    async fn open(page: &'static str, prefix: &str) -> Session {
        let name = unique_name(prefix);
        let db_url = services().pg.create_database(&name).await;
        let lines = sh_commands(&manual::page(page))
            .into_iter()
            .filter_map(|words| {
                let at = words.iter().position(|w| !is_assignment(w))?;
                let program = words[at].as_str();
                (is_ours(program) || program == "psql").then(|| {
                    // A trailing `&` backgrounds a server: the test starts it in the background.
                    words[at..].iter().filter(|w| *w != "&").cloned().collect()
                })
            })
            .collect();
        Session {
            page,
            lines,
            client: pg_connect(&db_url).await,
            db_url,
            amqp_url: services().rabbit.url(),
            slot: format!("{name}_slot"),
            exchange: format!("{name}_x"),
            queue: format!("{name}_q"),
            metrics_addr: format!("127.0.0.1:{}", free_port()),
        }
    }

    /// What the page's `export` lines set, with this session's values.
    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("DATABASE_URL", self.db_url.as_str()),
            ("AMQP_URL", self.amqp_url.as_str()),
            ("OUTBOX_SLOT", self.slot.as_str()),
            ("OUTBOX_EXCHANGE", self.exchange.as_str()),
            ("OUTBOX_METRICS_ADDR", self.metrics_addr.as_str()),
            TEST_LOG,
        ]
    }

    /// The page's next line, which must run `program` with `first` as its first argument.
    fn next(&mut self, program: &str, first: &str) -> Vec<String> {
        let line = self.lines.pop_front().unwrap_or_else(|| {
            panic!(
                "{}: expected `{program} {first} …`, the page has no more",
                self.page
            )
        });
        assert!(
            line[0].rsplit('/').next() == Some(program)
                && line.get(1).map(String::as_str) == Some(first),
            "{}: expected `{program} {first} …` next, the page has `{}`",
            self.page,
            line.join(" ")
        );
        line
    }

    fn bin(program: &str) -> &'static Path {
        match program.rsplit('/').next() {
            Some("outbox-inbox") => inbox_binary(),
            _ => binary(),
        }
    }

    /// Runs the page's next line, `program first …`, to its end: it must exit 0.
    fn run(&mut self, program: &str, first: &str) -> Output {
        let line = self.next(program, first);
        self.run_to_end(&line)
    }

    /// Runs `line` (a program and its arguments) to its end in this session's environment:
    /// it must exit 0.
    fn run_to_end(&self, line: &[String]) -> Output {
        let output = self.output(line);
        assert!(
            output.status.success(),
            "{}: `{}` exited {}:\n{}",
            self.page,
            line.join(" "),
            output.status,
            common::output_text(&output)
        );
        output
    }

    /// Runs `line` (a program and its arguments) to its end in this session's environment.
    fn output(&self, line: &[String]) -> Output {
        std::process::Command::new(Self::bin(&line[0]))
            .args(&line[1..])
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .envs(self.env())
            .output()
            .expect("run the command")
    }

    /// Runs the page's next line, `outbox-relay check`, on a database and broker `setup` has
    /// not seen: it exits with the configuration code, its errors are the table, publication,
    /// slot and exchange, and each names `outbox-relay setup` as the fix.
    fn check_before_setup(&mut self) {
        let line = self.next("outbox-relay", "check");
        let output = self.output(&line);
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        assert_eq!(
            output.status.code(),
            Some(i32::from(outbox_relay::exit::CONFIG)),
            "{}: `{}`:\n{}",
            self.page,
            line.join(" "),
            common::output_text(&output)
        );
        let errors: Vec<&str> = printed.lines().filter(|l| l.starts_with("error")).collect();
        let named: Vec<&str> = errors
            .iter()
            .filter_map(|l| l.split(':').next()?.split_whitespace().nth(1))
            .collect();
        assert_eq!(
            named,
            ["table", "publication", "slot", "exchange"],
            "{}: check's errors before setup:\n{printed}",
            self.page
        );
        for error in errors {
            assert!(
                error.contains("outbox-relay setup"),
                "{}: an error without setup as its fix: {error}",
                self.page
            );
        }
    }

    /// How many replication slots are named `slot_name LIKE pattern`.
    async fn slots_like(&self, pattern: &str) -> i64 {
        let sql =
            format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE '{pattern}'");
        query_value(&self.client, &sql).await
    }

    /// Starts the page's next line, `program first …`, a server.
    fn start(&mut self, program: &str, first: &str) -> RelayProcess {
        let line = self.next(program, first);
        let args: Vec<&str> = line[1..].iter().map(String::as_str).collect();
        RelayProcess::spawn_bin(Self::bin(program), &args, &self.env())
    }

    /// Runs the page's next line, a `psql -c 'SQL'`, in the session's database.
    async fn psql(&mut self) {
        let line = self.next("psql", "-c");
        let sql = line.get(2).expect("psql -c takes the SQL");
        self.client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{}: {sql}: {e:?}", self.page));
    }

    /// A queue bound with `#` to `exchange`, consumed.
    async fn consume(&self, exchange: &str) -> Consumer {
        declare_bound_queue(&self.amqp_url, exchange, &self.queue, "#").await;
        Consumer::start(&self.amqp_url, &self.queue).await
    }

    /// `sql` inserts rows; each must reach `consumer`, then the server stops on SIGTERM with 0.
    async fn delivers(&self, server: RelayProcess, consumer: &mut Consumer, sql: &str) {
        let before = consumer.received().len();
        let inserted =
            self.client
                .execute(sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{}: {sql}: {e:?}", self.page)) as usize;
        let arrived = consumer.wait_for(before + inserted, DEADLINE).await;
        assert_eq!(
            arrived.len(),
            before + inserted,
            "{}: the rows did not arrive; log:\n{}",
            self.page,
            server.log()
        );
        server.stop().await;
    }

    /// Every line of the page has run.
    async fn finish(self) {
        assert!(
            self.lines.is_empty(),
            "{}: lines the test did not run: {:?}",
            self.page,
            self.lines
        );
        delete_queue(&self.amqp_url, &self.queue).await;
    }
}

const ORDER_PLACED: &str =
    "INSERT INTO outbox (event_type, payload) VALUES ('OrderPlaced', '{\"order_id\": 42}')";

/// README.md's and getting-started's quickstart: check, which names what setup creates as
/// missing, then setup, then run, which delivers.
async fn quickstart(page: &'static str, prefix: &str) {
    let mut session = Session::open(page, prefix).await;
    session.check_before_setup();
    session.run("outbox-relay", "setup");
    let mut consumer = session.consume(&session.exchange).await;
    let relay = session.start("outbox-relay", "run");
    session.delivers(relay, &mut consumer, ORDER_PLACED).await;
    session.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_quickstart_delivers_a_row() {
    quickstart("README.md", "man_readme").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getting_starteds_quickstart_delivers_a_row() {
    quickstart("docs/getting-started.md", "man_gs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollings_setup_print_sql_and_workers_deliver_a_row() {
    let mut session = Session::open("docs/polling.md", "man_poll").await;
    session.run("outbox-relay", "setup");
    let printed = session.run("outbox-relay", "setup");
    let sql = String::from_utf8_lossy(&printed.stdout);
    assert!(
        sql.contains("CREATE INDEX"),
        "--print-sql prints the SQL:\n{sql}"
    );
    let mut consumer = session.consume(&session.exchange).await;
    let poll = session.start("outbox-relay", "poll");
    let insert_and_notify = format!("{ORDER_PLACED}; NOTIFY outbox");
    let before = consumer.received().len();
    session
        .client
        .batch_execute(&insert_and_notify)
        .await
        .expect("insert and notify");
    let arrived = consumer.wait_for(before + 1, DEADLINE).await;
    assert_eq!(arrived.len(), before + 1, "log:\n{}", poll.log());
    poll.stop().await;
    session.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scalings_four_shards_set_up_deliver_report_and_tear_down() {
    let mut session = Session::open("docs/scaling.md", "man_shards").await;
    session.run("outbox-relay", "setup");
    let mut consumer = session.consume(&session.exchange).await;
    let relay = session.start("outbox-relay", "run");
    // Shard 0's rows by the page's own expression, N = 4 and K = 0.
    let expression = manual::blocks(&manual::page("docs/scaling.md"), "sql")
        .into_iter()
        .find(|block| block.contains("hashtext"))
        .expect("the page's shard expression")
        .replace("% N", "% 4")
        .replace("= K", "= 0");
    let insert = format!(
        "INSERT INTO outbox (id, event_type, payload, aggregate_id) \
         SELECT id, 'OrderPlaced', '{{}}', aggregate_id FROM (SELECT gen_random_uuid() AS id, \
         'order-' || i AS aggregate_id FROM generate_series(1, 40) i) candidates WHERE {}",
        expression.trim()
    );
    session.delivers(relay, &mut consumer, &insert).await;
    session.run("outbox-relay", "status");
    session.run("outbox-relay", "teardown");
    let slots = session.slots_like(&format!("{}%", session.slot)).await;
    assert_eq!(slots, 0, "teardown --shards 4 drops every shard's slot");
    session.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_teardown_drops_the_slot() {
    let mut session = Session::open("docs/deployment.md", "man_deploy").await;
    // The page tears down what the deployment's setup Job made: made here the same way.
    session.run_to_end(&["outbox-relay".to_string(), "setup".to_string()]);
    session.run("outbox-relay", "teardown");
    let slots = session.slots_like(&session.slot).await;
    assert_eq!(slots, 0, "teardown --yes drops the slot");
    session.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recoverys_dead_letter_setup_runs() {
    let mut session = Session::open("docs/recovery.md", "man_recovery").await;
    session.run("outbox-relay", "setup");
    session.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emits_restricted_setup_grants_the_app_role_the_functions() {
    let mut session = Session::open("docs/emit.md", "man_emit").await;
    // The roles the page names; a cluster has each once, whichever test makes it.
    for role in ["app", "outbox_relay"] {
        session
            .client
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE {role}; \
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            ))
            .await
            .expect("create the page's role");
    }
    session.run("outbox-relay", "setup");
    let granted: bool = query_value(
        &session.client,
        "SELECT has_function_privilege('app', 'outbox_emit(text, jsonb, jsonb, text, text, \
         text, text)', 'EXECUTE')",
    )
    .await;
    assert!(granted, "the app role may call outbox_emit");
    session.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_layouts_commands_deliver_from_debeziums_table_in_both_modes() {
    let mut session = Session::open("docs/table-layouts.md", "man_layouts").await;
    session
        .client
        .batch_execute(crate::table_layouts::DEBEZIUM_TABLE)
        .await
        .expect("Debezium's table");
    let row = |n: u32| {
        format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES \
             (gen_random_uuid(), 'order', 'order-{n}', 'OrderCreated', '{{\"n\": {n}}}')"
        )
    };
    session.psql().await;
    session.run("outbox-relay", "setup");
    let mut consumer = session.consume(&session.exchange).await;
    let poll = session.start("outbox-relay", "poll");
    session.delivers(poll, &mut consumer, &row(1)).await;

    // The page's second way starts from Debezium's table as it is: the first way's rows,
    // marked in a column this way does not map, would be sent again.
    session
        .client
        .batch_execute("DELETE FROM outbox")
        .await
        .expect("empty the table");
    session.run("outbox-relay", "setup");
    let poll = session.start("outbox-relay", "poll");
    session.delivers(poll, &mut consumer, &row(2)).await;
    let left: i64 = query_value(
        &session.client,
        "SELECT count(*) FROM outbox WHERE payload->>'n' = '2'",
    )
    .await;
    assert_eq!(left, 0, "--on-published delete deletes the row");

    session.run("outbox-relay", "setup");
    let relay = session.start("outbox-relay", "run");
    session.delivers(relay, &mut consumer, &row(3)).await;

    // The templated exchange: the row's aggregate type names it.
    declare_exchange(&session.amqp_url, "events.order").await;
    let queue = format!("{}_events", session.queue);
    declare_bound_queue(
        &session.amqp_url,
        "events.order",
        &queue,
        "order.OrderCreated",
    )
    .await;
    let mut events = Consumer::start(&session.amqp_url, &queue).await;
    let relay = session.start("outbox-relay", "run");
    session.delivers(relay, &mut events, &row(4)).await;
    delete_queue(&session.amqp_url, &queue).await;
    session.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_commands_apply_a_message_once_and_clean_up() {
    let mut session = Session::open("docs/consumers.md", "man_inbox").await;
    session
        .client
        .batch_execute("CREATE TABLE paid_orders (order_id bigint)")
        .await
        .expect("the page's effect table");
    // The queue and dead-letter exchange the page's consume line names.
    declare_exchange(&session.amqp_url, "orders.dead").await;
    declare_bound_queue(&session.amqp_url, &session.exchange, "orders", "#").await;
    session.run("outbox-inbox", "setup");
    let consume = session.start("outbox-inbox", "consume");
    let body = br#"{"order_id": 42}"#;
    let message_id = unique_name("order");
    let messages = [(message_id.as_str(), &body[..])];
    publish_confirmed(&session.amqp_url, &session.exchange, "orders", &messages).await;
    let applied = wait_count(
        &session.client,
        "SELECT count(*) FROM paid_orders WHERE order_id = 42",
        DEADLINE,
        |n| n >= 1,
    )
    .await;
    assert_eq!(applied, Ok(1), "log:\n{}", consume.log());
    consume.stop().await;
    let claimed: i64 = query_value(&session.client, "SELECT count(*) FROM inbox").await;
    assert_eq!(claimed, 1, "the message is claimed in the inbox");
    session.run("outbox-inbox", "cleanup");
    delete_queue(&session.amqp_url, "orders").await;
    session.finish().await;
}
