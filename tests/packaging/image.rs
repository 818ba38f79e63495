//! The container images, run for real: built by scripts/build-image.sh from the Dockerfile's
//! stages and run with podman against the suite's PostgreSQL and RabbitMQ
//! (`scripts/test.sh --image` does both). Ignored by plain `cargo test`: building them needs
//! root, podman and a Debian mirror. Run without `OUTBOX_TEST_IMAGE_PREFIX` they fail, naming
//! the script, rather than pass.

use std::process::{Command, Output};
use std::time::Duration;

use super::common;
use common::amqp::{declare_bound_queue, declare_exchange, delete_queue, publish_confirmed};
use common::http::wait_http;
use common::output_text as text;
use common::pg::{pg_connect, query_value, wait_count};
use common::{free_port, services, unique_name, Consumer};

const DEADLINE: Duration = Duration::from_secs(60);
/// The user the Dockerfile's runtime stage makes and runs as.
const IMAGE_UID: &str = "10001";

/// `<prefix>/<binary>:dev`, as scripts/build-image.sh tags it.
fn image(binary: &str) -> String {
    let prefix = std::env::var("OUTBOX_TEST_IMAGE_PREFIX").unwrap_or_else(|_| {
        panic!(
            "OUTBOX_TEST_IMAGE_PREFIX is not set: build the images with scripts/build-image.sh \
             and run these tests with scripts/test.sh --image"
        )
    });
    format!("{prefix}/{binary}:dev")
}

/// `podman run` on the host's network (the suite's servers listen on its loopback) with the
/// runtime runc, and the open-file and process limits lowered to values any host allows:
/// podman's defaults raise them, which a host without CAP_SYS_RESOURCE refuses.
fn podman_run(env: &[(&str, &str)], extra: &[&str]) -> Command {
    let mut command = Command::new("podman");
    command.args(["--runtime", "runc", "run", "--network", "host"]);
    command.args([
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ]);
    for (name, value) in env {
        command.args(["--env", &format!("{name}={value}")]);
    }
    command.args(extra);
    command
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("run podman")
}

/// A container's log, for a failure's message.
fn logs(container: &str) -> String {
    text(&podman(&["logs", container]))
}

/// Runs a command of `image` to its end: it must exit 0.
fn run_once(image: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut extra = vec!["--rm", image];
    extra.extend_from_slice(args);
    let output = podman_run(env, &extra).output().expect("run podman");
    assert!(
        output.status.success(),
        "{image} {args:?}: {}\n{}",
        output.status,
        text(&output)
    );
    output
}

/// The field `name` of `/proc/<pid>/status`.
fn status_field(pid: &str, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// The container's main process as the host sees it: its pid there.
fn host_pid(container: &str) -> String {
    let inspected = podman(&["inspect", "--format", "{{.State.Pid}}", container]);
    String::from_utf8_lossy(&inspected.stdout)
        .trim()
        .to_string()
}

/// Stops `container` as an orchestrator does (SIGTERM, SIGKILL 30 s later) and returns its
/// exit code.
fn stop(container: &str) -> String {
    let stopped = podman(&["stop", "--time", "30", container]);
    assert!(stopped.status.success(), "{}", text(&stopped));
    let code = podman(&["inspect", "--format", "{{.State.ExitCode}}", container]);
    String::from_utf8_lossy(&code.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the images scripts/build-image.sh builds: scripts/test.sh --image"]
async fn the_relay_image_runs_as_a_non_root_pid_1_on_a_read_only_root_and_exits_0_on_sigterm() {
    let image = image("outbox-relay");
    let name = unique_name("image");
    let db_url = services().pg.create_database(&name).await;
    let amqp_url = services().rabbit.url();
    let (slot, exchange, queue) = (
        format!("{name}_slot"),
        format!("{name}_x"),
        format!("{name}_q"),
    );
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let env = [
        ("DATABASE_URL", db_url.as_str()),
        ("AMQP_URL", amqp_url.as_str()),
        ("OUTBOX_SLOT", slot.as_str()),
        ("OUTBOX_EXCHANGE", exchange.as_str()),
        ("OUTBOX_METRICS_ADDR", metrics_addr.as_str()),
    ];
    run_once(&image, &env, &["setup"]);
    declare_bound_queue(&amqp_url, &exchange, &queue, "#").await;
    let mut consumer = Consumer::start(&amqp_url, &queue).await;

    // The image's default command, on a root file system it cannot write.
    let started = podman_run(&env, &["--detach", "--read-only", "--name", &name, &image])
        .output()
        .expect("run podman");
    assert!(started.status.success(), "{}", text(&started));
    let healthy = wait_http(
        metrics_addr.parse::<std::net::SocketAddr>().expect("addr"),
        "/healthz",
        DEADLINE,
        |(code, _)| *code == 200,
    )
    .await;
    assert!(
        healthy.as_ref().is_some_and(|(code, _)| *code == 200),
        "/healthz: {healthy:?}; log:\n{}",
        logs(&name)
    );
    let client = pg_connect(&db_url).await;
    client
        .execute(
            "INSERT INTO outbox (event_type, payload) VALUES ('OrderPlaced', '{\"order_id\": 42}')",
            &[],
        )
        .await
        .expect("insert a row");
    let arrived = consumer.wait_for(1, DEADLINE).await;
    assert_eq!(arrived.len(), 1, "log:\n{}", logs(&name));

    let pid = host_pid(&name);
    let uids = status_field(&pid, "Uid");
    assert!(
        uids.split_whitespace().all(|uid| uid == IMAGE_UID),
        "the relay runs as {IMAGE_UID} (real, effective, saved, fs): {uids}"
    );
    let ns_pids = status_field(&pid, "NSpid");
    assert_eq!(
        ns_pids.split_whitespace().last(),
        Some("1"),
        "the relay is PID 1 in its container (NSpid {ns_pids})"
    );
    let code = stop(&name);
    let log = logs(&name);
    podman(&["rm", "--force", &name]);
    assert_eq!(code, "0", "exit code after SIGTERM as PID 1; log:\n{log}");
    assert!(!log.contains("panicked"), "log:\n{log}");
    delete_queue(&amqp_url, &queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the images scripts/build-image.sh builds: scripts/test.sh --image"]
async fn the_inbox_image_sets_up_applies_a_message_and_exits_0_on_sigterm() {
    let image = image("outbox-inbox");
    let name = unique_name("inbox_image");
    let db_url = services().pg.create_database(&name).await;
    let amqp_url = services().rabbit.url();
    let client = pg_connect(&db_url).await;
    client
        .batch_execute("CREATE TABLE paid_orders (order_id bigint)")
        .await
        .expect("the effect's table");
    let (exchange, queue, dead) = (
        format!("{name}_x"),
        format!("{name}_q"),
        format!("{name}_dead"),
    );
    declare_exchange(&amqp_url, &dead).await;
    declare_bound_queue(&amqp_url, &exchange, &queue, "#").await;
    let effect = "INSERT INTO paid_orders (order_id) SELECT ($4::jsonb ->> 'order_id')::bigint";
    let env = [
        ("DATABASE_URL", db_url.as_str()),
        ("AMQP_URL", amqp_url.as_str()),
    ];
    run_once(&image, &env, &["setup"]);
    // The image's default command is `consume`: its options follow the entrypoint's.
    let consume = [
        "--detach",
        "--read-only",
        "--name",
        &name,
        &image,
        "consume",
        "--queue",
        &queue,
        "--consumer",
        "image-test",
        "--dead-letter-exchange",
        &dead,
        "--effect-sql",
        effect,
    ];
    let started = podman_run(&env, &consume).output().expect("run podman");
    assert!(started.status.success(), "{}", text(&started));
    let message_id = unique_name("order");
    let body = br#"{"order_id": 42}"#;
    publish_confirmed(
        &amqp_url,
        &exchange,
        "orders",
        &[(message_id.as_str(), &body[..])],
    )
    .await;
    let applied = wait_count(&client, "SELECT count(*) FROM paid_orders", DEADLINE, |n| {
        n >= 1
    })
    .await;
    assert_eq!(applied, Ok(1), "log:\n{}", logs(&name));
    let uids = status_field(&host_pid(&name), "Uid");
    assert!(
        uids.split_whitespace().all(|uid| uid == IMAGE_UID),
        "the consumer runs as {IMAGE_UID}: {uids}"
    );
    let code = stop(&name);
    let log = logs(&name);
    podman(&["rm", "--force", &name]);
    assert_eq!(code, "0", "exit code after SIGTERM as PID 1; log:\n{log}");
    let claimed: i64 = query_value(&client, "SELECT count(*) FROM inbox").await;
    assert_eq!(claimed, 1, "the message is claimed in the inbox");
    delete_queue(&amqp_url, &queue).await;
}
