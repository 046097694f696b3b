//! API keys in the shared store: `keys issue`, `revoke`, `list` and
//! `import` with a redis config act here, and every replica follows
//! ([`crate::reload::follow_shared_keys`]).
//!
//! The keys are one hash (`{prefix}keys`: name -> `SHA256 CREATED`, hashes
//! only, as in the keys file), a version (`{prefix}keys:version`) that
//! every change increments in the same script, and a stamp
//! (`{prefix}keys:stamp`) every change sets to a random value. A replica
//! reads both every [`POLL_EVERY`] and the whole hash only when either
//! moved, so a change is served everywhere within about half a second, for
//! one small read per replica and interval. The stamp is what tells a
//! Redis restored from an older copy and changed since: its version may be
//! back at a number a replica has seen, with other keys. When Redis is
//! away the last set read keeps answering: refusing every key would turn a
//! Redis outage into a full one.

use std::time::Duration;

use redis::{AsyncCommands, Script};

use super::{KeyRecord, KeyStore, KeysError};
use crate::shared::{Shared, StateError};

/// How often a replica looks for changed keys.
pub const POLL_EVERY: Duration = Duration::from_millis(500);

/// Adds a record unless its name is taken; 1 if added. Every script here
/// marks a change the same way: the version up by one, a new stamp
/// (`ARGV[1]`, random, made by the caller: scripts replicate by effect, but
/// Lua's own randomness is seeded alike everywhere).
const ADD: &str = r"
local added = redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3])
if added == 1 then
  redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[3], ARGV[1])
end
return added
";

/// Adds every record (`ARGV`: the stamp, then name, value, name, value, ...) whose name is
/// free, or none: `{'clash', NAME, OWNER}` if the key of one to add is
/// there under another name (two names for one key would answer as
/// whichever the set read last), else `{'ok', SKIPPED...}`, the names taken
/// already. One script, so no command runs between the check and the
/// writes (only Redis failing mid-script, out of memory say, could stop
/// it part way).
const IMPORT: &str = r"
local owners = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local sha = string.match(all[i + 1], '^%S+')
  if sha then owners[string.lower(sha)] = all[i] end
end
for i = 2, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then
    local owner = owners[string.lower(string.match(ARGV[i + 1], '^%S+') or '')]
    if owner then return {'clash', ARGV[i], owner} end
  end
end
local answer = {'ok'}
local added = 0
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    added = added + 1
  else
    table.insert(answer, ARGV[i])
  end
end
if added > 0 then
  redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[3], ARGV[1])
end
return answer
";

/// Removes a record; 1 if there was one.
const REMOVE: &str = r"
local removed = redis.call('HDEL', KEYS[1], ARGV[2])
if removed == 1 then
  redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[3], ARGV[1])
end
return removed
";

/// Where the shared keys live, and what marks their changes.
struct Names {
    hash: String,
    version: String,
    stamp: String,
}

/// Which change of the key set a replica read last: the version and the
/// stamp (either moved: read the set again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    version: Option<u64>,
    stamp: Option<String>,
}

/// A fresh stamp for a change: 16 random hex digits.
fn new_stamp() -> Result<String, KeysError> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes).map_err(|e| KeysError::Random(e.to_string()))?;
    Ok(format!("{:016x}", u64::from_be_bytes(bytes)))
}

/// The shared keys.
pub struct SharedKeys<'a>(pub &'a Shared);

impl SharedKeys<'_> {
    fn names(&self) -> Names {
        Names {
            hash: self.0.key("keys"),
            version: self.0.key("keys:version"),
            stamp: self.0.key("keys:stamp"),
        }
    }

    /// Every record, by creation then name.
    pub async fn records(&self) -> Result<Vec<KeyRecord>, StateError> {
        let hash = self.names().hash;
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

    /// What every change moves: the version and the stamp.
    pub async fn seen(&self) -> Result<Seen, StateError> {
        let Names { version, stamp, .. } = self.names();
        let (version, stamp): (Option<u64>, Option<String>) = self
            .0
            .run("keys", |mut conn| async move {
                redis::pipe()
                    .get(version)
                    .get(stamp)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(Seen { version, stamp })
    }

    /// Runs `script`, one of those that change the set: its KEYS the hash,
    /// the version and the stamp, its ARGV a new stamp and then `args`.
    async fn change<T: redis::FromRedisValue>(
        &self,
        script: &'static str,
        args: Vec<String>,
    ) -> Result<T, KeysError> {
        let Names {
            hash,
            version,
            stamp,
        } = self.names();
        let new_stamp = new_stamp()?;
        let answer = self
            .0
            .run("keys", |mut conn| async move {
                let script = Script::new(script);
                let mut invocation = script.key(hash);
                invocation.key(version).key(stamp).arg(new_stamp);
                for arg in &args {
                    invocation.arg(arg);
                }
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        Ok(answer)
    }

    /// Adds `record`; false if its name is taken.
    async fn add(&self, record: &KeyRecord) -> Result<bool, KeysError> {
        let value = format!("{} {}", record.sha256, record.created);
        let added: i64 = self.change(ADD, vec![record.name.clone(), value]).await?;
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
        let removed: i64 = self.change(REMOVE, vec![name.to_owned()]).await?;
        if removed == 1 {
            Ok(())
        } else {
            Err(KeysError::Unknown(name.to_owned()))
        }
    }

    /// Copies `records` (a keys file's, checked) in, all or none: returns
    /// the names skipped because a key of that name is there already (never
    /// overwritten: that would swap a key). Refused whole, with nothing
    /// written, if a name breaks the rule or a key to add is there under
    /// another name.
    pub async fn import(&self, records: &[KeyRecord]) -> Result<Vec<String>, KeysError> {
        for record in records {
            KeyRecord::check_name(&record.name)?;
        }
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let args = records
            .iter()
            .flat_map(|r| [r.name.clone(), format!("{} {}", r.sha256, r.created)])
            .collect();
        let answer: Vec<String> = self.change(IMPORT, args).await?;
        match answer.split_first() {
            Some((ok, skipped)) if ok == "ok" => Ok(skipped.to_vec()),
            Some((clash, [name, owner])) if clash == "clash" => Err(KeysError::SameKeyShared {
                name: name.clone(),
                owner: owner.clone(),
            }),
            _ => Err(StateError::Malformed("keys import's answer".into()).into()),
        }
    }
}
