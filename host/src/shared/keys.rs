//! API keys in the shared store: `keys issue`, `revoke`, `list` and
//! `import` with a redis config act here, and every replica follows.
//!
//! The keys are one hash (`{prefix}keys`: name -> `SHA256 CREATED`, hashes
//! only, as in the keys file) and a version (`{prefix}keys:version`) that
//! every change increments in the same script. A replica reads the version
//! every [`POLL_EVERY`] and the whole hash only when it moved, so a change
//! is served everywhere within about half a second, for one small read per
//! replica and interval. When Redis is away the last set read keeps
//! answering: refusing every key would turn a Redis outage into a full one.

use std::sync::Arc;
use std::time::Duration;

use redis::{AsyncCommands, Script};
use tokio_util::sync::CancellationToken;

use super::{Shared, StateError};
use crate::auth::{KeyRecord, KeyStore, KeysError};
use crate::state::App;

/// How often a replica looks for changed keys.
pub const POLL_EVERY: Duration = Duration::from_millis(500);

/// Adds a record unless its name is taken; 1 if added.
const ADD: &str = r"
local added = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if added == 1 then redis.call('INCR', KEYS[2]) end
return added
";

/// Removes a record; 1 if there was one.
const REMOVE: &str = r"
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
if removed == 1 then redis.call('INCR', KEYS[2]) end
return removed
";

/// The shared keys.
pub struct SharedKeys<'a>(pub &'a Shared);

impl SharedKeys<'_> {
    fn names(&self) -> (String, String) {
        (self.0.key("keys"), self.0.key("keys:version"))
    }

    /// Every record, by creation then name.
    pub async fn records(&self) -> Result<Vec<KeyRecord>, StateError> {
        let (hash, _) = self.names();
        let all: Vec<(String, String)> = self
            .0
            .run("keys", |mut conn| async move { conn.hgetall(hash).await })
            .await?;
        let mut records = all
            .into_iter()
            .map(|(name, value)| {
                let (sha256, created) = value
                    .split_once(' ')
                    .ok_or_else(|| StateError::Malformed(format!("keys {name}")))?;
                Ok(KeyRecord {
                    sha256: sha256.to_owned(),
                    created: created.to_owned(),
                    name,
                })
            })
            .collect::<Result<Vec<_>, StateError>>()?;
        records.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
        Ok(records)
    }

    /// The keys a server accepts.
    pub async fn store(&self) -> Result<KeyStore, StateError> {
        KeyStore::from_records(self.records().await?)
            .map_err(|name| StateError::Malformed(format!("keys {name}")))
    }

    /// The version every change moves.
    async fn version(&self) -> Result<u64, StateError> {
        let (_, version) = self.names();
        let value: Option<u64> = self
            .0
            .run("keys", |mut conn| async move { conn.get(version).await })
            .await?;
        Ok(value.unwrap_or(0))
    }

    /// Adds `record`; false if its name is taken.
    async fn add(&self, record: &KeyRecord) -> Result<bool, StateError> {
        let (hash, version) = self.names();
        let value = format!("{} {}", record.sha256, record.created);
        let name = record.name.clone();
        let added: i64 = self
            .0
            .run("keys", |mut conn| async move {
                Script::new(ADD)
                    .key(hash)
                    .key(version)
                    .arg(name)
                    .arg(value)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(added == 1)
    }

    /// Issues a key named `name`; returns the key, shown only now.
    pub async fn issue(&self, name: &str) -> Result<String, KeysError> {
        let (key, record) = KeyRecord::issue(name)?;
        if !self.add(&record).await? {
            return Err(KeysError::Duplicate(name.to_owned()));
        }
        Ok(key)
    }

    /// Revokes the key named `name`.
    pub async fn revoke(&self, name: &str) -> Result<(), KeysError> {
        let (hash, version) = self.names();
        let target = name.to_owned();
        let removed: i64 = self
            .0
            .run("keys", |mut conn| async move {
                Script::new(REMOVE)
                    .key(hash)
                    .key(version)
                    .arg(target)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        if removed == 1 {
            Ok(())
        } else {
            Err(KeysError::Unknown(name.to_owned()))
        }
    }

    /// Copies `records` in; returns the names skipped because a key of that
    /// name is there already (never overwritten: that would swap a key).
    pub async fn import(&self, records: Vec<KeyRecord>) -> Result<Vec<String>, KeysError> {
        let mut skipped = Vec::new();
        for record in records {
            KeyRecord::check_name(&record.name)?;
            if !self.add(&record).await? {
                skipped.push(record.name);
            }
        }
        Ok(skipped)
    }
}

/// Follows the shared keys until `shutdown`: every [`POLL_EVERY`], the
/// version; when it moved (or a reload swapped in a snapshot with other
/// keys), the set. Failures keep the last set serving.
pub async fn follow(app: Arc<App>, shared: Arc<Shared>, shutdown: CancellationToken) {
    let keys = SharedKeys(&shared);
    let mut seen = None;
    let mut applied = app.snapshot().keys.clone();
    loop {
        tokio::select! {
            () = tokio::time::sleep(POLL_EVERY) => {}
            () = shutdown.cancelled() => return,
        }
        let Ok(version) = keys.version().await else {
            continue;
        };
        if seen != Some(version) {
            match keys.store().await {
                Ok(store) => {
                    if store != *applied {
                        tracing::info!(keys = store.len(), "keys reloaded from the shared store");
                    }
                    applied = Arc::new(store);
                    seen = Some(version);
                }
                Err(e) => {
                    tracing::error!("shared keys unreadable, the last set still answers: {e}");
                    continue;
                }
            }
        }
        let current = app.snapshot();
        if !Arc::ptr_eq(&current.keys, &applied) {
            app.replace(current.with_keys(applied.clone()));
        }
    }
}
