//! Pagination cursors: the upstream cursor of the provider that answered,
//! sealed into an opaque token the caller passes back as `cursor`.
//!
//! Tokens are encrypted and authenticated (XChaCha20-Poly1305), so a caller
//! can neither read which provider answered nor forge or alter a token. The
//! platform, endpoint and subject (username, post ID or query) are bound in
//! as associated data: a token only continues the listing it came from.
//!
//! Built for a key that lives for years: nonces are 192 random bits (no
//! birthday collision in any realistic number of tokens), the cipher key is
//! derived from the secret with HKDF under a label, and each token carries
//! its issue time (it expires after `cursor_ttl_s`) and its key's ID (so
//! the previous secret, `cursor_key_previous_env`, still opens tokens after
//! a rotation). The sealed text is padded to a multiple of 256 bytes, so a
//! token's length does not tell which provider issued it.
//!
//! The key comes from the variable named by `[server] cursor_key_env`;
//! without it each process draws a random key, and tokens do not survive a
//! restart.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use hkdf::hmac::{Hmac, Mac};
use hkdf::Hkdf;
use sha2::Sha256;

use crate::error::ApiError;
use crate::settings::{ConfigError, Context, RawServer, Secret};

/// The shortest cursor secret `cursor_key_env` may hold.
const MIN_SECRET_LEN: usize = 32;
/// `[server] cursor_ttl_s` when unset: a day.
const DEFAULT_TTL: Duration = Duration::from_secs(86_400);
/// The longest `cursor_ttl_s`: a year.
const MAX_TTL_S: u64 = 365 * 86_400;

/// `[server] cursor_key_env`, `cursor_key_previous_env` and `cursor_ttl_s`.
#[derive(Debug, Clone, PartialEq)]
pub struct CursorConfig {
    /// The secret new tokens are sealed with; `None`: a random key per
    /// process.
    pub key: Option<Secret>,
    /// A secret whose tokens are still opened, after a rotation.
    pub previous_key: Option<Secret>,
    /// How long a token stays valid after it was issued.
    pub ttl: Duration,
}

impl CursorConfig {
    pub fn from_raw(raw: &RawServer, cx: &Context) -> Result<CursorConfig, ConfigError> {
        let secret = |key: &str, var: &Option<String>| -> Result<Option<Secret>, ConfigError> {
            let Some(var) = var else {
                return Ok(None);
            };
            let secret = cx.secret(key, var)?;
            if secret.expose().len() < MIN_SECRET_LEN {
                return Err(cx.invalid(
                    key,
                    format!("`{var}` must hold at least {MIN_SECRET_LEN} characters"),
                ));
            }
            Ok(Some(secret))
        };
        let key = secret("[server] cursor_key_env", &raw.cursor_key_env)?;
        let previous_key = secret(
            "[server] cursor_key_previous_env",
            &raw.cursor_key_previous_env,
        )?;
        if previous_key.is_some() && key.is_none() {
            return Err(cx.invalid(
                "[server] cursor_key_previous_env",
                "needs `cursor_key_env` too: it names the key that replaced it",
            ));
        }
        let ttl = match raw.cursor_ttl_s {
            None => DEFAULT_TTL,
            Some(s) if (1..=MAX_TTL_S).contains(&s) => Duration::from_secs(s),
            Some(_) => {
                return Err(cx.invalid(
                    "[server] cursor_ttl_s",
                    format!("must be 1-{MAX_TTL_S} (a year)"),
                ))
            }
        };
        Ok(CursorConfig {
            key,
            previous_key,
            ttl,
        })
    }

    /// The settings (as written in the file) whose values differ in `new`.
    pub fn changed_settings(&self, new: &CursorConfig) -> Vec<&'static str> {
        let CursorConfig {
            key,
            previous_key,
            ttl,
        } = self;
        [
            ("[server] cursor_key_env", *key != new.key),
            (
                "[server] cursor_key_previous_env",
                *previous_key != new.previous_key,
            ),
            ("[server] cursor_ttl_s", *ttl != new.ttl),
        ]
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
    }
}

const KEY_ID_LEN: usize = 4;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
/// The sealed text's length is rounded up to a multiple of this.
const PAD_TO: usize = 256;
/// Longer tokens are refused before any work: no honest token comes close
/// (a 1 KiB upstream cursor makes about 1.8 KB).
const MAX_TOKEN_LEN: usize = 2048;

/// The most pages one listing has: the last has no next cursor.
pub const MAX_PAGES: u16 = 1000;
/// How many of a listing's latest upstream cursors it remembers: an
/// upstream cycling through up to this many pages ends the listing.
const TRAIL_LEN: usize = 8;

/// What a token carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The provider that issued the upstream cursor.
    pub provider: String,
    /// That provider's own cursor.
    pub upstream: String,
    /// Where the listing has been, so a cycling upstream cannot page (and
    /// charge) forever.
    pub trail: Trail,
}

/// How far a listing has come: the pages delivered before the one a token
/// asks for, and hashes of its latest upstream cursors, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trail {
    pub pages: u16,
    pub recent: Vec<u64>,
}

impl Trail {
    /// The trail of the page that continues from `upstream`.
    pub fn at(mut self, upstream: &str) -> Trail {
        self.recent.push(cursor_hash(upstream));
        if self.recent.len() > TRAIL_LEN {
            self.recent.remove(0);
        }
        self
    }

    /// The trail to seal with `next`, the upstream cursor after this page;
    /// `None` when the listing ends here instead: `next` is a cursor it
    /// has lately been at (the upstream cycles), or it has [`MAX_PAGES`].
    pub fn then(&self, next: &str) -> Option<Trail> {
        let pages = self.pages.saturating_add(1);
        if pages >= MAX_PAGES || self.recent.contains(&cursor_hash(next)) {
            return None;
        }
        Some(Trail {
            pages,
            recent: self.recent.clone(),
        })
    }
}

fn cursor_hash(upstream: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(upstream.as_bytes())
}

/// Where a listing is: the token is only valid for the same one.
#[derive(Debug, Clone, Copy)]
pub struct Listing<'a> {
    pub platform: &'a str,
    pub endpoint: &'a str,
    pub subject: &'a str,
}

impl Listing<'_> {
    fn associated_data(&self) -> Vec<u8> {
        [self.platform, self.endpoint, self.subject]
            .join("\0")
            .into_bytes()
    }
}

/// Why a token does not open.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CursorError {
    /// Tampered, made up, from another listing, or sealed with a key this
    /// process does not hold.
    #[error("not a cursor this listing issued")]
    Invalid,
    /// Genuine, but older than `cursor_ttl_s`.
    #[error("the cursor has expired")]
    Expired,
}

/// One derived key and its ID.
struct SealingKey {
    id: [u8; KEY_ID_LEN],
    cipher: XChaCha20Poly1305,
    /// Keys the entity tags of pages with a next cursor.
    tag_key: [u8; 32],
}

impl SealingKey {
    /// Derives the cipher key and the key ID from `secret` with HKDF, under
    /// labels that no other use of the secret shares.
    fn derive(secret: &[u8]) -> SealingKey {
        let hkdf = Hkdf::<Sha256>::new(None, secret);
        let mut key = [0u8; 32];
        let mut id = [0u8; KEY_ID_LEN];
        // Both lengths are far below HKDF-SHA256's limit of 8160 bytes.
        hkdf.expand(b"socialgate cursor key v2", &mut key)
            .expect("32 bytes is a valid HKDF length");
        hkdf.expand(b"socialgate cursor key id v2", &mut id)
            .expect("4 bytes is a valid HKDF length");
        let mut tag_key = [0u8; 32];
        hkdf.expand(b"socialgate page etag key v1", &mut tag_key)
            .expect("32 bytes is a valid HKDF length");
        SealingKey {
            id,
            cipher: XChaCha20Poly1305::new(Key::from_slice(&key)),
            tag_key,
        }
    }
}

/// Seals and opens tokens: new ones with the current key, old ones with
/// the current or the previous key.
pub struct CursorSealer {
    current: SealingKey,
    previous: Option<SealingKey>,
    ttl: Duration,
}

impl CursorSealer {
    /// From the configured secrets, or a random key when there is none.
    pub fn new(config: &CursorConfig) -> Result<CursorSealer, getrandom::Error> {
        let current = match &config.key {
            Some(secret) => SealingKey::derive(secret.expose().as_bytes()),
            None => {
                let mut random = [0u8; 32];
                getrandom::getrandom(&mut random)?;
                SealingKey::derive(&random)
            }
        };
        Ok(CursorSealer {
            current,
            previous: config
                .previous_key
                .as_ref()
                .map(|secret| SealingKey::derive(secret.expose().as_bytes())),
            ttl: config.ttl,
        })
    }

    /// How long a page with a token sealed now may be reused as it is:
    /// half of `cursor_ttl_s` (at least a second), as [`tag_epoch`](Self::tag_epoch)
    /// counts. A client's cache keeping it longer would hand out a token
    /// that may have expired.
    pub fn reusable_for(&self) -> u64 {
        (self.ttl.as_secs() / 2).max(1)
    }

    /// What the entity tag of a page with a next cursor adds, so that a
    /// `304` never confirms a stored page whose token has expired or no
    /// longer opens: the sealing key's ID (a restart without
    /// `cursor_key_env` changes it) and which half of `cursor_ttl_s` it is
    /// now. A page revalidated in the half its token was issued in has a
    /// token with at least half its life left; past it, the tag changes
    /// and the page comes whole, with a new token.
    pub fn tag_epoch(&self) -> [u8; KEY_ID_LEN + 8] {
        let half = self.reusable_for();
        let mut epoch = [0u8; KEY_ID_LEN + 8];
        epoch[..KEY_ID_LEN].copy_from_slice(&self.current.id);
        epoch[KEY_ID_LEN..].copy_from_slice(&(unix_now() / half).to_le_bytes());
        epoch
    }

    /// The entity tag's hash of a page with a next cursor: an HMAC over
    /// `parts` (which hold the upstream cursor) and [`tag_epoch`](Self::tag_epoch),
    /// keyed from the cursor secret, so that a caller who guesses the
    /// hidden cursor cannot confirm the guess against the tag offline.
    pub fn page_tag(&self, parts: &[&[u8]]) -> u128 {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.current.tag_key)
            .expect("HMAC takes a key of any length");
        for part in parts.iter().copied().chain([&self.tag_epoch()[..]]) {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        let digest = mac.finalize().into_bytes();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        u128::from_be_bytes(first)
    }

    pub fn seal(&self, listing: Listing<'_>, position: &Position) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        // A failing OS random source is not survivable for a server anyway.
        getrandom::getrandom(&mut nonce).expect("OS randomness");
        let plain = encode(position, unix_now());
        let aad = listing.associated_data();
        let sealed = self
            .current
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &plain,
                    aad: &aad,
                },
            )
            .expect("in-memory encryption cannot fail");
        let mut token = Vec::with_capacity(KEY_ID_LEN + NONCE_LEN + sealed.len());
        token.extend_from_slice(&self.current.id);
        token.extend_from_slice(&nonce);
        token.extend_from_slice(&sealed);
        URL_SAFE_NO_PAD.encode(token)
    }

    pub fn open(&self, listing: Listing<'_>, token: &str) -> Result<Position, CursorError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(CursorError::Invalid);
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| CursorError::Invalid)?;
        if bytes.len() < KEY_ID_LEN + NONCE_LEN + TAG_LEN {
            return Err(CursorError::Invalid);
        }
        let (id, rest) = bytes.split_at(KEY_ID_LEN);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let key = [Some(&self.current), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .find(|key| key.id == id)
            .ok_or(CursorError::Invalid)?;
        let aad = listing.associated_data();
        let plain = key
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| CursorError::Invalid)?;
        let (issued, position) = decode(&plain).ok_or(CursorError::Invalid)?;
        if unix_now().saturating_sub(issued) > self.ttl.as_secs() {
            return Err(CursorError::Expired);
        }
        Ok(position)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `issued (u64 BE) | provider length (u8) | provider | upstream length
/// (u16 BE) | upstream | pages (u16 BE) | recent count (u8) | recent (u64
/// BE each) | zeros`, padded to a multiple of [`PAD_TO`]. A token sealed
/// before the trail was added reads as pages 0, nothing recent.
fn encode(position: &Position, issued: u64) -> Vec<u8> {
    // Provider names are at most 64 bytes (config) and upstream cursors at
    // most 1 KiB (the plugin boundary), far inside both length fields.
    let provider_len = u8::try_from(position.provider.len()).expect("a provider name fits");
    let upstream_len = u16::try_from(position.upstream.len()).expect("an upstream cursor fits");
    let recent = &position.trail.recent[..position.trail.recent.len().min(TRAIL_LEN)];
    let len =
        8 + 1 + position.provider.len() + 2 + position.upstream.len() + 2 + 1 + 8 * recent.len();
    let mut plain = Vec::with_capacity(len.next_multiple_of(PAD_TO));
    plain.extend_from_slice(&issued.to_be_bytes());
    plain.push(provider_len);
    plain.extend_from_slice(position.provider.as_bytes());
    plain.extend_from_slice(&upstream_len.to_be_bytes());
    plain.extend_from_slice(position.upstream.as_bytes());
    plain.extend_from_slice(&position.trail.pages.to_be_bytes());
    plain.push(u8::try_from(recent.len()).expect("a short trail"));
    for hash in recent {
        plain.extend_from_slice(&hash.to_be_bytes());
    }
    plain.resize(len.next_multiple_of(PAD_TO), 0);
    plain
}

fn decode(plain: &[u8]) -> Option<(u64, Position)> {
    let (issued, rest) = plain.split_first_chunk::<8>()?;
    let (&provider_len, rest) = rest.split_first()?;
    let (provider, rest) = rest.split_at_checked(usize::from(provider_len))?;
    let (upstream_len, rest) = rest.split_first_chunk::<2>()?;
    let (upstream, rest) = rest.split_at_checked(usize::from(u16::from_be_bytes(*upstream_len)))?;
    let (pages, rest) = rest.split_first_chunk::<2>()?;
    let (&count, mut rest) = rest.split_first()?;
    if usize::from(count) > TRAIL_LEN {
        return None;
    }
    let mut recent = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let (hash, after) = rest.split_first_chunk::<8>()?;
        recent.push(u64::from_be_bytes(*hash));
        rest = after;
    }
    Some((
        u64::from_be_bytes(*issued),
        Position {
            provider: String::from_utf8(provider.to_vec()).ok()?,
            upstream: String::from_utf8(upstream.to_vec()).ok()?,
            trail: Trail {
                pages: u16::from_be_bytes(*pages),
                recent,
            },
        },
    ))
}

/// A refused cursor, as its caller is told (the catalogue's
/// `INVALID_PARAMETER` naming `cursor`).
impl From<CursorError> for ApiError {
    fn from(error: CursorError) -> ApiError {
        match error {
            CursorError::Invalid => ApiError::bad_cursor(),
            CursorError::Expired => ApiError::expired_cursor(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: Listing<'static> = Listing {
        platform: "shortvideo",
        endpoint: "comments",
        subject: "7312345678901234567",
    };

    fn position() -> Position {
        Position {
            provider: "shortvideo-primary".into(),
            upstream: "50".into(),
            trail: Trail {
                pages: 3,
                recent: vec![1, 2],
            },
        }
    }

    fn random() -> CursorSealer {
        let config = CursorConfig {
            key: None,
            previous_key: None,
            ttl: DEFAULT_TTL,
        };
        CursorSealer::new(&config).unwrap()
    }

    #[test]
    fn round_trips_and_hides_the_provider() {
        let sealer = random();
        let token = sealer.seal(LISTING, &position());
        assert!(!token.contains("primary"));
        assert_eq!(sealer.open(LISTING, &token), Ok(position()));
        assert_ne!(
            token,
            sealer.seal(LISTING, &position()),
            "fresh nonce each time"
        );
    }

    #[test]
    fn the_longest_position_fits_in_a_token() {
        let sealer = random();
        let longest = Position {
            provider: "p".repeat(64),
            upstream: "9".repeat(plugin_api::ffi::MAX_CURSOR_LEN),
            trail: Trail {
                pages: MAX_PAGES,
                recent: vec![u64::MAX; TRAIL_LEN],
            },
        };
        let token = sealer.seal(LISTING, &longest);
        assert!(token.len() <= MAX_TOKEN_LEN, "{}", token.len());
        assert_eq!(sealer.open(LISTING, &token), Ok(longest));
    }

    #[test]
    fn a_listing_ends_at_a_recent_cursor_or_at_max_pages() {
        let mut trail = Trail::default();
        for i in 0..TRAIL_LEN {
            trail = trail.at(&i.to_string());
        }
        for i in 0..TRAIL_LEN {
            assert_eq!(trail.then(&i.to_string()), None, "cursor {i} is recent");
        }
        assert!(trail.then("new").is_some());
        let last = Trail {
            pages: MAX_PAGES - 1,
            recent: Vec::new(),
        };
        assert_eq!(last.then("new"), None, "page {MAX_PAGES} is the last");
    }
}
