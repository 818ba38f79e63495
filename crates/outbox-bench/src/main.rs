//! `outbox-bench`: end-to-end checks and measurements of a running relay (the modules are in
//! this crate's library, src/lib.rs); this file only parses the command line and writes the report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use outbox_bench::scenarios::demo::{self, DemoArgs};
use outbox_bench::scenarios::suite::{self, BenchArgs};

#[derive(Debug, Parser)]
#[command(
    name = "outbox-bench",
    version,
    about = "Drives a running outbox-relay from outside: writes outbox rows, consumes the \
             messages, and reports what arrived"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Commit rows with concurrent writers and check that the relay delivers each of them, in
    /// commit order. Exits 0 when no row is missing, 1 otherwise.
    Demo(DemoArgs),
    /// Run the benchmark of docs/benchmarks.md against the relay binary: backlog drain,
    /// latency at a fixed rate and under load, crash, the broker-alone and decoding-alone
    /// limits, resources, the drain of every setup with a consumer and without, and a
    /// --max-in-flight sweep (with --recovery-rounds, the time to stream again after a broker
    /// node or the primary is lost). Prints a Markdown report; --out also writes it and the
    /// figures as JSON.
    // Boxed: its flags make it far larger than `Demo`.
    Bench(Box<BenchArgs>),
    /// Draw the SVG charts of a results file that `bench --out` wrote (bench draws them
    /// itself after a run; this redraws any earlier run's without running anything).
    Charts(ChartsArgs),
}

#[derive(Debug, clap::Args)]
struct ChartsArgs {
    /// A results file: the PREFIX.json of `bench --out PREFIX` (e.g. target/bench/<stamp>.json
    /// or crates/outbox-bench/lab/results/<stamp>.json).
    file: PathBuf,

    /// The directory the charts go to (default: beside the file, in a directory named like it
    /// without `.json`, where scripts/bench.sh puts a run's logs and charts).
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Demo(args) => match runtime.block_on(demo::run(&args)) {
            Ok(report) => {
                print!("{report}");
                if report.complete() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Bench(args) => {
            let out = args.out.clone();
            let results = match runtime.block_on(suite::run(*args)) {
                Ok(results) => results,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            let markdown = results.markdown();
            print!("{markdown}");
            if let Some(prefix) = out {
                // The figures first: a chart that cannot be drawn must not cost the run.
                let written = write_results(&prefix, &results, &markdown)
                    .and_then(|()| write_charts(&results, &prefix));
                if let Err(e) = written {
                    eprintln!("error: {e:#}");
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Command::Charts(args) => {
            let dir = args.out.unwrap_or_else(|| args.file.with_extension(""));
            let drawn = outbox_bench::report::charts::read(&args.file)
                .and_then(|results| write_charts(&results, &dir));
            match drawn {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The run's charts into `dir`, each file named on stderr (or why it was not drawn).
fn write_charts(
    results: &outbox_bench::measurement::results::Results,
    dir: &Path,
) -> anyhow::Result<()> {
    for (path, skipped) in outbox_bench::report::charts::write(results, dir)? {
        match skipped {
            None => eprintln!("bench: wrote {}", path.display()),
            Some(why) => eprintln!("bench: no {}: {why}", path.display()),
        }
    }
    Ok(())
}

/// PREFIX.json (the figures) and PREFIX.md (the report).
fn write_results(
    prefix: &Path,
    results: &outbox_bench::measurement::results::Results,
    markdown: &str,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let json = prefix.with_extension("json");
    let md = prefix.with_extension("md");
    if let Some(dir) = prefix.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&json, serde_json::to_string_pretty(results)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    std::fs::write(&md, markdown).with_context(|| format!("cannot write {}", md.display()))?;
    eprintln!("bench: wrote {} and {}", json.display(), md.display());
    Ok(())
}
