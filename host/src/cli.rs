//! The command line: `serve` (the default), `demo`, `keys`, `credits`,
//! `check` and `plugin` (the provider author's `new` and `inspect`).
//!
//! Every failure ends as one line on stderr naming the file and the reason,
//! and a non-zero exit: 2 for a command used wrongly (clap's usage errors,
//! a bad `AMOUNT` or `--note`, a bad `--since` day), 1 for anything else.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use std::sync::Arc;

use crate::auth::shared::SharedKeys;
use crate::auth::{KeyRecord, KeysError, KeysFileAt};
use crate::config::{Config, KeyFiles};
use crate::ledger::Grant;
use crate::lifecycle::{self, RunError};
use crate::settings::LogFormat;
use crate::shared::credits::Credits;
use crate::shared::{RedisConfig, Shared, StateConfig};

#[derive(Parser)]
#[command(
    name = "socialgate",
    version,
    about = "Normalized public short-video data behind one stable API."
)]
struct Cli {
    /// The configuration file [default: platforms.toml] (not for demo,
    /// which writes its own).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
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
    /// Credit packs: credits granted to a key that never expire.
    #[command(subcommand)]
    Credits(CreditsCommand),
    /// Validate the configuration and load every plugin.
    Check,
    /// Write a new provider crate, or inspect a built plugin library.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Write a ready provider crate (one endpoint, fixtures, a conformance
    /// test, a README) that builds and passes its tests as written.
    New {
        /// The provider's name (a-z, 0-9, `-`), also the crate's.
        name: String,
        /// Where to write it (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The platform it serves (default: the name).
        #[arg(long)]
        platform: Option<String>,
        /// The plugin-api folder of the socialgate source to depend on
        /// (default: the one this binary was built from).
        #[arg(long)]
        plugin_api: Option<PathBuf>,
    },
    /// Print a plugin library's name, version, plugin-api version and
    /// endpoints, or why the host cannot load it.
    Inspect { library: PathBuf },
}

#[derive(Subcommand)]
enum CreditsCommand {
    /// Add AMOUNT credits to the account of the key named NAME; they never
    /// expire, and a running server counts them within 2 s.
    Grant {
        name: String,
        /// A whole number of credits, at least 1.
        // Taken as text (a `-1` too), so a bad one gets our one-line error.
        #[arg(allow_hyphen_values = true)]
        amount: String,
        /// Why (an order number, say); shown by `credits show`.
        #[arg(long)]
        note: Option<String>,
    },
    /// A key's grants, the credits it spent and its balance.
    Show {
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// How `keys usage` groups its rows.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum UsageBy {
    /// Per key and UTC day.
    Day,
    /// Per key, UTC day and endpoint.
    Endpoint,
}

/// The most credits one grant may add: far above any pack, far below where
/// sums could overflow.
const MAX_GRANT: u64 = 1_000_000_000_000;
/// The longest note a grant keeps.
const MAX_NOTE_CHARS: usize = 500;

#[derive(Subcommand)]
enum KeysCommand {
    /// Issue a key; it is printed once, on stdout.
    Issue {
        #[arg(long)]
        name: String,
    },
    /// Revoke the key with this name.
    Revoke { name: String },
    /// Copy the keys of a keys file into the shared store (`[state] backend
    /// = "redis"`); names already there are skipped, never overwritten.
    Import {
        #[arg(long)]
        from: PathBuf,
    },
    /// Write the shared store's keys (`[state] backend = "redis"`) to a
    /// keys file: names, SHA-256 hashes and dates, what `keys import` reads
    /// back. A backup for a Redis that may come back empty. It replaces a
    /// keys file, never another file, and writes nothing from a store
    /// without keys unless told to.
    Export {
        #[arg(long)]
        to: PathBuf,
        /// Write the file even when the store holds no keys.
        #[arg(long)]
        allow_empty: bool,
    },
    /// List issued keys (names and dates, never keys).
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Credits used per key and UTC day, from the usage ledger (works while
    /// the server runs).
    Usage {
        /// Only days from this one on, as YYYY-MM-DD.
        #[arg(long)]
        since: Option<String>,
        /// `endpoint` adds the endpoint to each row.
        #[arg(long, value_enum, default_value = "day")]
        by: UsageBy,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("socialgate: {e}");
            if e.is_usage() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn run(cli: Cli) -> Result<(), RunError> {
    let command = cli.command.unwrap_or(Command::Serve);
    if matches!(command, Command::Demo { .. }) && cli.config.is_some() {
        return Err(RunError::Usage(
            "demo writes its own config: drop --config (serve, check, keys and credits take one)"
                .into(),
        ));
    }
    let config_path = cli
        .config
        .unwrap_or_else(|| PathBuf::from("platforms.toml"));
    if let Command::Plugin(command) = command {
        // Needs no config: an author's machine may have none.
        return plugin(command);
    }
    if let Command::Keys(command) = command {
        let _logging = crate::logging::init(cli.log_format.unwrap_or_default());
        return keys(&config_path, command);
    }
    if let Command::Credits(command) = command {
        let _logging = crate::logging::init(cli.log_format.unwrap_or_default());
        return credits(&config_path, command);
    }
    if let Command::Demo { fail_primary } = command {
        let _logging = crate::logging::init(cli.log_format.unwrap_or_default());
        crate::demo::set_sandbox_keys();
        return run_to_end(crate::demo::run(cli.listen, fail_primary))?;
    }
    let config = Config::load(&config_path)?;
    let _logging = crate::logging::init(cli.log_format.unwrap_or(config.process.log_format));
    match command {
        Command::Check => {
            let report = lifecycle::check(&config)?;
            writeln!(std::io::stdout(), "{report}")?;
        }
        _ => run_to_end(lifecycle::serve(config, cli.listen, |_| {}))??,
    }
    Ok(())
}

/// Runs `future` on the process's runtime ([`crate::runtime`]) to its end,
/// then leaves without waiting on threads that cannot finish (a stuck
/// plugin call): everything that needed an orderly end had it before
/// `future` returned.
fn run_to_end<T>(future: impl std::future::Future<Output = T>) -> std::io::Result<T> {
    let runtime = crate::runtime::build()?;
    let output = runtime.block_on(future);
    runtime.shutdown_timeout(EXIT_WAIT);
    Ok(output)
}

/// How long the process waits for stray threads at exit.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Runs a command's Redis work on a runtime of one thread: a command makes
/// a few round trips, it needs no workers.
fn on_one_thread<T>(
    work: impl std::future::Future<Output = Result<T, RunError>>,
) -> Result<T, RunError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(work)
}

fn keys(config_path: &Path, command: KeysCommand) -> Result<(), RunError> {
    match &command {
        KeysCommand::Usage { since, .. } => check_since(since.as_deref())?,
        KeysCommand::Issue { name } => check_name("keys issue", name)?,
        _ => {}
    }
    // Key commands need only the files' locations, not secrets or plugins:
    // they must work where the server's environment is absent.
    let files = key_files(config_path)?;
    if let StateConfig::Redis(redis) = &files.state {
        // Any name is looked up there: a record written into the store by
        // hand may break the rule, and must still be revocable.
        return on_one_thread(shared_keys(redis, command));
    }
    // A keys file holds no name outside the rule (it would be refused
    // whole): such a name is the command used wrongly.
    if let KeysCommand::Revoke { name } = &command {
        check_name("keys revoke", name)?;
    }
    let file = KeysFileAt(&files.keys_file);
    let mut stdout = std::io::stdout().lock();
    match command {
        KeysCommand::Issue { name } => {
            let key = file.issue(&name)?;
            if let Err(source) = print_key(&mut stdout, &key) {
                // Nobody holds the key: its name must not stay taken.
                let then = unprinted_then(file.revoke(&name));
                return Err(RunError::Unprinted { name, source, then });
            }
        }
        KeysCommand::Revoke { name } => file.revoke(&name)?,
        KeysCommand::Import { .. } => {
            return Err(RunError::Usage(
                "`keys import` copies a keys file into a shared store: it needs [state] backend = \"redis\"".into(),
            ))
        }
        KeysCommand::Export { .. } => {
            return Err(RunError::Usage(
                "`keys export` copies a shared store's keys into a keys file: it needs [state] backend = \"redis\" (without it, the keys file is the record)".into(),
            ))
        }
        KeysCommand::List { json } => print_keys(&mut stdout, &file.records()?, json)?,
        KeysCommand::Usage { since, by, json } => {
            let path = &files.ledger.path;
            let since = since.as_deref();
            warn_if_no_ledger(path);
            let report = match by {
                UsageBy::Endpoint => {
                    UsageReport::ByEndpoint(crate::ledger::usage_by_endpoint(path, since)?)
                }
                UsageBy::Day => UsageReport::ByDay(crate::ledger::usage(path, since)?),
            };
            report.print(&mut stdout, json)?;
        }
    }
    Ok(())
}

/// The `keys` commands on the shared store.
async fn shared_keys(redis: &RedisConfig, command: KeysCommand) -> Result<(), RunError> {
    let shared = Arc::new(Shared::connect_for_command(redis)?);
    let keys = SharedKeys(&shared);
    let mut stdout = std::io::stdout().lock();
    match command {
        KeysCommand::Issue { name } => {
            let key = keys.issue(&name).await?;
            if let Err(source) = print_key(&mut stdout, &key) {
                // Nobody holds the key: its name must not stay taken.
                let then = unprinted_then(keys.revoke(&name).await);
                return Err(RunError::Unprinted { name, source, then });
            }
        }
        KeysCommand::Revoke { name } => keys.revoke(&name).await?,
        KeysCommand::Import { from } => {
            // The whole file is checked, then written in one step: a bad
            // record or a key already there under another name imports
            // nothing, so the file can be fixed and the command run again.
            let records = KeysFileAt(&from)
                .existing_records()
                .map_err(|e| KeysError::NothingImported(Box::new(e)))?;
            let skipped = keys.import(&records).await.map_err(|e| match e {
                // Sent, maybe not answered: whole or nothing, unknown which.
                KeysError::Shared(_) => e,
                e => KeysError::NothingImported(Box::new(e)),
            })?;
            for record in &records {
                let name = record.name.as_str();
                if skipped.iter().any(|s| s == name) {
                    writeln!(
                        stdout,
                        "skipped {name}: a key of that name is there already"
                    )?;
                } else {
                    writeln!(stdout, "imported {name}")?;
                }
            }
            writeln!(
                stdout,
                "imported {} of {} keys",
                records.len() - skipped.len(),
                records.len()
            )?;
        }
        KeysCommand::List { json } => {
            let records = keys.records().await.map_err(KeysError::from)?;
            print_keys(&mut stdout, &records, json)?;
        }
        KeysCommand::Export { to, allow_empty } => {
            let records = keys.records().await.map_err(KeysError::from)?;
            if records.is_empty() && !allow_empty {
                return Err(KeysError::NothingToExport.into());
            }
            let count = records.len();
            KeysFileAt(&to).replace_all(records)?;
            writeln!(stdout, "exported {count} keys to {}", to.display())?;
        }
        KeysCommand::Usage { since, by, json } => {
            let credits = Credits::new(shared.clone());
            let since = since.as_deref();
            let report = match by {
                UsageBy::Endpoint => {
                    UsageReport::ByEndpoint(credits.usage_by_endpoint(since).await?)
                }
                UsageBy::Day => UsageReport::ByDay(credits.usage(since).await?),
            };
            report.print(&mut stdout, json)?;
        }
    }
    Ok(())
}

/// `keys usage --since`: a bad day is the command used wrongly (exit 2, as
/// clap's own refusals), found before the config, the ledger or the store
/// is read.
fn check_since(since: Option<&str>) -> Result<(), RunError> {
    let Some(day) = since else {
        return Ok(());
    };
    crate::ledger::check_day(day).map_err(|_| {
        RunError::Usage(format!(
            "keys usage: --since must be a day as YYYY-MM-DD; got `{}`",
            day.escape_debug()
        ))
    })
}

/// What became of a key `keys issue` could not print, for its error.
fn unprinted_then(revoked: Result<(), KeysError>) -> String {
    match revoked {
        Ok(()) => "it was not kept: issue it again".to_owned(),
        Err(e) => format!("it is kept, and revoking it failed ({e}): revoke it"),
    }
}

/// Prints a new key, alone on its line, and makes sure it left: the key is
/// shown once, and one that could not be shown must not be kept.
fn print_key(stdout: &mut impl Write, key: &str) -> std::io::Result<()> {
    writeln!(stdout, "{key}")?;
    stdout.flush()
}

/// A key's name on `command`'s line: one outside the rule is the command
/// used wrongly (exit 2), found before the keys file or the store is
/// touched.
fn check_name(command: &str, name: &str) -> Result<(), RunError> {
    KeyRecord::check_name(name).map_err(|e| RunError::Usage(format!("{command}: {e}")))
}

/// Names and dates, one key a line. Both are escaped: a record the shared
/// store holds was not necessarily checked (written there by hand), and a
/// newline in it would print a line of its own.
fn print_keys(out: &mut impl Write, records: &[KeyRecord], json: bool) -> std::io::Result<()> {
    if json {
        let list: Vec<_> = records
            .iter()
            .map(|r| serde_json::json!({"name": r.name, "created": r.created}))
            .collect();
        writeln!(out, "{}", serde_json::Value::Array(list))
    } else {
        for r in records {
            writeln!(
                out,
                "{}\t{}",
                r.name.escape_debug(),
                r.created.escape_debug()
            )?;
        }
        Ok(())
    }
}

fn plugin(command: PluginCommand) -> Result<(), RunError> {
    let mut stdout = std::io::stdout().lock();
    match command {
        PluginCommand::New {
            name,
            dir,
            platform,
            plugin_api,
        } => {
            let library = crate::scaffold::library_file(&name);
            let (dir, files) = crate::scaffold::new_plugin(crate::scaffold::NewPlugin {
                name,
                platform,
                dir,
                plugin_api,
            })?;
            for file in files {
                writeln!(stdout, "created {}", file.display())?;
            }
            writeln!(
                stdout,
                "next: cd {} && cargo test && cargo build && socialgate plugin inspect \
                 target/debug/{library}; the guide is docs/providers.md",
                dir.display()
            )?;
        }
        PluginCommand::Inspect { library } => {
            writeln!(stdout, "{}", crate::scaffold::inspect(&library)?)?;
        }
    }
    Ok(())
}

fn to_json(value: &impl serde::Serialize) -> std::io::Result<String> {
    serde_json::to_string(value).map_err(std::io::Error::other)
}

/// `AMOUNT` of `credits grant`: a whole number from 1 to [`MAX_GRANT`].
fn parse_amount(text: &str) -> Result<u64, RunError> {
    text.parse::<u64>()
        .ok()
        .filter(|n| (1..=MAX_GRANT).contains(n) && text.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            RunError::Usage(format!(
                "credits grant: AMOUNT must be a whole number of credits from 1 to {MAX_GRANT}; got `{}`",
                text.escape_debug()
            ))
        })
}

/// [`KeyFiles::load`], telling the operator (on stderr) what is wrong
/// elsewhere in the file: the command goes on, the server would not.
fn key_files(config_path: &Path) -> Result<KeyFiles, RunError> {
    let files = KeyFiles::load(config_path)?;
    if let Some(elsewhere) = &files.elsewhere {
        eprintln!(
            "socialgate: warning: {elsewhere} (this command reads only [server] keys_file, \
             [ledger], [state] and [billing]; the server refuses the file until it is fixed)"
        );
    }
    Ok(files)
}

fn credits(config_path: &Path, command: CreditsCommand) -> Result<(), RunError> {
    let files = key_files(config_path)?;
    if let StateConfig::Redis(redis) = &files.state {
        return on_one_thread(shared_credits(redis, &files.billing, command));
    }
    // As for `keys revoke`: no keys file holds a name outside the rule.
    match &command {
        CreditsCommand::Grant { name, .. } => check_name("credits grant", name)?,
        CreditsCommand::Show { name, .. } => check_name("credits show", name)?,
    }
    let file = KeysFileAt(&files.keys_file);
    let path = &files.ledger.path;
    let mut stdout = std::io::stdout().lock();
    match command {
        CreditsCommand::Grant { name, amount, note } => {
            let amount = parse_grant(&amount, note.as_deref())?;
            // Only a key that exists may be credited: a typo must not
            // strand a paid pack under a name nobody holds.
            if !file.records()?.iter().any(|r| r.name == name) {
                return Err(crate::auth::KeysError::Unknown(name).into());
            }
            let grant = crate::ledger::grant(path, &name, amount, note.as_deref())?;
            print_grant(&mut stdout, &name, &grant)?;
        }
        CreditsCommand::Show { name, json } => {
            warn_if_no_ledger(path);
            let book = crate::ledger::book(path, &name)?;
            let known = file.records()?.iter().any(|r| r.name == name);
            print_book(&mut stdout, &name, known, &book, &files.billing, json)?;
        }
    }
    Ok(())
}

/// Says so on stderr when there is no ledger at `path`: empty and absent
/// read alike (no usage, nothing spent, no grant), and only the operator
/// knows which was meant; a typo in `[ledger] path` would otherwise show
/// every key unspent.
fn warn_if_no_ledger(path: &Path) {
    if !path.exists() {
        eprintln!(
            "socialgate: no usage ledger at {} (nothing recorded yet, or [ledger] path points elsewhere)",
            path.display()
        );
    }
}

/// A grant's AMOUNT and `--note`, checked.
fn parse_grant(amount: &str, note: Option<&str>) -> Result<u64, RunError> {
    let amount = parse_amount(amount)?;
    if let Some(note) = note {
        if note.chars().count() > MAX_NOTE_CHARS || note.chars().any(char::is_control) {
            return Err(RunError::Usage(format!(
                "credits grant: --note must be at most {MAX_NOTE_CHARS} characters on one line"
            )));
        }
    }
    Ok(amount)
}

/// The `credits` commands on the shared store: grants are kept there, so
/// every replica counts them at its next reservation.
async fn shared_credits(
    redis: &RedisConfig,
    billing: &crate::billing::BillingConfig,
    command: CreditsCommand,
) -> Result<(), RunError> {
    let shared = Arc::new(Shared::connect_for_command(redis)?);
    let records = SharedKeys(&shared)
        .records()
        .await
        .map_err(KeysError::from)?;
    let credits = Credits::new(shared.clone());
    let mut stdout = std::io::stdout().lock();
    match command {
        CreditsCommand::Grant { name, amount, note } => {
            let amount = parse_grant(&amount, note.as_deref())?;
            // As with local books: a typo must not strand a paid pack.
            if !records.iter().any(|r| r.name == name) {
                return Err(KeysError::Unknown(name).into());
            }
            let grant = credits.grant(&name, amount, note.as_deref()).await?;
            print_grant(&mut stdout, &name, &grant)?;
        }
        CreditsCommand::Show { name, json } => {
            let book = credits.book(&name).await?;
            let known = records.iter().any(|r| r.name == name);
            print_book(&mut stdout, &name, known, &book, billing, json)?;
        }
    }
    Ok(())
}

/// `credits grant`'s line.
fn print_grant(stdout: &mut impl Write, name: &str, grant: &Grant) -> std::io::Result<()> {
    writeln!(
        stdout,
        "granted {} credits to {name} at {}",
        grant.amount, grant.at
    )
}

/// `credits show`: a key's grants, spending and balance.
fn print_book(
    stdout: &mut impl Write,
    name: &str,
    known: bool,
    book: &crate::ledger::Book,
    billing: &crate::billing::BillingConfig,
    json: bool,
) -> Result<(), RunError> {
    if !known && book.grants.is_empty() && book.spent == 0 {
        return Err(crate::auth::KeysError::Unknown(name.to_owned()).into());
    }
    let free = billing.free_credits;
    let granted = book
        .grants
        .iter()
        .fold(0u64, |sum, g| sum.saturating_add(g.amount));
    let balance = free.saturating_add(granted).saturating_sub(book.spent);
    if json {
        let value = serde_json::json!({
            "name": name,
            "free_credits": free,
            "grants": book.grants,
            "granted": granted,
            "spent": book.spent,
            "balance": balance,
        });
        writeln!(stdout, "{value}")?;
    } else {
        writeln!(stdout, "{name}")?;
        writeln!(stdout, "  free credits  {free:>12}")?;
        for g in &book.grants {
            let note = g.note.as_deref().unwrap_or("");
            writeln!(stdout, "  granted       {:>12}  {}  {note}", g.amount, g.at)?;
        }
        writeln!(stdout, "  spent         {:>12}", book.spent)?;
        writeln!(stdout, "  balance       {balance:>12}")?;
    }
    Ok(())
}

/// What `keys usage` prints, from the ledger or the shared store alike.
enum UsageReport {
    /// One row per key and day.
    ByDay(Vec<crate::ledger::UsageRow>),
    /// One row per key, day and endpoint (`--by endpoint`).
    ByEndpoint(Vec<crate::ledger::EndpointUsageRow>),
}

impl UsageReport {
    /// The rows as JSON, or a table per key (one line per row, then the
    /// key's total).
    fn print(&self, out: &mut impl Write, json: bool) -> std::io::Result<()> {
        if json {
            let text = match self {
                UsageReport::ByDay(rows) => to_json(rows)?,
                UsageReport::ByEndpoint(rows) => to_json(rows)?,
            };
            return writeln!(out, "{text}");
        }
        let lines: Vec<UsageLine<'_>> = match self {
            UsageReport::ByDay(rows) => rows
                .iter()
                .map(|r| UsageLine {
                    key: &r.key,
                    day: &r.day,
                    endpoint: None,
                    requests: r.requests,
                    credits: r.credits,
                })
                .collect(),
            UsageReport::ByEndpoint(rows) => rows
                .iter()
                .map(|r| UsageLine {
                    key: &r.key,
                    day: &r.day,
                    endpoint: Some(r.endpoint.as_deref().unwrap_or("-")),
                    requests: r.requests,
                    credits: r.credits,
                })
                .collect(),
        };
        print_usage_table(out, &lines)
    }
}

/// One line of a usage table; `endpoint` is `None` in tables without that
/// column.
struct UsageLine<'a> {
    key: &'a str,
    day: &'a str,
    endpoint: Option<&'a str>,
    requests: u64,
    credits: u64,
}

/// Lines grouped by key (as the ledger sorts them), each key's group
/// followed by its total.
fn print_usage_table(out: &mut impl Write, lines: &[UsageLine<'_>]) -> std::io::Result<()> {
    if lines.is_empty() {
        return writeln!(out, "no usage recorded");
    }
    let width = lines.iter().map(|l| l.key.len()).max().unwrap_or(3).max(3);
    let by_endpoint = lines.iter().any(|l| l.endpoint.is_some());
    let row = |out: &mut dyn Write,
               key: &str,
               day: &str,
               endpoint: &str,
               requests: &dyn std::fmt::Display,
               credits: &dyn std::fmt::Display| {
        if by_endpoint {
            writeln!(
                out,
                "{key:<width$}  {day:<10}  {endpoint:<8}  {requests:>8}  {credits:>8}"
            )
        } else {
            writeln!(out, "{key:<width$}  {day:<10}  {requests:>8}  {credits:>8}")
        }
    };
    row(out, "key", "day", "endpoint", &"requests", &"credits")?;
    for (i, line) in lines.iter().enumerate() {
        let endpoint = line.endpoint.unwrap_or("");
        row(
            out,
            line.key,
            line.day,
            endpoint,
            &line.requests,
            &line.credits,
        )?;
        let last_of_key = lines.get(i + 1).is_none_or(|next| next.key != line.key);
        if last_of_key {
            let (requests, credits) = lines
                .iter()
                .filter(|l| l.key == line.key)
                .fold((0, 0), |(q, c), l| (q + l.requests, c + l.credits));
            row(out, "", "total", "", &requests, &credits)?;
        }
    }
    Ok(())
}
