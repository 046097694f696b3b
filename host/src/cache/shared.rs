//! The response cache's second level, shared by replicas: an answer one
//! replica fetched is a hit on the others. Each replica's in-process cache
//! stays in front of it ([`crate::cache`]); this level is asked only on a
//! local miss, and written (in the background) whenever a fetch stores an
//! answer. Redis expires an entry when its time to live ends; what stands
//! in when the providers fail (`stale_if_error_s`) is each replica's own.
//!
//! An entry is `{prefix}cache:SHA256` of the cache key: a one-line JSON
//! header (when it was stored, for how long, which provider, its upstream
//! cursor) then the answer's `data` as stored. Redis being away makes it a
//! miss, counted: the providers answer as they would without it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Data, Entry, Key, Stored};
use crate::shared::Shared;

/// What precedes an entry's data.
#[derive(Serialize, Deserialize)]
struct Header {
    /// When it was stored, Unix milliseconds.
    at: u64,
    /// Its time to live, milliseconds.
    ttl: u64,
    /// The provider that gave it; absent for "not found".
    provider: Option<String>,
    next: Option<String>,
}

/// The cache's second level.
pub struct SharedCache {
    shared: Arc<Shared>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl SharedCache {
    pub fn new(shared: Arc<Shared>) -> SharedCache {
        SharedCache { shared }
    }

    fn name(&self, key: &Key) -> String {
        // A key's JSON is canonical (a validated call), and its hash keeps
        // Redis keys short whatever the caller's input.
        let text = serde_json::to_vec(key).unwrap_or_default();
        let hash = Sha256::digest(&text);
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        self.shared.named("cache:", &hex)
    }

    /// The entry stored for `key` by any replica, with its age.
    pub async fn get(&self, key: &Key) -> Option<Entry> {
        let name = self.name(key);
        let value: Option<Vec<u8>> = self
            .shared
            .run("cache_get", |mut conn| async move { conn.get(name).await })
            .await
            .ok()?;
        let value = value?;
        let split = value.iter().position(|b| *b == b'\n')?;
        let header: Header = serde_json::from_slice(&value[..split]).ok()?;
        let answer = match header.provider {
            Some(provider) => Stored::Data(Data {
                json: Bytes::copy_from_slice(&value[split + 1..]),
                provider: provider.into(),
                next_cursor: header.next,
            }),
            None => Stored::NotFound,
        };
        let age = Duration::from_millis(now_ms().saturating_sub(header.at));
        Some(Entry::restored(
            key,
            answer,
            Duration::from_millis(header.ttl),
            age,
        ))
    }

    /// Deletes what is stored under `key`, in the background.
    pub fn forget(self: &Arc<Self>, key: &Key) {
        let name = self.name(key);
        let this = self.clone();
        tokio::spawn(async move {
            let _ = this
                .shared
                .run("cache_forget", |mut conn| async move {
                    conn.del::<_, ()>(name).await
                })
                .await;
        });
    }

    /// Stores `entry` under `key` for the rest of its time to live, in the
    /// background: no request waits for it.
    pub fn put(self: &Arc<Self>, key: &Key, entry: &Entry) {
        let left = entry.ttl().saturating_sub(entry.age());
        if left.is_zero() {
            return;
        }
        let (provider, next, data) = match &entry.answer {
            Stored::Data(data) => (
                Some(data.provider.to_string()),
                data.next_cursor.clone(),
                &data.json[..],
            ),
            Stored::NotFound => (None, None, &b""[..]),
        };
        let header = Header {
            at: now_ms().saturating_sub(entry.age().as_millis() as u64),
            ttl: entry.ttl().as_millis() as u64,
            provider,
            next,
        };
        let Ok(mut value) = serde_json::to_vec(&header) else {
            return;
        };
        value.push(b'\n');
        value.extend_from_slice(data);
        let name = self.name(key);
        let this = self.clone();
        tokio::spawn(async move {
            let millis = left.as_millis().max(1) as u64;
            let _ = this
                .shared
                .run("cache_put", |mut conn| async move {
                    conn.pset_ex::<_, _, ()>(name, value, millis).await
                })
                .await;
        });
    }
}
