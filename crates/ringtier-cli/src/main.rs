//! `ringtier`: the paper's experiments, benchmarks against fio and a thread pool, and the
//! checkpoint store, from the command line. With no arguments it runs the paper's three
//! experiments on embedded defaults. Arguments are in `args.rs`; the product's commands
//! (`ckpt`, `gen`, `index`, `doctor`) have a module each here and run on the facade
//! `ringtier`; the benchmarks, the paper and the tuning lab live in `ringtier-bench` (feature
//! `lab`, on by default: without it the binary is the product's commands alone); this file
//! dispatches.

#![forbid(unsafe_code)]

mod args;
mod ckpt;
mod doctor;
mod gen;
mod index;

use anyhow::Result;
use clap::Parser;

use crate::args::{Cli, Command, MetricsCommand};

fn main() -> std::process::ExitCode {
    match run_cli() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the whole chain of causes, and no backtrace even when RUST_BACKTRACE
            // is set: an error here is the user's input or the machine's state, not a bug (bugs
            // panic, and panics keep their backtraces).
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_cli() -> Result<()> {
    // Warnings and errors of the libraries, on stderr, coloured only on a terminal. The CLI
    // reports quarantined checkpoints itself (with what to do about them), so the store's own
    // quarantine event is off unless RINGTIER_LOG asks for it.
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RINGTIER_LOG")
                .unwrap_or_else(|_| format!("warn,{}=off", ringtier_migrate::QUARANTINE_LOG_TARGET).into()),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(addr) = cli.metrics_addr {
        // Before any tier exists: metric handles bind to the recorder when tiers are built.
        let cfg =
            ringtier_metrics::ExporterConfig::default().with_addr(addr).with_allow_remote(cli.metrics_allow_remote);
        let exporter = ringtier_metrics::install(&cfg)?;
        eprintln!("serving Prometheus metrics on http://{}/metrics", exporter.addr());
    }
    #[cfg(feature = "lab")]
    let result = run(cli.command.unwrap_or(Command::Paper(cli.paper)));
    // Without the lab there is no default command: say what there is.
    #[cfg(not(feature = "lab"))]
    let result = match cli.command {
        Some(c) => run(c),
        None => {
            use clap::CommandFactory as _;
            Cli::command().print_help()?;
            Ok(())
        }
    };
    if cli.metrics_addr.is_some() && cli.metrics_linger > 0.0 {
        eprintln!("done; serving metrics for {} more seconds", cli.metrics_linger);
        std::thread::sleep(std::time::Duration::from_secs_f64(cli.metrics_linger));
    }
    result
}

/// Runs one command: its logic lives with the command.
fn run(command: Command) -> Result<()> {
    match command {
        #[cfg(feature = "lab")]
        Command::Paper(a) => ringtier_bench::paper(a),
        #[cfg(feature = "lab")]
        Command::Demo(a) => ringtier_bench::demo(a),
        Command::Gen(a) => gen::command(a),
        Command::Index(a) => index::command(a),
        #[cfg(feature = "lab")]
        Command::Bench(b) => ringtier_bench::bench(b),
        Command::Ckpt(a) => ckpt::command(a),
        #[cfg(feature = "lab")]
        Command::Tune(a) => ringtier_bench::tune(a),
        Command::Doctor(a) => {
            doctor::command(a);
            Ok(())
        }
        Command::Metrics(MetricsCommand::Catalog) => {
            print!("{}", ringtier_metrics::catalog_markdown());
            Ok(())
        }
    }
}
