//! The packaging files against the binary they package: every `outbox-relay` command, flag
//! and environment variable that docker-compose.yml, the Dockerfile and the files of deploy/
//! (Kubernetes manifests, the systemd unit) use must be one the binary's own `--help` lists,
//! so none of them can drift from the code; the compose file is valid (`docker-compose
//! config`, no Docker engine needed) and keeps the properties a first `docker compose up`
//! depends on; its healthcheck works against a running relay; scripts/check-deploy.sh
//! passes (the deploy files checked by promtool, kubernetes-validate and systemd-analyze).
//!
//! No servers: the relay in the healthcheck test points at closed ports and only serves its
//! endpoints while it retries.

use outbox_testkit as common;

mod image;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::http::wait_http;
use common::{free_port, RelayProcess};
use serde_yaml_ng::Value;

/// The image the compose file builds from the Dockerfile's `relay` stage.
const RELAY_STAGE: &str = "relay";

/// Variables the relay reads that are not flags (the log filter, Rust's own).
const NOT_FLAGS: [&str; 2] = ["RUST_LOG", "RUST_BACKTRACE"];

fn repo_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(repo_file(name)).unwrap_or_else(|e| panic!("read {name}: {e}"))
}

/// `outbox-relay <args> --help`, with none of the relay's variables set (clap prints a set
/// variable's value next to its name).
fn help(args: &[&str]) -> String {
    let out = Command::new(common::relay::binary())
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .expect("run outbox-relay --help");
    assert!(out.status.success(), "{args:?} --help: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// What the binary says it accepts.
struct Cli {
    /// Top-level help: its commands and global options.
    top: String,
    commands: BTreeSet<String>,
}

impl Cli {
    fn load() -> Cli {
        let top = help(&[]);
        let commands = top
            .lines()
            .skip_while(|line| line.trim() != "Commands:")
            .skip(1)
            .take_while(|line| !line.trim().is_empty())
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| *name != "help")
            .map(String::from)
            .collect();
        Cli { top, commands }
    }

    /// The help of `command`, global options included; panics naming `what` if there is
    /// no such command.
    fn command_help(&self, command: &str, what: &str) -> String {
        assert!(
            self.commands.contains(command),
            "{what}: `outbox-relay {command}` is not a command (commands: {:?})",
            self.commands
        );
        help(&[command])
    }

    /// Checks `outbox-relay <args>` (`args[0]` the command): every `--flag` is one of its
    /// options.
    fn check_invocation(&self, args: &[String], what: &str) {
        let Some(command) = args.first() else {
            panic!("{what}: no command");
        };
        let help = self.command_help(command, what);
        let options = options(&help);
        for arg in &args[1..] {
            let Some(flag) = arg.strip_prefix("--") else {
                continue;
            };
            let flag = flag.split('=').next().unwrap_or(flag);
            assert!(
                options.contains(flag),
                "{what}: `outbox-relay {command}` has no --{flag} (see its --help)"
            );
        }
    }

    /// Checks that `command` reads the environment variable `name`.
    fn check_env(&self, command: &str, name: &str, what: &str) {
        if NOT_FLAGS.contains(&name) {
            return;
        }
        let help = self.command_help(command, what);
        assert!(
            help_names_env(&help, name),
            "{what}: `outbox-relay {command}` reads no {name} (see its --help)"
        );
    }

    /// Whether any command (or the global options) reads `name`.
    fn any_reads(&self, name: &str) -> bool {
        help_names_env(&self.top, name)
            || self
                .commands
                .iter()
                .any(|command| help_names_env(&help(&[command]), name))
    }
}

/// The long options a help text lists (`--database-url <DATABASE_URL>` gives `database-url`).
fn options(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|line| line.trim_start().starts_with('-'))
        .flat_map(|line| line.split([' ', ',']))
        .filter_map(|word| word.strip_prefix("--"))
        .map(String::from)
        .collect()
}

/// clap prints `[env: NAME]`, or `[env: NAME=value]` for a variable shown with its value.
fn help_names_env(help: &str, name: &str) -> bool {
    help.contains(&format!("[env: {name}]")) || help.contains(&format!("[env: {name}="))
}

fn compose() -> Value {
    let mut compose: Value =
        serde_yaml_ng::from_str(&read("docker-compose.yml")).expect("docker-compose.yml is YAML");
    // `<<: *anchor` merges, as compose applies them.
    compose.apply_merge().expect("merge keys");
    compose
}

fn services(compose: &Value) -> Vec<(String, &Value)> {
    compose["services"]
        .as_mapping()
        .expect("services")
        .iter()
        .map(|(name, service)| (name.as_str().expect("service name").to_string(), service))
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::Sequence(items) => items
            .iter()
            .map(|item| item.as_str().expect("a string").to_string())
            .collect(),
        Value::String(text) => text.split_whitespace().map(String::from).collect(),
        _ => Vec::new(),
    }
}

fn env_keys(service: &Value) -> Vec<String> {
    match &service["environment"] {
        Value::Mapping(map) => map
            .keys()
            .map(|key| key.as_str().expect("variable name").to_string())
            .collect(),
        Value::Sequence(items) => items
            .iter()
            .map(|item| {
                let entry = item.as_str().expect("NAME=value");
                entry.split('=').next().unwrap_or(entry).to_string()
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn env_value<'a>(service: &'a Value, name: &str) -> Option<&'a str> {
    service["environment"][name].as_str()
}

/// The image the compose file builds from the Dockerfile's relay stage, and the services
/// that run it.
fn relay_services(compose: &Value) -> (String, Vec<(String, &Value)>) {
    let builders: Vec<(String, &Value)> = services(compose)
        .into_iter()
        .filter(|(_, service)| service["build"]["target"].as_str() == Some(RELAY_STAGE))
        .collect();
    assert_eq!(
        builders.len(),
        1,
        "exactly one service builds the relay's image, the others run it by `image:` (built \
         once): {:?}",
        builders.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    let image = builders[0].1["image"]
        .as_str()
        .expect("the relay build names its image")
        .to_string();
    let running = services(compose)
        .into_iter()
        .filter(|(_, service)| service["image"].as_str() == Some(image.as_str()))
        .collect();
    (image, running)
}

/// The Dockerfile's stages: name (or base image) and instruction lines, continuations
/// joined.
fn dockerfile_stages() -> Vec<(String, Vec<String>)> {
    let text = read("Dockerfile");
    let mut lines: Vec<String> = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    let mut stages: Vec<(String, Vec<String>)> = Vec::new();
    for line in lines {
        if let Some(from) = line.strip_prefix("FROM ") {
            let name = from.split(" AS ").nth(1).unwrap_or(from).trim().to_string();
            stages.push((name, Vec::new()));
        } else if let Some((_, body)) = stages.last_mut() {
            body.push(line);
        }
    }
    stages
}

/// The arguments of an exec-form instruction (`CMD ["run"]`).
fn exec_form(line: &str, instruction: &str) -> Vec<String> {
    let json = line
        .strip_prefix(instruction)
        .expect("the instruction")
        .trim();
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{line}: not exec form ({e})"))
}

// ---------------------------------------------------------------------------------------

#[test]
fn compose_file_is_valid_for_docker_compose() {
    // Debian's docker-compose (1.29) validates and resolves the file without an engine;
    // scripts/test.sh installs it.
    let out = Command::new("docker-compose")
        .args(["--project-directory", env!("CARGO_MANIFEST_DIR"), "-f"])
        .arg(repo_file("docker-compose.yml"))
        .args(["config", "-q"])
        .output()
        .unwrap_or_else(|e| {
            panic!("run docker-compose ({e}): install it (`apt-get install docker-compose`, as scripts/test.sh does)")
        });
    assert!(
        out.status.success(),
        "docker-compose config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn compose_uses_only_commands_flags_and_variables_the_relay_has() {
    let cli = Cli::load();
    let compose = compose();
    let (image, running) = relay_services(&compose);
    assert!(
        running.len() >= 2,
        "setup and relay run {image}: {running:?}"
    );
    let default_command = dockerfile_cmd();
    for (name, service) in &running {
        let what = format!("docker-compose.yml service {name}");
        let mut args = strings(&service["command"]);
        if args.is_empty() {
            args = default_command.clone();
        }
        cli.check_invocation(&args, &what);
        for key in env_keys(service) {
            cli.check_env(&args[0], &key, &what);
        }
        let probe = strings(&service["healthcheck"]["test"]);
        if let Some(at) = probe.iter().position(|word| word == "outbox-relay") {
            cli.check_invocation(&probe[at + 1..], &format!("{what} healthcheck"));
        }
    }
    // Anywhere in the file (other services, comments): no variable the relay lost.
    for name in relay_variables(&read("docker-compose.yml")) {
        assert!(
            cli.any_reads(&name),
            "docker-compose.yml names {name}, which no outbox-relay command reads"
        );
    }
}

#[test]
fn dockerfile_uses_only_commands_and_variables_the_relay_has_and_ships_it_alone() {
    let cli = Cli::load();
    let stages = dockerfile_stages();
    let last = stages.last().expect("stages");
    assert_eq!(last.0, RELAY_STAGE, "the relay is the default (last) stage");
    let relay = &last.1;
    let entrypoint = relay
        .iter()
        .find(|line| line.starts_with("ENTRYPOINT "))
        .expect("ENTRYPOINT");
    assert_eq!(exec_form(entrypoint, "ENTRYPOINT"), ["outbox-relay"]);
    cli.check_invocation(&dockerfile_cmd(), "Dockerfile CMD");
    for line in relay.iter().filter(|line| line.starts_with("HEALTHCHECK ")) {
        let words: Vec<String> = line.split_whitespace().map(String::from).collect();
        if let Some(at) = words.iter().position(|word| word == "outbox-relay") {
            cli.check_invocation(&words[at + 1..], "Dockerfile HEALTHCHECK");
        }
    }
    for name in relay_variables(&read("Dockerfile")) {
        assert!(
            cli.any_reads(&name),
            "the Dockerfile names {name}, which no outbox-relay command reads"
        );
    }

    // The image holds the relay's binary and nothing else of ours, stripped when installed.
    let copies: Vec<&String> = relay
        .iter()
        .filter(|line| line.starts_with("COPY "))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert!(
        copies[0].ends_with("/usr/local/bin/outbox-relay /usr/local/bin/"),
        "the relay image copies something else: {}",
        copies[0]
    );
    let from = copies[0]
        .split_whitespace()
        .find_map(|word| word.strip_prefix("--from="))
        .expect("COPY --from");
    let build = &stages
        .iter()
        .find(|(name, _)| name == from)
        .expect("the build stage")
        .1;
    assert!(
        build
            .iter()
            .any(|line| line.contains("-p outbox-relay --bin outbox-relay")
                && line.contains("install -s ")),
        "{from} builds only the relay and installs it stripped: {build:?}"
    );
}

#[test]
fn compose_waits_for_postgres_over_tcp_and_watches_the_relay() {
    let compose = compose();
    let postgres = &compose["services"]["postgres"];
    let probe = strings(&postgres["healthcheck"]["test"]).join(" ");
    assert!(
        probe.contains("pg_isready") && probe.contains("-h "),
        "pg_isready over TCP, not the Unix socket the init server listens on: {probe}"
    );
    let command = strings(&postgres["command"]).join(" ");
    assert!(
        command.contains("wal_level=logical") && command.contains("max_slot_wal_keep_size="),
        "{command}"
    );

    let (_, running) = relay_services(&compose);
    let service = |wanted: &str| {
        running
            .iter()
            .find(|(name, _)| name == wanted)
            .map(|(_, service)| *service)
            .unwrap_or_else(|| panic!("no relay service {wanted}"))
    };
    let setup = service("setup");
    let timeout: u64 = env_value(setup, "OUTBOX_CONNECT_TIMEOUT")
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(0);
    assert!(timeout > 0, "setup retries its first connection");

    let relay = service("relay");
    assert_eq!(
        env_value(relay, "OUTBOX_METRICS_ADDR"),
        Some("0.0.0.0:9187")
    );
    let ports = strings(&relay["ports"]);
    assert!(
        ports.iter().any(|port| port.ends_with(":9187")),
        "{ports:?}"
    );
    let probe = strings(&relay["healthcheck"]["test"]).join(" ");
    assert!(probe.contains("/healthz"), "{probe}");
}

/// The compose file's healthcheck, as the container runs it (`bash -c …`), passes while a
/// relay serves /healthz and fails once none does. The relay points at closed ports: it
/// serves its endpoints while it retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_healthcheck_passes_against_a_running_relay() {
    let compose = compose();
    let probe = strings(&compose["services"]["relay"]["healthcheck"]["test"]);
    assert_eq!(
        probe.first().map(String::as_str),
        Some("CMD"),
        "the relay service has an exec-form healthcheck: {probe:?}"
    );
    let port = free_port();
    let probe: Vec<String> = probe[1..]
        .iter()
        .map(|word| word.replace("/9187", &format!("/{port}")))
        .collect();
    assert!(
        probe.iter().any(|word| word.contains(&format!("/{port}"))),
        "the healthcheck does not name the metrics port /9187: {probe:?}"
    );

    let addr = format!("127.0.0.1:{port}");
    let relay = RelayProcess::spawn(
        &[
            "run",
            "--database-url",
            "postgres://relay@127.0.0.1:1/app",
            "--amqp-url",
            "amqp://127.0.0.1:1",
            "--metrics-addr",
            &addr,
        ],
        &[],
    );
    let healthz = wait_http(port, "/healthz", Duration::from_secs(30), |a| a.0 == 200).await;
    assert_eq!(healthz.map(|a| a.0), Some(200), "{}", relay.log());
    let run_probe = || {
        Command::new(&probe[0])
            .args(&probe[1..])
            .status()
            .expect("run the healthcheck")
    };
    assert!(run_probe().success(), "healthy: {probe:?}");
    relay.kill9();
    assert!(!run_probe().success(), "no relay, not healthy: {probe:?}");
}

/// The Dockerfile's default command for the relay image.
fn dockerfile_cmd() -> Vec<String> {
    let stages = dockerfile_stages();
    let relay = &stages
        .iter()
        .find(|(name, _)| name == RELAY_STAGE)
        .expect("relay stage")
        .1;
    let cmd = relay
        .iter()
        .find(|line| line.starts_with("CMD "))
        .expect("CMD");
    exec_form(cmd, "CMD")
}

/// The names in `text` that look like the relay's variables: `OUTBOX_*` (less the test
/// harness's `OUTBOX_TEST_*`), and `DATABASE_URL` / `AMQP_URL` with their `_FILE` forms.
fn relay_variables(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|word| {
            (word.starts_with("OUTBOX_") && !word.starts_with("OUTBOX_TEST_"))
                || [
                    "DATABASE_URL",
                    "DATABASE_URL_FILE",
                    "AMQP_URL",
                    "AMQP_URL_FILE",
                ]
                .contains(word)
        })
        .map(String::from)
        .collect()
}

// ---------------------------------------------------------------------------------------
// deploy/

/// The Kubernetes manifests (deploy/kubernetes/, examples/ too): each file's name and text.
fn kubernetes_files() -> Vec<(String, String)> {
    fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read deploy/kubernetes") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                yaml_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    yaml_files(&repo_file("deploy/kubernetes"), &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let name = path
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .expect("in the repository")
                .display()
                .to_string();
            let text = read(&name);
            (name, text)
        })
        .collect()
}

/// Every YAML document of a file.
fn yaml_documents(name: &str, text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|document| {
            <Value as serde::Deserialize>::deserialize(document)
                .unwrap_or_else(|e| panic!("{name}: not YAML: {e}"))
        })
        .filter(|value| !value.is_null())
        .collect()
}

#[test]
fn deploy_files_use_only_commands_flags_and_variables_the_relay_has() {
    let cli = Cli::load();
    let files = kubernetes_files();
    let documents: Vec<(&String, Value)> = files
        .iter()
        .flat_map(|(name, text)| {
            yaml_documents(name, text)
                .into_iter()
                .map(move |doc| (name, doc))
        })
        .collect();
    // Anywhere in the manifests (comments too): no variable the relay lost.
    for (name, text) in &files {
        for variable in relay_variables(text) {
            assert!(
                cli.any_reads(&variable),
                "{name} names {variable}, which no outbox-relay command reads"
            );
        }
    }
    let config_maps: Vec<&Value> = documents
        .iter()
        .map(|(_, doc)| doc)
        .filter(|doc| doc["kind"].as_str() == Some("ConfigMap"))
        .collect();
    let mut commands = BTreeSet::new();
    for (file, doc) in &documents {
        let containers = doc["spec"]["template"]["spec"]["containers"].as_sequence();
        for container in containers.into_iter().flatten() {
            let what = format!(
                "{file} container {}",
                container["name"].as_str().unwrap_or("?")
            );
            assert!(
                container["command"].is_null(),
                "{what}: the image's entrypoint runs the relay; give `args` only"
            );
            let mut args = strings(&container["args"]);
            if args.is_empty() {
                args = dockerfile_cmd();
            }
            cli.check_invocation(&args, &what);
            for variable in container["env"].as_sequence().into_iter().flatten() {
                let name = variable["name"].as_str().expect("env name");
                cli.check_env(&args[0], name, &what);
            }
            // A ConfigMap's keys become variables of every container that takes it whole.
            for source in container["envFrom"].as_sequence().into_iter().flatten() {
                let name = source["configMapRef"]["name"]
                    .as_str()
                    .expect("configMapRef");
                let map = config_maps
                    .iter()
                    .find(|map| map["metadata"]["name"].as_str() == Some(name))
                    .unwrap_or_else(|| panic!("{what}: no ConfigMap {name} in deploy/kubernetes"));
                for key in map["data"].as_mapping().into_iter().flat_map(|m| m.keys()) {
                    let key = key.as_str().expect("ConfigMap key");
                    cli.check_env(&args[0], key, &format!("{what} (ConfigMap {name})"));
                }
            }
            commands.insert(args[0].clone());
        }
    }
    assert!(
        commands.contains("run") && commands.contains("setup"),
        "deploy/kubernetes runs `run` and `setup`: {commands:?}"
    );

    // The systemd unit: ExecStart's arguments, Environment= names, and any variable it names.
    let unit = read("deploy/systemd/outbox-relay.service");
    let what = "deploy/systemd/outbox-relay.service";
    let exec: Vec<String> = unit
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("ExecStart=")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert!(
        exec[0].ends_with("/outbox-relay"),
        "{what}: ExecStart runs {}",
        exec[0]
    );
    cli.check_invocation(&exec[1..], what);
    for assignment in unit
        .lines()
        .filter_map(|line| line.strip_prefix("Environment="))
        .flat_map(str::split_whitespace)
    {
        let name = assignment.trim_matches('"').split('=').next().unwrap_or("");
        cli.check_env(&exec[1], name, what);
    }
    for name in relay_variables(&unit) {
        assert!(
            cli.any_reads(&name),
            "{what} names {name}, which no outbox-relay command reads"
        );
    }
}

/// scripts/check-deploy.sh: promtool, kubernetes-validate and systemd-analyze on deploy/,
/// and the metric names of the alerts and the dashboard. It installs what it misses (as
/// root on Debian 12) into /var/cache/outbox-relay.
#[test]
fn deploy_files_pass_check_deploy_sh() {
    let out = Command::new("bash")
        .arg(repo_file("scripts/check-deploy.sh"))
        .env("OUTBOX_RELAY_BIN", common::relay::binary())
        .output()
        .expect("run scripts/check-deploy.sh");
    assert!(
        out.status.success(),
        "scripts/check-deploy.sh failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
