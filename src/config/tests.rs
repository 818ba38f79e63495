//! The command line as a user meets it: flags, variables, defaults, errors, and the help.

use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use super::cli::{Cli, Command, DEFAULT_POLL_BATCH_SIZE, DEFAULT_POLL_WORKERS};
use super::connections::{readable_by_others, secret};
use super::messages::OnUnroutable;
use super::names::{parse_identifier, parse_slot_name};
use super::observability::{parse_metrics_addr, MetricsAddr};
use super::*;
use outbox_common::duration::parse_duration;

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

/// What `outbox-relay [COMMAND] -h` and `--help` print, every command, with the values of
/// any `[env: NAME=value]` the environment sets left out (the names stay).
fn help_texts() -> String {
    let commands = [
        "", "setup", "run", "poll", "status", "teardown", "resync", "check",
    ];
    let mut out = String::new();
    for command in commands {
        for flag in ["-h", "--help"] {
            let argv = ["outbox-relay", command, flag];
            let argv = argv.iter().filter(|a| !a.is_empty());
            let help = match Cli::try_parse_from(argv) {
                Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.render(),
                _ => panic!("{command} {flag} must print help"),
            };
            out.push_str(&format!("==== outbox-relay {command} {flag}\n"));
            out.push_str(&without_env_values(&help.to_string()));
        }
    }
    out
}

fn without_env_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("[env: ") {
        let (before, env) = rest.split_at(at);
        out.push_str(before);
        let end = env.find(']').unwrap_or(env.len());
        let name_end = env[..end].find('=').unwrap_or(end);
        out.push_str(&env[..name_end]);
        rest = &env[end..];
    }
    out.push_str(rest);
    out
}

/// The command line is an interface: a refactoring of the flag structs must not change a
/// flag's name, environment variable, default or help. `src/snapshots/cli_help.txt` is
/// the help as it was; regenerate it (OUTBOX_UPDATE_HELP_SNAPSHOT=1) only when a flag is
/// meant to change.
#[test]
fn help_of_every_command_is_unchanged() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/snapshots/cli_help.txt");
    let actual = help_texts();
    if std::env::var_os("OUTBOX_UPDATE_HELP_SNAPSHOT").is_some() {
        std::fs::write(path, &actual).expect("write the snapshot");
    }
    let expected = std::fs::read_to_string(path).expect("read the snapshot");
    for (line, (want, got)) in expected.lines().zip(actual.lines()).enumerate() {
        assert_eq!(got, want, "help differs at line {} of {path}", line + 1);
    }
    assert_eq!(actual.lines().count(), expected.lines().count(), "{path}");
}

/// docs/flags.md: every flag of every command as the help gives it (its text, variable,
/// default and possible values), one row per flag and help, naming the commands that take
/// it. Written with the help snapshot (OUTBOX_UPDATE_HELP_SNAPSHOT=1), from the same clap
/// definition, so the reference cannot drift from `--help`.
#[test]
fn flag_reference_is_the_help() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md");
    let actual = flag_reference();
    if std::env::var_os("OUTBOX_UPDATE_HELP_SNAPSHOT").is_some() {
        std::fs::write(path, &actual).expect("write the flag reference");
    }
    let expected = std::fs::read_to_string(path).expect("read the flag reference");
    for (line, (want, got)) in expected.lines().zip(actual.lines()).enumerate() {
        assert_eq!(
            got,
            want,
            "the flag reference differs at line {} of {path}",
            line + 1
        );
    }
    assert_eq!(actual.lines().count(), expected.lines().count(), "{path}");
}

/// The help of `--table-layout` (and of its values) names every column of each preset it
/// offers, from the preset itself: a column added to a preset cannot be missing from it.
/// `status --help` says the exit code a probe acts on, as src/exit.rs defines it.
/// Each command's help groups its flags by topic: only clap's own (help, version) and the
/// global --log-format stay under the unnamed "Options". Which heading each flag is under,
/// the help snapshot pins (a flag declared after a flattened group takes that group's
/// heading unless it names its own).
#[test]
fn every_flag_of_every_command_sits_under_a_heading() {
    let cli = Cli::command();
    for command in cli.get_subcommands() {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.is_hide_set() || ["help", "version", "log_format"].contains(&id) {
                continue;
            }
            assert!(
                arg.get_help_heading().is_some(),
                "{} --{id} has no heading",
                command.get_name()
            );
        }
    }
}

#[test]
fn the_status_help_names_the_unhealthy_exit_code() {
    let mut cli = Cli::command();
    cli.build();
    let status = cli.find_subcommand("status").expect("status");
    let about = status
        .get_about()
        .map(ToString::to_string)
        .unwrap_or_default();
    let wanted = format!(
        "Exits {} when the slot is missing or lost",
        crate::exit::UNHEALTHY
    );
    assert!(about.contains(&wanted), "{about}");
}

#[test]
fn the_table_layout_help_names_every_column_of_its_presets() {
    use crate::contract::columns::{ColumnMap, Preset, MAPPABLE};
    let mut cli = Cli::command();
    cli.build();
    let run = cli.find_subcommand("run").expect("run");
    let arg = run
        .get_arguments()
        .find(|a| a.get_long() == Some("table-layout"))
        .expect("--table-layout");
    let flag_help = arg.get_help().map(ToString::to_string).unwrap_or_default();
    let value_help = |name: &str| {
        arg.get_possible_values()
            .into_iter()
            .find(|v| v.get_name() == name)
            .and_then(|v| v.get_help().map(ToString::to_string))
            .unwrap_or_default()
    };
    let debezium = ColumnMap::preset(Preset::Debezium);
    let renamed: Vec<&str> = MAPPABLE
        .iter()
        .filter_map(|contract| debezium.column(contract))
        .filter(|column| !MAPPABLE.contains(column))
        .collect();
    assert!(!renamed.is_empty(), "the Debezium preset renames columns");
    for column in renamed {
        for (what, help) in [
            ("--table-layout", &flag_help),
            ("debezium", &value_help("debezium")),
        ] {
            assert!(
                help.contains(column),
                "the help of {what} omits the Debezium column {column}: {help}"
            );
        }
    }
}

/// The Markdown of docs/flags.md, from the commands' clap definitions.
fn flag_reference() -> String {
    let mut cli = Cli::command();
    cli.build();
    let commands: Vec<&clap::Command> = cli
        .get_subcommands()
        .filter(|c| c.get_name() != "help")
        .collect();
    let mut out = String::from(FLAG_REFERENCE_HEAD);
    for command in &commands {
        let about = command.get_long_about().or(command.get_about());
        let about = about.map(|a| a.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "| `{}` | {} |\n",
            command.get_name(),
            cell(&about)
        ));
    }
    out.push_str("\n## Flags\n\n");
    out.push_str("| flag | environment | default | commands | meaning |\n|---|---|---|---|---|\n");
    // One row per flag and help text: a flag whose help differs between commands gets a row
    // for each text, naming the commands that give it.
    let mut rows: Vec<(String, Vec<&str>)> = Vec::new();
    for command in &commands {
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() || long == "help" || long == "version" {
                continue;
            }
            let row = flag_row(long, arg);
            match rows.iter_mut().find(|(r, _)| *r == row) {
                Some((_, names)) => names.push(command.get_name()),
                None => rows.push((row, vec![command.get_name()])),
            }
        }
    }
    for (row, mut names) in rows {
        // `check` takes the flags of `run` and `poll`, passed through to them (CheckArgs).
        if names.iter().any(|n| ["run", "poll"].contains(n)) && !names.contains(&"check") {
            names.push("check");
        }
        let names = if names.len() == commands.len() {
            "every command".to_string()
        } else {
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&row.replacen("{commands}", &names, 1));
    }
    out
}

/// One table row of the flag reference, `{commands}` standing for the commands' cell.
fn flag_row(long: &str, arg: &clap::Arg) -> String {
    let takes_value = arg.get_action().takes_values();
    let flag = match arg.get_value_names() {
        Some(names) if takes_value => {
            let names: Vec<String> = names.iter().map(|n| format!("<{n}>")).collect();
            format!("`--{long} {}`", names.join(" "))
        }
        _ => format!("`--{long}`"),
    };
    let env = arg
        .get_env()
        .map(|e| format!("`{}`", e.to_string_lossy()))
        .unwrap_or_else(|| "—".into());
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    let default = if defaults.is_empty() || !takes_value {
        "—".to_string()
    } else {
        format!("`{}`", defaults.join(","))
    };
    let help = arg.get_long_help().or(arg.get_help());
    let mut meaning = help.map(|h| h.to_string()).unwrap_or_default();
    let values: Vec<_> = arg
        .get_possible_values()
        .into_iter()
        .filter(|v| !v.is_hide_set())
        .collect();
    if takes_value && !values.is_empty() {
        let listed: Vec<String> = values
            .iter()
            .map(|v| match v.get_help() {
                Some(help) => format!("`{}`: {help}", v.get_name()),
                None => format!("`{}`", v.get_name()),
            })
            .collect();
        let sep = if values.iter().any(|v| v.get_help().is_some()) {
            "; "
        } else {
            ", "
        };
        meaning.push_str(&format!("\n\nPossible values: {}.", listed.join(sep)));
    }
    format!(
        "| {flag} | {env} | {} | {{commands}} | {} |\n",
        cell(&default),
        cell(&meaning)
    )
}

/// A help text as one Markdown table cell: its paragraphs joined by a line break.
fn cell(text: &str) -> String {
    let paragraphs = text.trim().split("\n\n");
    let escaped: Vec<String> = paragraphs.map(|p| escaped(&p.replace('\n', " "))).collect();
    escaped.join("<br>")
}

/// Outside `code`, the characters Markdown would read as markup escaped (`<…>` is a
/// placeholder in the help, not HTML; `*` and `_` between words are not emphasis); `|`
/// escaped everywhere, as a table cell needs.
fn escaped(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let word = |j: Option<usize>| {
        j.and_then(|j| chars.get(j))
            .is_some_and(|c| c.is_alphanumeric())
    };
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for (i, &c) in chars.iter().enumerate() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '|' => out.push_str("\\|"),
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            '_' if !in_code && word(i.checked_sub(1)) && word(Some(i + 1)) => out.push(c),
            '*' | '_' if !in_code => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// The opening of docs/flags.md, before the tables.
const FLAG_REFERENCE_HEAD: &str = "\
# Flags

Every flag of every command, with its environment variable, its default and what it does: the
relay's `--help` as Markdown (`outbox-relay <command> --help` prints the same). This file is
generated: a unit test (`flag_reference_is_the_help`, `src/config/tests.rs`) checks that it
matches the help, and `OUTBOX_UPDATE_HELP_SNAPSHOT=1 cargo test --lib help` rewrites it with the
help snapshot (`src/snapshots/cli_help.txt`); do not edit it by hand.

A command refuses a flag it does not take on its command line; an environment variable a
command does not use is not read by it, so one environment can serve every command. URLs carry
passwords: give them by environment or by file (`DATABASE_URL_FILE`, `AMQP_URL_FILE`), never
only in argv ([security.md](security.md#secrets)).

## Commands

| command | what it does |
|---|---|
";

/// `outbox-relay <argv>`, parsed.
fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("outbox-relay").chain(argv.iter().copied()))
}

/// A flag a command does not use is refused by that command's parser, not ignored: a
/// `--heartbeat-interval-secs` given to `poll` would otherwise look like it had an effect.
#[test]
fn each_command_refuses_the_flags_it_does_not_use() {
    let db = ["--database-url", "postgres://x"];
    let refused: &[(&str, &[&str])] = &[
        ("poll", &["--heartbeat-interval-secs", "5"]),
        ("poll", &["--slot", "s"]),
        ("poll", &["--publication", "p"]),
        ("poll", &["--max-in-flight", "5"]),
        ("status", &["--amqp-url", "amqp://x"]),
        ("status", &["--amqp-url-file", "/f"]),
        ("status", &["--exchange", "x"]),
        ("status", &["--publication", "p"]),
        ("teardown", &["--max-in-flight", "5"]),
        ("teardown", &["--amqp-url", "amqp://x"]),
        ("teardown", &["--table", "t"]),
        ("teardown", &["--exchange", "x"]),
        ("resync", &["--heartbeat-interval-secs", "5"]),
        ("resync", &["--max-backoff-secs", "5"]),
        ("resync", &["--shutdown-timeout-secs", "5"]),
        ("resync", &["--slot", "s"]),
        ("resync", &["--publication", "p"]),
        ("poll", &["--emit-prefix", "p"]),
        ("run", &["--restrict-emit"]),
        ("run", &["--emit-role", "app"]),
        ("setup", &["--message-format", "cloudevents"]),
        ("status", &["--cloudevents-source", "urn:x"]),
        ("resync", &["--emit-prefix", "p"]),
        ("status", &["--emit-prefix", "p"]),
        ("teardown", &["--emit-prefix", "p"]),
    ];
    for (command, flag) in refused {
        let mut argv = vec![*command];
        argv.extend_from_slice(&db);
        argv.extend_from_slice(flag);
        let e = parse(&argv).expect_err(&format!("{command} must refuse {flag:?}"));
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{e}");
        assert!(e.to_string().contains(flag[0]), "{e}");
    }
}

#[test]
fn each_command_accepts_its_own_flags() {
    let amqp = ["--amqp-url", "amqp://x", "--amqp-url-file", "/f"];
    let names = [
        "--table",
        "t",
        "--publication",
        "p",
        "--slot",
        "s",
        "--exchange",
        "x",
    ];
    let delivery = [
        "--confirm-timeout-secs",
        "5",
        "--max-message-size",
        "5",
        "--max-backoff-secs",
        "5",
        "--shutdown-timeout-secs",
        "5",
    ];
    let accepted: &[(&str, Vec<&str>)] = &[
        (
            "setup",
            [
                &amqp[..],
                &names,
                &["--print-sql", "--emit-prefix", "e", "--restrict-emit"],
                &["--emit-role", "app", "--relay-role", "relay"],
            ]
            .concat(),
        ),
        (
            "run",
            [
                &amqp[..],
                &names,
                &delivery,
                &["--heartbeat-interval-secs", "5", "--max-in-flight", "5"],
                &["--emit-prefix", "e"],
            ]
            .concat(),
        ),
        (
            "poll",
            [&amqp[..], &["--table", "t", "--exchange", "x"], &delivery].concat(),
        ),
        ("status", vec!["--table", "t", "--slot", "s", "--json"]),
        (
            "teardown",
            vec!["--publication", "p", "--slot", "s", "--yes"],
        ),
        (
            "resync",
            [
                &amqp[..],
                &[
                    "--table",
                    "t",
                    "--exchange",
                    "x",
                    "--since",
                    "2024-05-01T00:00:00Z",
                ],
                &delivery[..4],
            ]
            .concat(),
        ),
    ];
    for (command, flags) in accepted {
        let mut argv = vec![*command, "--database-url", "postgres://x"];
        argv.extend_from_slice(flags);
        if let Err(e) = parse(&argv) {
            panic!("{command} {flags:?}: {e}");
        }
    }
}

/// The emit prefix defaults to one per table, and may be neither the heartbeats' prefix
/// nor text that could break the SQL of the emit functions.
#[test]
fn emit_prefix_defaults_per_table_and_refuses_the_heartbeat_prefix() {
    let run = |extra: &[&str]| {
        let mut argv = vec!["run", "--database-url", "postgres://x"];
        argv.extend_from_slice(extra);
        match parse(&argv).map(|cli| cli.command) {
            Ok(Command::Run(run)) => Ok(crate::assembly::emit_prefix(&run.emit, &run.names.table)),
            Ok(_) => panic!("expected run"),
            Err(e) => Err(e.to_string()),
        }
    };
    assert_eq!(run(&[]).as_deref(), Ok("outbox-relay:emit:public.outbox"));
    assert_eq!(
        run(&["--table", "app.events"]).as_deref(),
        Ok("outbox-relay:emit:app.events")
    );
    assert_eq!(run(&["--emit-prefix", "mine"]).as_deref(), Ok("mine"));
    let heartbeat = run(&["--emit-prefix", HEARTBEAT_PREFIX]);
    assert!(
        heartbeat
            .as_ref()
            .is_err_and(|e| e.contains("--emit-prefix") && e.contains("heartbeats")),
        "{heartbeat:?}"
    );
    for bad in ["", "a$b", "a\nb"] {
        let refused = run(&["--emit-prefix", bad]);
        assert!(
            refused.as_ref().is_err_and(|e| e.contains("the prefix")),
            "{bad:?}: {refused:?}"
        );
    }
}

#[test]
fn restrict_emit_needs_the_emit_role() {
    let e = parse(&["setup", "--restrict-emit"]).expect_err("needs --emit-role");
    assert_eq!(
        e.kind(),
        clap::error::ErrorKind::MissingRequiredArgument,
        "{e}"
    );
    assert!(e.to_string().contains("--emit-role"), "{e}");
}

#[test]
fn run_defaults_match_the_design() {
    let cli = Cli::try_parse_from(["outbox-relay", "run", "--database-url", "postgres://x"])
        .expect("parses");
    let Command::Run(run) = cli.command else {
        panic!("expected run");
    };
    assert_eq!(run.names.slot, "outbox_slot");
    assert_eq!(run.names.publication, "outbox_pub");
    assert_eq!(run.names.exchange, "outbox");
    assert!(run.tuning.status_interval() <= Duration::from_millis(100));
}

#[test]
fn poll_defaults_are_the_documented_ones() {
    let cli = Cli::try_parse_from(["outbox-relay", "poll", "--database-url", "postgres://x"])
        .expect("parses");
    let Command::Poll(poll) = cli.command else {
        panic!("expected poll");
    };
    assert_eq!(poll.workers, DEFAULT_POLL_WORKERS);
    assert_eq!(poll.batch_size, DEFAULT_POLL_BATCH_SIZE);
    assert_eq!(
        poll.poll_intervals().ok(),
        Some((Duration::from_millis(100), Duration::from_secs(1)))
    );
    assert!(!poll.listen);
    assert_eq!(poll.listen_channel, "outbox");
    assert_eq!(poll.cleanup.retention, Duration::from_secs(3600));
    assert_eq!(
        poll.delivery.publishing.confirm_timeout(),
        Duration::from_secs(30)
    );
}

#[test]
fn a_fixed_poll_interval_sets_both_bounds_and_excludes_them() {
    let parse = |extra: &[&str]| {
        let mut argv = vec!["outbox-relay", "poll", "--database-url", "postgres://x"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Poll(poll) => poll.poll_intervals().ok(),
            _ => panic!("expected poll"),
        })
    };
    let fixed = Duration::from_millis(250);
    assert_eq!(
        parse(&["--poll-interval", "250ms"]).ok(),
        Some(Some((fixed, fixed)))
    );
    assert_eq!(
        parse(&["--poll-interval-min", "50ms", "--poll-interval-max", "30s"]).ok(),
        Some(Some((Duration::from_millis(50), Duration::from_secs(30))))
    );
    assert!(parse(&["--poll-interval", "1s", "--poll-interval-max", "5s"]).is_err());
}

#[test]
fn a_poll_interval_max_below_the_min_is_refused_naming_both() {
    let cli = Cli::try_parse_from([
        "outbox-relay",
        "poll",
        "--database-url",
        "postgres://x",
        "--poll-interval-min",
        "5s",
        "--poll-interval-max",
        "1s",
    ])
    .expect("parses");
    let Command::Poll(poll) = cli.command else {
        panic!("expected poll");
    };
    let error = poll.poll_intervals().expect_err("refused").to_string();
    assert!(
        error.contains("--poll-interval-min 5s is above --poll-interval-max 1s"),
        "{error}"
    );
}

#[test]
fn run_observability_and_cleanup_defaults() {
    let cli = Cli::try_parse_from(["outbox-relay", "run", "--database-url", "postgres://x"])
        .expect("parses");
    let Command::Run(run) = cli.command else {
        panic!("expected run");
    };
    assert_eq!(
        run.observability.endpoints.metrics_addr,
        MetricsAddr(Some("127.0.0.1:9187".parse().expect("addr")))
    );
    assert_eq!(run.observability.slot_poll_interval, Duration::from_secs(5));
    assert_eq!(run.cleanup.cleanup_interval, Duration::from_secs(60));
    assert_eq!(run.cleanup.retention, Duration::from_secs(3600));
    assert_eq!(run.cleanup.cleanup_batch, 1000);
}

#[test]
fn the_broker_nodes_are_shuffled_unless_listed_order_is_asked_for() {
    let order = |extra: &[&str]| {
        let mut argv = vec!["run", "--database-url", "postgres://x"];
        argv.extend_from_slice(extra);
        match parse(&argv).map(|cli| cli.command) {
            Ok(Command::Run(run)) => Ok(run.connections.broker.amqp_node_order()),
            Ok(_) => panic!("expected run"),
            Err(e) => Err(e.to_string()),
        }
    };
    assert_eq!(order(&[]), Ok(NodeOrder::Shuffled));
    assert_eq!(
        order(&["--amqp-node-order", "listed"]),
        Ok(NodeOrder::Listed)
    );
    let err = order(&["--amqp-node-order", "leader"]).unwrap_err();
    assert!(err.contains("[possible values: shuffled, listed]"), "{err}");
    // AMQP_NODE_ORDER, the variable's name before the prefix, still works for this release
    // (its hidden flag stands in for it here: tests do not set the process's environment).
    assert_eq!(
        order(&["--amqp-node-order-unprefixed", "listed"]),
        Ok(NodeOrder::Listed)
    );
    let both = order(&[
        "--amqp-node-order",
        "listed",
        "--amqp-node-order-unprefixed",
        "listed",
    ]);
    assert!(both.is_err(), "both names at once are refused: {both:?}");
}

#[test]
fn metrics_addr_can_be_turned_off() {
    assert_eq!(parse_metrics_addr("off"), Ok(MetricsAddr(None)));
    assert_eq!(parse_metrics_addr(""), Ok(MetricsAddr(None)));
    assert_eq!(
        parse_metrics_addr("0.0.0.0:9187"),
        Ok(MetricsAddr(Some("0.0.0.0:9187".parse().expect("addr"))))
    );
    assert!(parse_metrics_addr("localhost").is_err());
}

/// Every duration knob takes a humantime string under its new name and, for one release, a
/// number in its old unit under its old name (flag or variable); both names at once are
/// refused.
#[test]
fn duration_knobs_take_units_and_their_old_names_still_work() {
    let run = |extra: &[&str]| {
        let mut argv = vec!["outbox-relay", "run", "--database-url", "postgres://x"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Run(run) => run.tuning,
            _ => panic!("expected run"),
        })
    };
    let defaults = run(&[]).expect("defaults");
    assert_eq!(defaults.status_interval(), Duration::from_millis(100));
    assert_eq!(defaults.heartbeat_interval(), Some(Duration::from_secs(10)));
    assert_eq!(
        defaults.delivery.publishing.confirm_timeout(),
        Duration::from_secs(30)
    );
    assert_eq!(defaults.delivery.max_backoff(), Duration::from_secs(30));
    assert_eq!(
        defaults.delivery.shutdown_timeout(),
        Duration::from_secs(30)
    );
    assert_eq!(defaults.delivery.publishing.max_message_size, 16 << 20);

    let new = run(&[
        "--status-interval",
        "250ms",
        "--heartbeat-interval",
        "0",
        "--confirm-timeout",
        "1m",
        "--max-backoff",
        "2s",
        "--shutdown-timeout",
        "1.5s",
        "--max-message-size",
        "512KiB",
    ])
    .expect("new names");
    assert_eq!(new.status_interval(), Duration::from_millis(250));
    assert_eq!(new.heartbeat_interval(), None, "0 turns heartbeats off");
    assert_eq!(
        new.delivery.publishing.confirm_timeout(),
        Duration::from_secs(60)
    );
    assert_eq!(new.delivery.max_backoff(), Duration::from_secs(2));
    assert_eq!(new.delivery.shutdown_timeout(), Duration::from_millis(1500));
    assert_eq!(new.delivery.publishing.max_message_size, 512 << 10);

    let old = run(&[
        "--status-interval-ms",
        "50",
        "--heartbeat-interval-secs",
        "3",
        "--confirm-timeout-secs",
        "5",
        "--max-backoff-secs",
        "2",
        "--shutdown-timeout-secs",
        "7",
        "--max-message-size",
        "1048576",
    ])
    .expect("old names");
    assert_eq!(
        old.status_interval(),
        Duration::from_millis(50),
        "ms, the old unit"
    );
    assert_eq!(old.heartbeat_interval(), Some(Duration::from_secs(3)));
    assert_eq!(
        old.delivery.publishing.confirm_timeout(),
        Duration::from_secs(5)
    );
    assert_eq!(old.delivery.max_backoff(), Duration::from_secs(2));
    assert_eq!(old.delivery.shutdown_timeout(), Duration::from_secs(7));
    assert_eq!(old.delivery.publishing.max_message_size, 1 << 20);
    let with_unit = run(&["--confirm-timeout-secs", "30s"]).expect("a unit on the old name");
    assert_eq!(
        with_unit.delivery.publishing.confirm_timeout(),
        Duration::from_secs(30)
    );

    for (new, old) in [
        ("--confirm-timeout", "--confirm-timeout-secs"),
        ("--status-interval", "--status-interval-ms"),
    ] {
        assert!(run(&[new, "5", old, "5"]).is_err(), "{new} with {old}");
    }
    assert!(run(&["--status-interval", "20s"]).is_err(), "over 10s");
    assert!(run(&["--max-message-size", "16 parsecs"]).is_err());

    // The setup's first-connection retry, and the variable's old name in seconds.
    let setup = Cli::try_parse_from([
        "outbox-relay",
        "setup",
        "--database-url",
        "postgres://x",
        "--connect-timeout",
        "90s",
    ])
    .expect("setup");
    let Command::Setup(setup) = setup.command else {
        panic!("expected setup");
    };
    assert_eq!(setup.connect_timeout(), Duration::from_secs(90));
}

#[test]
fn sizes_take_binary_and_decimal_units() {
    use super::tuning::parse_size;
    assert_eq!(parse_size("16MiB"), Ok(16 << 20));
    assert_eq!(parse_size("16 mib"), Ok(16 << 20));
    assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
    assert_eq!(parse_size("1kB"), Ok(1_000));
    assert_eq!(parse_size("123"), Ok(123));
    assert!(parse_size("MiB").is_err());
    assert!(parse_size("1.5MiB").is_err(), "whole numbers only");
    assert!(parse_size("99999999999GiB").is_err(), "too large");
}

#[test]
fn durations_parse_with_units() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert!(parse_duration("soon").is_err());
    // Before humantime, days were an unknown unit; an unknown unit still is.
    assert!(parse_duration("5x").is_err());
}

/// Every spelling the hand-written parser accepted still means what it meant.
#[test]
fn durations_keep_every_spelling_accepted_before_humantime_and_add_its_own() {
    let ms = Duration::from_millis;
    for (text, expected) in [
        // A bare number is seconds, decimals included.
        ("0", ms(0)),
        ("60", ms(60_000)),
        ("1.5", ms(1500)),
        (".5", ms(500)),
        ("2.", ms(2000)),
        // Each unit, whole and decimal, with and without a space before it.
        ("250ms", ms(250)),
        ("0.5ms", Duration::from_micros(500)),
        ("1s", ms(1000)),
        ("1.5s", ms(1500)),
        ("1.5 s", ms(1500)),
        ("2m", ms(120_000)),
        ("2 m", ms(120_000)),
        ("1.5m", ms(90_000)),
        ("3min", ms(180_000)),
        ("0.5min", ms(30_000)),
        ("1h", ms(3_600_000)),
        ("0.5h", ms(1_800_000)),
        ("0.5 h", ms(1_800_000)),
        // Surrounding spaces.
        ("  5s  ", ms(5000)),
        (" 10 ", ms(10_000)),
        // And humantime's own spellings.
        ("1h 30m", ms(5_400_000)),
        ("1min 5s", ms(65_000)),
        ("2days", ms(172_800_000)),
        ("7d", ms(604_800_000)),
    ] {
        assert_eq!(parse_duration(text), Ok(expected), "{text:?}");
    }
}

#[test]
fn duration_errors_say_what_is_accepted() {
    let e = parse_duration("soon").expect_err("not a number");
    assert!(e.contains("1s, 250ms, 5m or 1h"), "{e}");
    let e = parse_duration("1.5x").expect_err("unknown unit");
    assert!(
        e.contains("unknown unit \"x\"") && e.contains("ms, s, m or h"),
        "{e}"
    );
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("").is_err());
    assert!(parse_duration("1e400h").is_err());
}

#[test]
fn table_parts_default_to_public() {
    let table = TableName::from("outbox");
    assert_eq!(table.table_parts(), ("public", "outbox"));
    let table = TableName::from("app.events");
    assert_eq!(table.table_parts(), ("app", "events"));
    assert_eq!(table.qualified_table(), "\"app\".\"events\"");
}

/// A secret file with `text` and `mode`, in a directory that lives as long as the guard.
fn secret_file(text: &str, mode: u32) -> (tempfile::TempDir, Option<String>) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("url");
    std::fs::write(&path, text).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let path = Some(path.display().to_string());
    (dir, path)
}

#[test]
fn secret_comes_from_the_value_or_the_file() {
    let (_dir, file) = secret_file("postgres://from-file\n", 0o600);
    assert_eq!(
        secret("x", "X_URL", &Some(" v ".into()), &None).expect("value"),
        "v"
    );
    assert_eq!(
        secret("x", "X_URL", &None, &file).expect("file"),
        "postgres://from-file"
    );
    assert!(secret("x", "X_URL", &None, &None).is_err());
}

#[test]
fn an_empty_secret_is_absent_and_the_error_names_the_variable() {
    for blank in ["", "  ", "\n"] {
        let e = secret("database URL", "DATABASE_URL", &Some(blank.into()), &None)
            .expect_err("a blank URL is no URL")
            .to_string();
        assert!(
            e.contains("No database URL given: DATABASE_URL (or --database-url) is empty")
                && e.contains("DATABASE_URL_FILE (or --database-url-file) is not set"),
            "{e}"
        );
        // A blank *_FILE path is absent too.
        let e = secret("AMQP URL", "AMQP_URL", &None, &Some(blank.into()))
            .expect_err("a blank path is no file")
            .to_string();
        assert!(
            e.contains("AMQP_URL (or --amqp-url) is not set")
                && e.contains("AMQP_URL_FILE (or --amqp-url-file) is empty"),
            "{e}"
        );
    }
    // A blank value beside a file: the file is the one given.
    let (_dir, file) = secret_file("amqp://from-file", 0o600);
    assert_eq!(
        secret("AMQP URL", "AMQP_URL", &Some(String::new()), &file).expect("file"),
        "amqp://from-file"
    );
    // A blank file is absent too, and the error names the file (never its content).
    let (_dir, file) = secret_file(" \n", 0o600);
    let e = secret("database URL", "DATABASE_URL", &None, &file)
        .expect_err("an empty file holds no URL")
        .to_string();
    let path = file.as_deref().expect("path");
    assert!(
        e.contains(&format!("The file {path}, named by DATABASE_URL_FILE"))
            && e.contains("is empty"),
        "{e}"
    );
}

#[test]
fn a_secret_given_as_value_and_as_file_is_an_error_naming_both() {
    let (_dir, file) = secret_file("postgres://from-file", 0o600);
    let e = secret(
        "database URL",
        "DATABASE_URL",
        &Some("postgres://u:s3cret@db/app".into()),
        &file,
    )
    .expect_err("given twice")
    .to_string();
    assert!(
        e.contains("DATABASE_URL (or --database-url)")
            && e.contains("DATABASE_URL_FILE (or --database-url-file"),
        "{e}"
    );
    assert!(!e.contains("s3cret") && !e.contains("from-file"), "{e}");
}

/// Everything logged at WARN or above while `f` runs, as text.
fn warnings_of<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&buffer.0.lock().expect("lock")).into_owned();
    (result, text)
}

#[test]
fn a_secret_file_others_may_read_is_warned_about_by_name_not_content() {
    for (mode, warned) in [(0o600, false), (0o400, false), (0o640, true), (0o644, true)] {
        let (_dir, file) = secret_file("amqp://u:s3cret@h/%2f", mode);
        let (url, log) = warnings_of(|| secret("AMQP URL", "AMQP_URL", &None, &file));
        assert_eq!(url.expect("read"), "amqp://u:s3cret@h/%2f");
        let path = file.as_deref().expect("path");
        if warned {
            assert!(
                log.contains("WARN") && log.contains(path),
                "{mode:o}: {log}"
            );
            assert!(log.contains(&format!("chmod 600 {path}")), "{log}");
        } else {
            assert!(log.is_empty(), "{mode:o}: {log}");
        }
        assert!(!log.contains("s3cret"), "{log}");
    }
    assert!(!readable_by_others(0o100600));
    assert!(readable_by_others(0o100604));
}

/// The parse error for `flag value` on `command`, as clap prints it.
fn name_error(command: &str, flag: &str, value: &str) -> String {
    let argv = [
        "outbox-relay",
        command,
        "--database-url",
        "postgres://x",
        flag,
        value,
    ];
    match Cli::try_parse_from(argv) {
        Ok(_) => panic!("{command} {flag} {value:?} must be refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn hostile_names_are_refused_naming_the_flag() {
    let cases: &[(&str, &str, &str, &str)] = &[
        // (command, flag, value, what the error says)
        (
            "setup",
            "--publication",
            "p$$; DROP TABLE users; DO $$",
            "'$'",
        ),
        ("setup", "--publication", "p\nDROP TABLE users;", "U+000A"),
        ("setup", "--publication", "", "empty"),
        (
            "setup",
            "--publication",
            &"p".repeat(64),
            "at most 63 bytes",
        ),
        (
            "setup",
            "--table",
            "outbox\n; DROP TABLE users; --",
            "U+000A",
        ),
        ("setup", "--table", "app.", "empty"),
        ("setup", "--table", ".outbox", "empty"),
        ("setup", "--table", "db.app.outbox", "more than one '.'"),
        ("setup", "--table", "a$b.outbox", "'$'"),
        (
            "setup",
            "--table",
            &format!("app.{}", "t".repeat(64)),
            "at most 63 bytes",
        ),
        (
            "setup",
            "--slot",
            "Outbox_Slot",
            "lower-case letters, digits and underscores",
        ),
        (
            "setup",
            "--slot",
            "slot'); DROP TABLE users; --",
            "lower-case letters",
        ),
        ("setup", "--slot", &"s".repeat(64), "at most 63 bytes"),
        ("setup", "--slot", "", "empty"),
        ("run", "--exchange", "", "empty"),
        ("run", "--exchange", "ex\r\nchange", "U+000D"),
        ("run", "--exchange", "ex\u{1b}[31m", "U+001B"),
        ("run", "--exchange", &"e".repeat(256), "at most 255"),
        ("run", "--dead-letter-exchange", "dlx\n", "U+000A"),
        (
            "run",
            "--allowed-exchanges",
            "a,b\u{1b}[2J",
            "\"b\\u{1b}[2J\": the name holds the control character U+001B",
        ),
        ("poll", "--allowed-exchanges", "a,b$", "'$'"),
        ("poll", "--listen-channel", "ch$$", "'$'"),
        ("poll", "--table", "tab\tle", "U+0009"),
        ("status", "--slot", "a-b", "lower-case letters"),
        ("teardown", "--publication", "p\u{7f}", "U+007F"),
        ("resync", "--table", "", "empty"),
    ];
    for (command, flag, value, reason) in cases {
        let e = name_error(command, flag, value);
        assert!(
            e.contains(&format!("'{flag} <")),
            "{command} {flag} {value:?}: {e}"
        );
        assert!(e.contains(reason), "{command} {flag} {value:?}: {e}");
    }
}

#[test]
fn unusual_names_postgresql_takes_quoted_are_accepted() {
    let argv = [
        "outbox-relay",
        "setup",
        "--table",
        "My Schema.Évents \"quoted\" 'x'",
        "--publication",
        "Pub; DROP TABLE users; -- 100%",
        "--slot",
        "slot_0",
        "--exchange",
        "events.topic:v1 ünïcode",
        "--dead-letter-exchange",
        "",
    ];
    let Command::Setup(setup) = Cli::try_parse_from(argv).expect("parses").command else {
        panic!("expected setup");
    };
    assert_eq!(
        setup.names.table_parts(),
        ("My Schema", "Évents \"quoted\" 'x'")
    );
    assert_eq!(setup.names.publication, "Pub; DROP TABLE users; -- 100%");
    // Exactly 63 bytes is PostgreSQL's limit, and ours.
    let longest = "s".repeat(63);
    assert_eq!(parse_slot_name(&longest), Ok(longest.clone()));
    assert_eq!(parse_identifier(&longest), Ok(longest));
}

#[test]
fn a_sharded_relay_needs_its_shard_below_the_count() {
    let shard = |extra: &[&str]| {
        let mut args = vec!["outbox-relay", "run", "--database-url", "postgres://x"];
        args.extend_from_slice(extra);
        let Command::Run(run) = Cli::try_parse_from(args).expect("parses").command else {
            panic!("expected run");
        };
        crate::assembly::shard(&run.shard)
    };
    assert_eq!(shard(&[]).expect("default"), crate::shard::Shard::UNSHARDED);
    assert_eq!(
        shard(&["--shard", "0"]).expect("shard 0 of 1"),
        crate::shard::Shard::UNSHARDED
    );
    let two_of_four = shard(&["--shards", "4", "--shard", "2"]).expect("2 of 4");
    assert_eq!((two_of_four.index(), two_of_four.count()), (2, 4));
    let e = crate::advice::report(&shard(&["--shards", "3"]).expect_err("no --shard"));
    assert!(
        e.contains("--shards is 3 but no --shard") && e.contains("OUTBOX_SHARD"),
        "{e}"
    );
    let e = shard(&["--shards", "3", "--shard", "3"])
        .expect_err("K < N")
        .to_string();
    assert!(e.contains("--shard is 3 but --shards is 3"), "{e}");
    assert!(shard(&["--shard", "1"]).is_err(), "shard 1 of 1");
    for refused in [["--shards", "0"], ["--shards", "65"]] {
        let mut args = vec!["outbox-relay", "run", "--database-url", "postgres://x"];
        args.extend_from_slice(&refused);
        assert!(Cli::try_parse_from(args).is_err(), "{refused:?}");
    }
    // Only the commands that provision, read, drop or stream slots take --shards.
    for command in ["poll", "resync"] {
        let args = ["outbox-relay", command, "--shards", "2"];
        assert!(Cli::try_parse_from(args).is_err(), "{command}");
    }
}

#[test]
fn dead_letter_policy_defaults_to_halt_and_needs_an_exchange() {
    let run = |extra: &[&str]| {
        let mut args = vec!["outbox-relay", "run", "--database-url", "postgres://x"];
        args.extend_from_slice(extra);
        let Command::Run(run) = Cli::try_parse_from(args).expect("parses").command else {
            panic!("expected run");
        };
        run.dead_letter
    };
    let halt = run(&[]);
    assert_eq!(halt.on_unroutable, OnUnroutable::Halt);
    assert_eq!(halt.exchange("outbox").expect("halt"), None);
    let dead_letter = run(&["--on-unroutable", "dead-letter"]);
    let e = crate::advice::report(&dead_letter.exchange("outbox").expect_err("no exchange"));
    assert!(e.contains("--dead-letter-exchange"), "{e}");
    let same = run(&[
        "--on-unroutable",
        "dead-letter",
        "--dead-letter-exchange",
        "outbox",
    ]);
    assert!(same.exchange("outbox").is_err());
    let dlx = run(&[
        "--on-unroutable",
        "dead-letter",
        "--dead-letter-exchange",
        "outbox.dlx",
    ]);
    assert_eq!(
        dlx.exchange("outbox").expect("dead-letter"),
        Some("outbox.dlx".to_string())
    );
}

/// `--table-layout` and `--column` on every command that reads the table; `--column` is
/// repeatable and takes comma-separated lists (as OUTBOX_COLUMNS does), over the preset.
#[test]
fn column_map_flags_reach_every_command_that_reads_the_table() {
    use crate::contract::columns::{CREATED_AT, EVENT_TYPE, HEADERS};
    let db = ["--database-url", "postgres://x"];
    let mapped = [
        "--table-layout",
        "debezium",
        "--column",
        "created_at=occurred_at,headers=meta",
        "--column",
        "event_type=kind",
    ];
    for command in ["setup", "run", "poll", "status", "resync"] {
        let mut argv = vec![command];
        argv.extend(db);
        if command == "resync" {
            argv.extend(["--since", "2024-05-01T12:00:00Z"]);
        }
        argv.extend(mapped);
        let cli = parse(&argv).unwrap_or_else(|e| panic!("{command}: {e}"));
        let columns = match &cli.command {
            Command::Setup(args) => &args.columns,
            Command::Run(args) => &args.columns,
            Command::Poll(args) => &args.columns,
            Command::Status(args) => &args.columns,
            Command::Resync(args) => &args.columns,
            Command::Teardown(_) | Command::Check(_) => unreachable!("not parsed"),
        };
        let map = columns.map().expect("map");
        assert_eq!(map.column(EVENT_TYPE), Some("kind"), "{command}");
        assert_eq!(map.column(CREATED_AT), Some("occurred_at"), "{command}");
        assert_eq!(map.column(HEADERS), Some("meta"), "{command}");
    }
    // teardown reads no table: clap refuses the flags there.
    let mut argv = vec!["teardown"];
    argv.extend(db);
    argv.extend(["--table-layout", "debezium"]);
    assert!(parse(&argv).is_err());

    let mut argv = vec!["run"];
    argv.extend(db);
    argv.extend(["--column", "evnt_type=type"]);
    let Command::Run(args) = parse(&argv).expect("parses").command else {
        unreachable!("run")
    };
    let error = args
        .columns
        .map()
        .expect_err("unknown contract column")
        .to_string();
    assert!(error.contains("--column \"evnt_type=type\""), "{error}");
}

/// `check` takes `run`'s flags (with `--mode poll`, `poll`'s) and parses them with that
/// command's own definition: what it refuses, `check` refuses.
#[test]
fn check_parses_the_flags_of_the_relay_it_checks() {
    let relay = |argv: &[&str]| {
        let mut full = vec!["outbox-relay", "check"];
        full.extend(argv);
        let Command::Check(args) = Cli::try_parse_from(full).expect("check parses").command else {
            unreachable!("check")
        };
        args.parse_relay()
    };
    let db = [
        "--database-url",
        "postgres://u@h/db",
        "--amqp-url",
        "amqp://h",
    ];
    let mut argv = db.to_vec();
    argv.extend(["--slot", "s1", "--peer-timeout", "9s"]);
    let Ok(CheckedRelay::Run(run)) = relay(&argv) else {
        panic!("check without --mode takes run's flags")
    };
    assert_eq!(&*run.names.slot, "s1");
    assert_eq!(run.peer_timeout.peer_timeout, Duration::from_secs(9));

    let mut argv = vec!["--mode", "poll"];
    argv.extend(db);
    argv.extend(["--workers", "3"]);
    let Ok(CheckedRelay::Poll(poll)) = relay(&argv) else {
        panic!("check --mode poll takes poll's flags")
    };
    assert_eq!(poll.workers, 3);

    // run's flag under poll, poll's under run, and a typo: refused, as the commands do.
    let mut argv = vec!["--mode", "poll"];
    argv.extend(["--slot", "s1"]);
    assert!(relay(&argv).is_err());
    assert!(relay(&["--workers", "3"]).is_err());
    assert!(relay(&["--slott", "s1"]).is_err());
}
