//! The usage ledger: how many requests and credits each key used on each UTC
//! day and endpoint, and the credit packs granted to each key, kept in a
//! SQLite file (`[ledger] path`) that `socialgate keys usage` and
//! `socialgate credits` read and write, even while the server runs.
//!
//! Counting must never slow a request, so [`Ledger::record`] only adds to an
//! in-memory map of `(day, key, endpoint) -> counts`; a background thread
//! writes that map in one transaction every `flush_every`, and
//! [`Ledger::flush`] (called at graceful shutdown, and by `Drop`) writes the
//! rest. One transaction per batch also means one disk sync per batch instead
//! of one per request. The map holds one entry per key, day and endpoint, so
//! it stays small. A failed write keeps the counts pending for the next try. The
//! database is in WAL mode, so readers (the `keys usage` command) never wait
//! for the writer, nor the writer for them.
//!
//! Grants are written by the `credits grant` command, another process: the
//! same background thread reads the ones it has not seen after each write
//! and hands them to whoever [watches](Ledger::watch_grants) them (billing),
//! so a grant reaches a running server within about `flush_every`, and the
//! request path never reads the file.
//!
//! Schema versions: 1 counted per key and day; 2 adds the endpoint to each
//! count (a version-1 file's counts keep an empty endpoint) and the grants
//! table. A server, or `credits grant`, migrates a version-1 file in place.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use plugin_api::{Endpoint, Timestamp};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::sync::lock;

/// The schema this code writes, in `PRAGMA user_version`; a newer file is
/// refused rather than misread.
const SCHEMA_VERSION: i64 = 2;

/// How long a statement waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const USAGE_TABLE: &str = "CREATE TABLE usage (
    key TEXT NOT NULL,
    day TEXT NOT NULL,
    endpoint TEXT NOT NULL DEFAULT '',
    requests INTEGER NOT NULL,
    credits INTEGER NOT NULL,
    PRIMARY KEY (key, day, endpoint)
)";

const GRANTS_TABLE: &str = "CREATE TABLE grants (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    amount INTEGER NOT NULL,
    at TEXT NOT NULL,
    note TEXT
)";

const UPSERT: &str = "INSERT INTO usage (key, day, endpoint, requests, credits)
    VALUES (?1, ?2, ?3, ?4, ?5)
    ON CONFLICT (key, day, endpoint) DO UPDATE SET
        requests = requests + excluded.requests,
        credits = credits + excluded.credits";

/// `[ledger]`: where the usage ledger lives. A process setting: the server
/// keeps one ledger open for its whole life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerConfig {
    pub path: PathBuf,
    /// The path was written in the config (not the default): a new, empty
    /// ledger there may be a typo's.
    pub written: bool,
}

/// `[ledger]` as written.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "the [ledger] table")]
pub struct RawLedger {
    path: Option<PathBuf>,
}

impl LedgerConfig {
    /// `path` defaults to `usage.db` beside the config. An empty path, or
    /// one that is a folder, is refused here: `check` must refuse what
    /// `serve` could not open.
    pub fn from_raw(
        raw: &RawLedger,
        cx: &crate::settings::Context,
    ) -> Result<LedgerConfig, crate::settings::ConfigError> {
        const KEY: &str = "[ledger] path";
        if raw.path.as_deref() == Some(Path::new("")) {
            return Err(cx.invalid(KEY, "is empty; name the ledger's file"));
        }
        let ledger = LedgerConfig::unchecked(raw, cx);
        if ledger.path.is_dir() {
            return Err(cx.invalid(
                KEY,
                format!(
                    "{} is a folder; name the ledger's file in it",
                    ledger.path.display()
                ),
            ));
        }
        Ok(ledger)
    }

    /// `[ledger]` as written, unchecked: for the key commands, which must
    /// revoke a leaked key whatever else the file gets wrong (those that
    /// read the ledger fail opening it, naming the path).
    pub fn unchecked(raw: &RawLedger, cx: &crate::settings::Context) -> LedgerConfig {
        LedgerConfig {
            path: cx.resolve(raw.path.as_deref().unwrap_or(Path::new("usage.db"))),
            written: raw.path.is_some(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("{path}: cannot create the usage ledger's folder: {source}")]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot create the usage ledger: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot open the usage ledger: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("{path}: usage ledger: {source}")]
    Sql {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("{path}: usage ledger: journal mode is `{mode}`, not WAL")]
    NotWal { path: PathBuf, mode: String },
    #[error(
        "{path}: usage ledger schema version {found} is newer than this socialgate knows ({SCHEMA_VERSION}); use a newer socialgate"
    )]
    NewerSchema { path: PathBuf, found: i64 },
    #[error("{path}: cannot start the usage ledger's writer thread: {source}")]
    Thread {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: another socialgate process serves from this usage ledger; each needs its own (or share credits through `[state] backend = \"redis\"`)"
    )]
    InUse { path: PathBuf },
    #[error("{path}: cannot lock the usage ledger for serving: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad date `{0}`: expected a day as YYYY-MM-DD")]
    BadDate(String),
}

/// Requests and credits counted but not yet written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    requests: u64,
    credits: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.requests = self.requests.saturating_add(other.requests);
        self.credits = self.credits.saturating_add(other.credits);
    }
}

/// Pending counts by day, key name and endpoint.
type Pending = HashMap<(String, String, Endpoint), Counts>;

/// Credits granted to a key, as the server learns of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewGrant {
    pub key: String,
    pub amount: u64,
}

/// What receives grants the writer thread finds.
type GrantHook = Box<dyn Fn(&[NewGrant]) + Send>;

/// Grants already handed on, and to whom.
struct GrantWatch {
    /// The highest grant `id` handed on.
    last_id: i64,
    hook: Option<GrantHook>,
}

/// What the request path, the writer thread and `Drop` share.
struct Shared {
    path: PathBuf,
    pending: Mutex<Pending>,
    /// The one writing connection. Lock order: `grants`, `conn`, `pending`.
    conn: Mutex<Connection>,
    grants: Mutex<GrantWatch>,
    /// Set by `Drop` to stop the writer thread, which waits on `wake`.
    stop: Mutex<bool>,
    wake: Condvar,
}

/// A SQL error of the ledger at `path`, as [`LedgerError::Sql`].
fn sql_error(path: &Path) -> impl Fn(rusqlite::Error) -> LedgerError + Copy + '_ {
    |source| LedgerError::Sql {
        path: path.to_owned(),
        source,
    }
}

impl Shared {
    /// See [`Ledger::flush`].
    fn flush(&self) -> Result<(), LedgerError> {
        let mut conn = lock(&self.conn);
        // Taken while holding `conn`, so `spent` never sees counts that are
        // in neither the map nor the file.
        let batch = std::mem::take(&mut *lock(&self.pending));
        if batch.is_empty() {
            return Ok(());
        }
        match write_batch(&mut conn, &batch) {
            Ok(()) => Ok(()),
            Err(source) => {
                let mut pending = lock(&self.pending);
                for (counted, counts) in batch {
                    pending.entry(counted).or_default().add(counts);
                }
                Err(sql_error(&self.path)(source))
            }
        }
    }

    /// Hands grants not seen yet to the hook, if one watches.
    fn poll_grants(&self) -> Result<(), LedgerError> {
        let mut watch = lock(&self.grants);
        if watch.hook.is_none() {
            // Nobody to tell: keep them for the first watcher.
            return Ok(());
        }
        let found = {
            let conn = lock(&self.conn);
            let mut statement = conn
                .prepare_cached("SELECT id, key, amount FROM grants WHERE id > ?1 ORDER BY id")
                .map_err(sql_error(&self.path))?;
            let rows = statement
                .query_map([watch.last_id], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        NewGrant {
                            key: row.get(1)?,
                            amount: to_u64(row.get(2)?),
                        },
                    ))
                })
                .map_err(sql_error(&self.path))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql_error(&self.path))?
        };
        let Some(&(last_id, _)) = found.last() else {
            return Ok(());
        };
        watch.last_id = last_id;
        let grants: Vec<NewGrant> = found.into_iter().map(|(_, g)| g).collect();
        if let Some(hook) = &watch.hook {
            hook(&grants);
        }
        Ok(())
    }
}

/// Credits a key has spent, as the ledger knows at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// Since the ledger began.
    pub total: u64,
    /// On the UTC day asked about.
    pub today: u64,
}

/// The server's usage ledger; see the module doc.
pub struct Ledger {
    shared: Arc<Shared>,
    /// Taken by [`Ledger::close`].
    writer: Mutex<Option<JoinHandle<()>>>,
    _serving: ServingLock,
}

/// An exclusive lock on `<ledger>.lock`, held while a process serves from
/// the ledger. Each serving process checks credits against its own running
/// balance and writes its counts only every second, so two serving from one
/// file would each let a key spend its whole balance. The CLI's commands
/// (grants, reports) take no such lock: they work beside a running server.
struct ServingLock {
    _file: std::fs::File,
}

impl ServingLock {
    fn take(ledger: &Path) -> Result<ServingLock, LedgerError> {
        let mut name = ledger.as_os_str().to_owned();
        name.push(".lock");
        match crate::files::try_lock_exclusive(Path::new(&name)) {
            Ok(Some(file)) => Ok(ServingLock { _file: file }),
            Ok(None) => Err(LedgerError::InUse {
                path: ledger.to_owned(),
            }),
            Err(source) => Err(LedgerError::Lock {
                path: ledger.to_owned(),
                source,
            }),
        }
    }
}

impl Ledger {
    /// Opens (creating if needed, parent folders too) the database at `path`,
    /// sets WAL mode and a busy timeout, creates or migrates the schema, and
    /// starts a background thread that writes pending counts (and reads new
    /// grants) every `flush_every` (1 s in production: a crash loses at most
    /// that much, and one transaction a second costs nothing). Blocking:
    /// call it at start-up, not on a request.
    pub fn open(path: &Path, flush_every: Duration) -> Result<Ledger, LedgerError> {
        let conn = open_for_writing(path)?;
        let serving = ServingLock::take(path)?;
        let shared = Arc::new(Shared {
            path: path.to_owned(),
            pending: Mutex::new(HashMap::default()),
            conn: Mutex::new(conn),
            grants: Mutex::new(GrantWatch {
                last_id: 0,
                hook: None,
            }),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("usage-ledger".to_owned())
                .spawn(move || write_periodically(&shared, flush_every))
                .map_err(|source| LedgerError::Thread {
                    path: path.to_owned(),
                    source,
                })?
        };
        Ok(Ledger {
            shared,
            writer: Mutex::new(Some(writer)),
            _serving: serving,
        })
    }

    /// Counts one answered request of `endpoint` costing `credits` for the
    /// key named `key` (its name, never the secret) on the current UTC day.
    /// Never blocks on I/O: it only adds to the in-memory map, under a lock
    /// held for that addition.
    pub fn record(&self, key: &str, endpoint: Endpoint, credits: u32) {
        self.record_on(key, &utc_day(SystemTime::now()), endpoint, credits);
    }

    /// [`Ledger::record`] on a given day, so tests choose the clock.
    fn record_on(&self, key: &str, day: &str, endpoint: Endpoint, credits: u32) {
        let one = Counts {
            requests: 1,
            credits: u64::from(credits),
        };
        lock(&self.shared.pending)
            .entry((day.to_owned(), key.to_owned(), endpoint))
            .or_default()
            .add(one);
    }

    /// Writes everything pending now, in one transaction (an UPSERT adding to
    /// existing rows). Called at graceful shutdown, so the caller sees a
    /// failure; also what the background thread does. On failure the counts
    /// stay pending and the next flush retries them. Blocking.
    pub fn flush(&self) -> Result<(), LedgerError> {
        self.shared.flush()
    }

    /// From now on, hands every grant in the file to `hook`: at once the
    /// grants already there (before this returns), then new ones as the
    /// writer thread finds them, each exactly once. Blocking.
    pub fn watch_grants(
        &self,
        hook: impl Fn(&[NewGrant]) + Send + 'static,
    ) -> Result<(), LedgerError> {
        lock(&self.shared.grants).hook = Some(Box::new(hook));
        self.shared.poll_grants()
    }

    /// Credits each key spent (written + pending), in all and on `today`
    /// (`YYYY-MM-DD`), for billing at start-up. Blocking.
    pub fn spent(&self, today: &str) -> Result<HashMap<String, Spent>, LedgerError> {
        let shared = &*self.shared;
        let conn = lock(&shared.conn);
        let mut totals: HashMap<String, Spent> = HashMap::new();
        let mut statement = conn
            .prepare(
                "SELECT key, SUM(credits), SUM(CASE WHEN day = ?1 THEN credits ELSE 0 END)
                 FROM usage GROUP BY key",
            )
            .map_err(sql_error(&shared.path))?;
        let rows = statement
            .query_map([today], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    Spent {
                        total: to_u64(row.get(1)?),
                        today: to_u64(row.get(2)?),
                    },
                ))
            })
            .map_err(sql_error(&shared.path))?;
        for row in rows {
            let (key, spent) = row.map_err(sql_error(&shared.path))?;
            totals.insert(key, spent);
        }
        // Still holding `conn`: no flush can move counts between the two reads.
        for ((day, key, _), counts) in lock(&shared.pending).iter() {
            let spent = totals.entry(key.clone()).or_default();
            spent.total = spent.total.saturating_add(counts.credits);
            if day == today {
                spent.today = spent.today.saturating_add(counts.credits);
            }
        }
        Ok(totals)
    }

    /// Lifetime credits of every key (written + pending).
    #[cfg(test)]
    fn lifetime_credits(&self) -> Result<HashMap<String, u64>, LedgerError> {
        Ok(self
            .spent("")?
            .into_iter()
            .map(|(key, spent)| (key, spent.total))
            .collect())
    }
}

impl Ledger {
    /// Stops the writer thread and writes what is pending: the last step of
    /// a graceful shutdown, once no request can count anything more.
    /// Blocking. Counts recorded after it are written by `Drop`.
    pub fn close(&self) -> Result<(), LedgerError> {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(writer) = lock(&self.writer).take() {
            if writer.join().is_err() {
                tracing::error!(
                    path = %self.shared.path.display(),
                    "usage ledger writer thread panicked"
                );
            }
        }
        self.flush()
    }
}

impl Drop for Ledger {
    /// [`Ledger::close`], with a failure logged, never a panic.
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!("last usage ledger write failed, its counts are lost: {e}");
        }
    }
}

/// One row of `keys usage`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UsageRow {
    pub key: String,
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    pub requests: u64,
    pub credits: u64,
}

/// One row of `keys usage --by endpoint`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EndpointUsageRow {
    pub key: String,
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    /// `None` for counts from before endpoints were counted (schema 1).
    pub endpoint: Option<String>,
    pub requests: u64,
    pub credits: u64,
}

/// A read-only connection to the ledger at `path` and its schema version;
/// `None` when there is no file (nothing counted or granted yet). Works
/// while a server writes to it (WAL).
fn open_for_reading(path: &Path) -> Result<Option<(Connection, i64)>, LedgerError> {
    match path.try_exists() {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        // Unknown (say, no permission on a folder): let SQLite report it.
        Err(_) => {}
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| LedgerError::Open {
        path: path.to_owned(),
        source,
    })?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_error(path))?;
    let version = check_version(&conn, path)?;
    Ok(Some((conn, version)))
}

fn check_since(since: Option<&str>) -> Result<(), LedgerError> {
    since.map_or(Ok(()), check_day)
}

/// `day` is a `YYYY-MM-DD` day (also what the shared store's usage takes).
pub fn check_day(day: &str) -> Result<(), LedgerError> {
    match Timestamp::parse(&format!("{day}T00:00:00Z")) {
        Some(_) => Ok(()),
        None => Err(LedgerError::BadDate(day.to_owned())),
    }
}

/// Reads usage on or after `since` (a `YYYY-MM-DD` day) per key and day (all
/// endpoints together), ordered by key then day. A missing file means no
/// usage yet: an empty list.
pub fn usage(path: &Path, since: Option<&str>) -> Result<Vec<UsageRow>, LedgerError> {
    check_since(since)?;
    let Some((conn, version)) = open_for_reading(path)? else {
        return Ok(Vec::new());
    };
    if version == 0 {
        // Created but never given a schema: nothing counted yet.
        return Ok(Vec::new());
    }
    let sql_error = sql_error(path);
    let mut statement = conn
        .prepare(
            "SELECT key, day, SUM(requests), SUM(credits) FROM usage WHERE day >= ?1
             GROUP BY key, day ORDER BY key, day",
        )
        .map_err(sql_error)?;
    let rows = statement
        .query_map([since.unwrap_or("")], |row| {
            Ok(UsageRow {
                key: row.get(0)?,
                day: row.get(1)?,
                requests: to_u64(row.get(2)?),
                credits: to_u64(row.get(3)?),
            })
        })
        .map_err(sql_error)?;
    rows.collect::<Result<_, _>>().map_err(sql_error)
}

/// [`usage`] per key, day and endpoint, ordered by key, day, then endpoint
/// (counts from before endpoints were counted first).
pub fn usage_by_endpoint(
    path: &Path,
    since: Option<&str>,
) -> Result<Vec<EndpointUsageRow>, LedgerError> {
    check_since(since)?;
    let Some((conn, version)) = open_for_reading(path)? else {
        return Ok(Vec::new());
    };
    let sql = match version {
        0 => return Ok(Vec::new()),
        // Not migrated yet: no endpoint column.
        1 => "SELECT key, day, '', requests, credits FROM usage WHERE day >= ?1 ORDER BY key, day",
        _ => {
            "SELECT key, day, endpoint, requests, credits FROM usage WHERE day >= ?1
             ORDER BY key, day, endpoint"
        }
    };
    let sql_error = sql_error(path);
    let mut statement = conn.prepare(sql).map_err(sql_error)?;
    let rows = statement
        .query_map([since.unwrap_or("")], |row| {
            let endpoint: String = row.get(2)?;
            Ok(EndpointUsageRow {
                key: row.get(0)?,
                day: row.get(1)?,
                endpoint: (!endpoint.is_empty()).then_some(endpoint),
                requests: to_u64(row.get(3)?),
                credits: to_u64(row.get(4)?),
            })
        })
        .map_err(sql_error)?;
    rows.collect::<Result<_, _>>().map_err(sql_error)
}

/// One credit pack granted to a key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Grant {
    pub amount: u64,
    /// When it was granted, `YYYY-MM-DDTHH:MM:SSZ`.
    pub at: String,
    pub note: Option<String>,
}

/// What the ledger holds for one key: its grants, oldest first, and the
/// credits it spent (as written: a running server writes about once a
/// second).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Book {
    pub grants: Vec<Grant>,
    pub spent: u64,
}

/// A key's account as its holder may read it (`GET /v1/account`), from
/// either books: [`crate::billing`]'s, or the shared store's
/// ([`crate::shared::credits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statement {
    pub remaining: u64,
    pub used_today: u64,
    pub used_total: u64,
}

/// Adds a grant of `amount` credits to `key`, now, with `note`; creates (or
/// migrates) the ledger file if needed. Safe while a server has the file
/// open: the write waits its turn, and the server picks the grant up.
pub fn grant(
    path: &Path,
    key: &str,
    amount: u64,
    note: Option<&str>,
) -> Result<Grant, LedgerError> {
    let conn = open_for_writing(path)?;
    let grant = Grant {
        amount,
        at: now_timestamp(),
        note: note.map(str::to_owned),
    };
    conn.execute(
        "INSERT INTO grants (key, amount, at, note) VALUES (?1, ?2, ?3, ?4)",
        params![key, to_i64(amount), grant.at, grant.note],
    )
    .map_err(sql_error(path))?;
    Ok(grant)
}

/// What the ledger at `path` holds for `key`; a missing file holds nothing.
pub fn book(path: &Path, key: &str) -> Result<Book, LedgerError> {
    let Some((conn, version)) = open_for_reading(path)? else {
        return Ok(Book::default());
    };
    if version == 0 {
        return Ok(Book::default());
    }
    let sql_error = sql_error(path);
    let spent: Option<i64> = conn
        .query_row(
            "SELECT SUM(credits) FROM usage WHERE key = ?1",
            [key],
            |row| row.get(0),
        )
        .optional()
        .map_err(sql_error)?
        .flatten();
    let mut book = Book {
        grants: Vec::new(),
        spent: spent.map_or(0, to_u64),
    };
    if version >= 2 {
        let mut statement = conn
            .prepare("SELECT amount, at, note FROM grants WHERE key = ?1 ORDER BY id")
            .map_err(sql_error)?;
        let rows = statement
            .query_map([key], |row| {
                Ok(Grant {
                    amount: to_u64(row.get(0)?),
                    at: row.get(1)?,
                    note: row.get(2)?,
                })
            })
            .map_err(sql_error)?;
        book.grants = rows.collect::<Result<_, _>>().map_err(sql_error)?;
    }
    Ok(book)
}

/// A writing connection to `path` (created with its parent folders if
/// needed) in WAL mode, with a busy timeout and the current schema.
fn open_for_writing(path: &Path) -> Result<Connection, LedgerError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| LedgerError::Folder {
            path: path.to_owned(),
            source,
        })?;
    }
    // Who used what is the operator's business: a new ledger is 0600 (an
    // empty file is an empty database), and SQLite gives its -wal and -shm
    // files the database file's mode.
    crate::files::create_private_if_absent(path).map_err(|source| LedgerError::Create {
        path: path.to_owned(),
        source,
    })?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|source| LedgerError::Open {
        path: path.to_owned(),
        source,
    })?;
    prepare_for_writing(&conn, path)?;
    Ok(conn)
}

/// WAL mode, busy timeout and schema, on a freshly opened writing connection.
fn prepare_for_writing(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
    let sql_error = sql_error(path);
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_error)?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(sql_error)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(LedgerError::NotWal {
            path: path.to_owned(),
            mode,
        });
    }
    if check_version(conn, path)? < SCHEMA_VERSION {
        // IMMEDIATE: two processes starting at once take turns here, and
        // the second finds the work done.
        conn.execute_batch("BEGIN IMMEDIATE").map_err(sql_error)?;
        let upgraded = upgrade(conn, path);
        let end = if upgraded.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        let ended = conn.execute_batch(end).map_err(sql_error);
        upgraded.and(ended)?;
    }
    Ok(())
}

/// Brings the schema to [`SCHEMA_VERSION`], inside the caller's transaction.
fn upgrade(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
    let steps = match check_version(conn, path)? {
        0 => format!("{USAGE_TABLE}; {GRANTS_TABLE};"),
        // Counts of version 1 keep their key and day, with no endpoint.
        1 => format!(
            "ALTER TABLE usage RENAME TO usage_v1; {USAGE_TABLE};
             INSERT INTO usage (key, day, endpoint, requests, credits)
                 SELECT key, day, '', requests, credits FROM usage_v1;
             DROP TABLE usage_v1; {GRANTS_TABLE};"
        ),
        _ => return Ok(()),
    };
    conn.execute_batch(&format!("{steps} PRAGMA user_version = {SCHEMA_VERSION};"))
        .map_err(sql_error(path))
}

/// The file's schema version; an error if newer than this code's.
fn check_version(conn: &Connection, path: &Path) -> Result<i64, LedgerError> {
    let found: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(sql_error(path))?;
    if found > SCHEMA_VERSION {
        return Err(LedgerError::NewerSchema {
            path: path.to_owned(),
            found,
        });
    }
    Ok(found)
}

fn write_batch(conn: &mut Connection, batch: &Pending) -> Result<(), rusqlite::Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut upsert = tx.prepare_cached(UPSERT)?;
        for ((day, key, endpoint), counts) in batch {
            upsert.execute(params![
                key,
                day,
                endpoint.as_str(),
                to_i64(counts.requests),
                to_i64(counts.credits)
            ])?;
        }
    }
    tx.commit()
}

/// The writer thread: a flush, then a look for new grants, every `every`
/// until `Drop` sets `stop`. Logs when this starts failing and when it
/// recovers, not once a second.
fn write_periodically(shared: &Shared, every: Duration) {
    let ledger_path = shared.path.display();
    let mut failing = false;
    loop {
        let stop = lock(&shared.stop);
        let (stop, _) = shared
            .wake
            .wait_timeout_while(stop, every, |stop| !*stop)
            .unwrap_or_else(PoisonError::into_inner);
        if *stop {
            return;
        }
        drop(stop);
        let done = shared.flush().and_then(|()| shared.poll_grants());
        match (done, failing) {
            (Ok(()), true) => {
                failing = false;
                tracing::info!(path = %ledger_path, "usage ledger writes again");
            }
            (Err(e), false) => {
                failing = true;
                tracing::error!("{e}; counts stay in memory and are retried");
            }
            _ => {}
        }
    }
}

/// SQLite integers are signed; counts never reach `i64::MAX`, but saturate
/// rather than wrap if they did.
fn to_i64(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// The inverse of [`to_i64`]; a negative count (a hand-edited file) reads 0.
fn to_u64(count: i64) -> u64 {
    u64::try_from(count).unwrap_or(0)
}

/// The UTC day of `now`, `YYYY-MM-DD`. A clock before 1970 counts on
/// 1970-01-01 and one past 9999 on 9999-12-31 rather than fail a request.
/// The ledger's unit, and the shared store's.
pub fn utc_day(now: SystemTime) -> String {
    let seconds = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let seconds = i64::try_from(seconds).unwrap_or(i64::MAX);
    match Timestamp::from_unix(seconds) {
        Some(instant) => instant.to_string()[..10].to_owned(),
        None => "9999-12-31".to_owned(),
    }
}

/// Now, `YYYY-MM-DDTHH:MM:SSZ`.
pub fn now_timestamp() -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Timestamp::from_unix(i64::try_from(seconds).unwrap_or(i64::MAX))
        .map_or_else(|| "9999-12-31T23:59:59Z".to_owned(), |t| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Never in a test that waits for it: tests flush by hand.
    const HOUR: Duration = Duration::from_secs(3_600);

    /// A scratch folder, removed on drop, and the ledger file in a
    /// subfolder of it that does not exist yet.
    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state").join("usage.sqlite");
        (dir, db)
    }

    fn row(key: &str, day: &str, requests: u64, credits: u64) -> UsageRow {
        UsageRow {
            key: key.to_owned(),
            day: day.to_owned(),
            requests,
            credits,
        }
    }

    #[test]
    fn a_new_ledger_and_its_wal_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, db) = scratch();
        let ledger = Ledger::open(&db, HOUR).unwrap();
        ledger.record_on("alice", "2026-01-01", Endpoint::Post, 1);
        ledger.flush().unwrap();
        let wal = db.with_extension("sqlite-wal");
        for path in [db.clone(), wal] {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
    }

    #[test]
    fn a_failed_flush_keeps_the_counts_for_the_next() {
        let (_dir, db) = scratch();
        let ledger = Ledger::open(&db, HOUR).unwrap();
        lock(&ledger.shared.conn)
            .busy_timeout(Duration::from_millis(20))
            .unwrap();
        ledger.record_on("alice", "2026-01-01", Endpoint::Post, 4);
        // Another process holds the write lock.
        let other = Connection::open(&db).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let error = ledger.flush().unwrap_err();
        assert!(
            error.to_string().contains("usage.sqlite"),
            "names the file: {error}"
        );
        assert_eq!(ledger.lifetime_credits().unwrap()["alice"], 4);
        ledger.record_on("alice", "2026-01-01", Endpoint::Post, 1);
        other.execute_batch("ROLLBACK").unwrap();
        ledger.flush().unwrap();
        assert_eq!(
            usage(&db, None).unwrap(),
            [row("alice", "2026-01-01", 2, 5)]
        );
    }

    #[test]
    fn one_process_serves_from_a_ledger_at_a_time() {
        let (_dir, db) = scratch();
        let serving = Ledger::open(&db, HOUR).unwrap();
        let second = Ledger::open(&db, HOUR).err().expect("refused");
        assert!(matches!(second, LedgerError::InUse { .. }), "{second}");
        assert!(second.to_string().contains("usage.sqlite"), "{second}");
        // The CLI's commands work beside it.
        grant(&db, "alice", 2, None).unwrap();
        drop(serving);
        drop(Ledger::open(&db, HOUR).unwrap());
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let (_dir, db) = scratch();
        drop(Ledger::open(&db, HOUR).unwrap());
        Connection::open(&db)
            .unwrap()
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let refused = |result: Result<(), LedgerError>| match result {
            Err(e @ LedgerError::NewerSchema { .. }) => assert!(
                e.to_string().contains("usage.sqlite") && !e.to_string().contains('\n'),
                "{e}"
            ),
            other => panic!("{other:?}"),
        };
        refused(Ledger::open(&db, HOUR).map(drop));
        refused(usage(&db, None).map(drop));
    }

    #[test]
    fn days_are_utc_calendar_days() {
        let at = |seconds| utc_day(UNIX_EPOCH + Duration::from_secs(seconds));
        assert_eq!(at(0), "1970-01-01");
        assert_eq!(at(951_782_400), "2000-02-29");
        assert_eq!(at(1_763_769_599), "2025-11-21");
        assert_eq!(at(1_763_769_600), "2025-11-22");
        assert_eq!(utc_day(UNIX_EPOCH - Duration::from_secs(1)), "1970-01-01");
    }

    #[test]
    fn a_version_1_file_is_migrated_in_place_keeping_its_counts() {
        let (_dir, db) = scratch();
        std::fs::create_dir_all(db.parent().unwrap()).unwrap();
        {
            let old = Connection::open(&db).unwrap();
            old.execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE usage (key TEXT NOT NULL, day TEXT NOT NULL,
                     requests INTEGER NOT NULL, credits INTEGER NOT NULL,
                     PRIMARY KEY (key, day));
                 INSERT INTO usage VALUES ('alice', '2026-01-01', 3, 3), ('bob', '2026-01-02', 1, 1);
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        }
        // Read before any migration: the old file as it is.
        let before = usage(&db, None).unwrap();
        assert_eq!(
            before,
            [
                row("alice", "2026-01-01", 3, 3),
                row("bob", "2026-01-02", 1, 1)
            ]
        );
        assert_eq!(usage_by_endpoint(&db, None).unwrap()[0].endpoint, None);
        assert_eq!(book(&db, "alice").unwrap().spent, 3);

        let ledger = Ledger::open(&db, HOUR).unwrap();
        assert_eq!(ledger.lifetime_credits().unwrap()["alice"], 3);
        ledger.record_on("alice", "2026-01-01", Endpoint::Post, 2);
        ledger.flush().unwrap();
        assert_eq!(
            usage(&db, None).unwrap(),
            [
                row("alice", "2026-01-01", 4, 5),
                row("bob", "2026-01-02", 1, 1)
            ],
            "old counts and new ones add up per day"
        );
        let alice: Vec<_> = usage_by_endpoint(&db, None)
            .unwrap()
            .into_iter()
            .filter(|r| r.key == "alice")
            .map(|r| (r.endpoint, r.credits))
            .collect();
        assert_eq!(alice, [(None, 3), (Some("post".to_owned()), 2)]);
        let version: i64 = Connection::open(&db)
            .unwrap()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        drop(ledger);
        // Opening again migrates nothing twice.
        let ledger = Ledger::open(&db, HOUR).unwrap();
        assert_eq!(ledger.lifetime_credits().unwrap()["alice"], 5);
    }

    #[test]
    fn spent_today_counts_only_that_day() {
        let (_dir, db) = scratch();
        let ledger = Ledger::open(&db, HOUR).unwrap();
        ledger.record_on("alice", "2026-01-01", Endpoint::Post, 4);
        ledger.flush().unwrap();
        ledger.record_on("alice", "2026-01-02", Endpoint::Post, 2);
        ledger.record_on("alice", "2026-01-02", Endpoint::Search, 1);
        assert_eq!(
            ledger.spent("2026-01-02").unwrap()["alice"],
            Spent { total: 7, today: 3 }
        );
    }
}
