//! The command line: `serve` (the default), `demo`, `keys` and `check`.
//!
//! Every failure ends as one line on stderr naming the file and the reason,
//! and a non-zero exit.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::auth::{KeysError, KeysFileAt};
use crate::config::{Config, ConfigError, LogFormat};
use crate::state::StartError;

#[derive(Parser)]
#[command(
    name = "socialgate",
    version,
    about = "Normalized public short-video data behind one stable API."
)]
struct Cli {
    /// The configuration file.
    #[arg(long, global = true, default_value = "platforms.toml")]
    config: PathBuf,
    /// Listen on this address instead of the configured one (serve, demo).
    #[arg(long, global = true)]
    listen: Option<SocketAddr>,
    /// Log format on stderr; overrides `[server] log_format`.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Serve the API against built-in sandbox upstreams, with a demo key.
    Demo {
        /// Make the sandbox primary fail, to watch failover.
        #[arg(long)]
        fail_primary: bool,
    },
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Validate the configuration and load every plugin.
    Check,
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Issue a key; it is printed once, on stdout.
    Issue {
        #[arg(long)]
        name: String,
    },
    /// Revoke the key with this name.
    Revoke { name: String },
    /// List issued keys (names and dates, never keys).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Credits used per key and UTC day, from the usage ledger (works while
    /// the server runs).
    Usage {
        /// Only days from this one on, as YYYY-MM-DD.
        #[arg(long)]
        since: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error(transparent)]
    Serve(#[from] crate::serve::ServeError),
    #[error(transparent)]
    Demo(#[from] crate::demo::DemoError),
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("socialgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, filtered by `SOCIALGATE_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SOCIALGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Human => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let config = Config::load(&cli.config)?;
            init_logging(cli.log_format.unwrap_or(config.server.log_format));
            Ok(runtime()?.block_on(crate::serve::serve(config, cli.listen))?)
        }
        Command::Demo { fail_primary } => {
            init_logging(cli.log_format.unwrap_or_default());
            Ok(runtime()?.block_on(crate::demo::run(cli.listen, fail_primary))?)
        }
        Command::Check => {
            init_logging(cli.log_format.unwrap_or_default());
            let config = Config::load(&cli.config)?;
            let path = config.path.clone();
            // Everything a start would load, but nothing a running server
            // owns: no ledger opened, no stale plugin copies pruned.
            let loader = crate::plugins::Loader::new(config.server.state_dir.clone());
            let snapshot = crate::state::Snapshot::build(config, &loader, None)?;
            println!(
                "{}: ok: {} platforms, {} providers",
                path.display(),
                snapshot.routes.platform_count(),
                snapshot.routes.provider_count()
            );
            Ok(())
        }
        Command::Keys(command) => {
            init_logging(cli.log_format.unwrap_or_default());
            keys(&cli.config, command)
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn keys(config_path: &Path, command: KeysCommand) -> Result<(), CliError> {
    // Key commands need only the files' locations, not secrets or plugins:
    // they must work where the server's environment is absent.
    let files = files_of(config_path)?;
    let file = KeysFileAt(&files.keys_file);
    let mut stdout = std::io::stdout().lock();
    match command {
        KeysCommand::Issue { name } => {
            let key = file.issue(&name)?;
            writeln!(stdout, "{key}")?;
        }
        KeysCommand::Revoke { name } => file.revoke(&name)?,
        KeysCommand::List { json } => {
            let records = file.records()?;
            if json {
                let list: Vec<_> = records
                    .iter()
                    .map(|r| serde_json::json!({"name": r.name, "created": r.created}))
                    .collect();
                writeln!(stdout, "{}", serde_json::Value::Array(list))?;
            } else {
                for r in &records {
                    writeln!(stdout, "{}\t{}", r.name, r.created)?;
                }
            }
        }
        KeysCommand::Usage { since, json } => {
            let rows = crate::ledger::usage(&files.ledger_path, since.as_deref())?;
            if json {
                writeln!(
                    stdout,
                    "{}",
                    serde_json::to_string(&rows).map_err(std::io::Error::other)?
                )?;
            } else {
                print_usage(&mut stdout, &rows)?;
            }
        }
    }
    Ok(())
}

/// A table per key: one line per day, then the key's total.
fn print_usage(out: &mut impl Write, rows: &[crate::ledger::UsageRow]) -> std::io::Result<()> {
    if rows.is_empty() {
        return writeln!(out, "no usage recorded");
    }
    let width = rows.iter().map(|r| r.key.len()).max().unwrap_or(3).max(3);
    writeln!(
        out,
        "{:<width$}  {:<10}  {:>8}  {:>8}",
        "key", "day", "requests", "credits"
    )?;
    for (i, row) in rows.iter().enumerate() {
        writeln!(
            out,
            "{:<width$}  {:<10}  {:>8}  {:>8}",
            row.key, row.day, row.requests, row.credits
        )?;
        let last_of_key = rows.get(i + 1).is_none_or(|next| next.key != row.key);
        if last_of_key {
            let (requests, credits) = rows
                .iter()
                .filter(|r| r.key == row.key)
                .fold((0, 0), |(q, c), r| (q + r.requests, c + r.credits));
            writeln!(
                out,
                "{:<width$}  {:<10}  {requests:>8}  {credits:>8}",
                "", "total"
            )?;
        }
    }
    Ok(())
}

/// Where a config keeps the keys file and the ledger.
struct Files {
    keys_file: PathBuf,
    ledger_path: PathBuf,
}

/// The files a config names, read without resolving anything else.
fn files_of(config_path: &Path) -> Result<Files, CliError> {
    #[derive(serde::Deserialize, Default)]
    struct Partial {
        #[serde(default)]
        server: PartialServer,
        #[serde(default)]
        ledger: PartialLedger,
    }
    #[derive(serde::Deserialize, Default)]
    struct PartialServer {
        keys_file: Option<PathBuf>,
    }
    #[derive(serde::Deserialize, Default)]
    struct PartialLedger {
        path: Option<PathBuf>,
    }
    let text = std::fs::read_to_string(config_path).map_err(|source| ConfigError::Read {
        path: config_path.to_owned(),
        source,
    })?;
    let partial: Partial = toml::from_str(&text).map_err(|e| ConfigError::Invalid {
        path: config_path.to_owned(),
        message: e.message().trim().replace('\n', " "),
    })?;
    let base = config_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok(Files {
        keys_file: base.join(
            partial
                .server
                .keys_file
                .unwrap_or_else(|| crate::config::DEFAULT_KEYS_FILE.into()),
        ),
        ledger_path: base.join(
            partial
                .ledger
                .path
                .unwrap_or_else(|| crate::config::DEFAULT_LEDGER_FILE.into()),
        ),
    })
}
