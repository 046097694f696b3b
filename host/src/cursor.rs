//! Pagination cursors: the upstream cursor of the provider that answered,
//! sealed into an opaque token the caller passes back as `cursor`.
//!
//! Tokens are encrypted and authenticated (ChaCha20-Poly1305), so a caller
//! can neither read which provider answered nor forge or alter a token. The
//! platform, endpoint and subject (username, post ID or query) are bound in
//! as associated data: a token only continues the listing it came from.
//!
//! The key comes from the variable named by `[server] cursor_key_env`;
//! without it each process draws a random key, and tokens do not survive a
//! restart.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};

use crate::config::{ConfigError, Context, RawServer, Secret};

/// The shortest cursor secret `cursor_key_env` may hold.
const MIN_SECRET_LEN: usize = 32;

/// `[server] cursor_key_env`: the secret it names, or `None` for a random
/// key per process.
pub fn key_from_raw(raw: &RawServer, cx: &Context) -> Result<Option<Secret>, ConfigError> {
    const KEY: &str = "[server] cursor_key_env";
    let Some(var) = &raw.cursor_key_env else {
        return Ok(None);
    };
    let secret = cx.secret(KEY, var)?;
    if secret.expose().len() < MIN_SECRET_LEN {
        return Err(cx.invalid(
            KEY,
            format!("`{var}` must hold at least {MIN_SECRET_LEN} characters"),
        ));
    }
    Ok(Some(secret))
}

const NONCE_LEN: usize = 12;
/// Longer tokens are refused before any work: no honest token comes close.
const MAX_TOKEN_LEN: usize = 2048;

/// What a token carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The provider that issued the upstream cursor.
    pub provider: String,
    /// That provider's own cursor.
    pub upstream: String,
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

/// The token does not open for this listing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a cursor this listing issued")]
pub struct InvalidCursor;

/// Seals and opens tokens with one key.
pub struct CursorSealer {
    cipher: ChaCha20Poly1305,
}

impl CursorSealer {
    /// From the configured secret, or a random key when there is none.
    pub fn new(secret: Option<&Secret>) -> Result<CursorSealer, getrandom::Error> {
        let key: [u8; 32] = match secret {
            Some(secret) => Sha256::digest(secret.expose().as_bytes()).into(),
            None => {
                let mut key = [0u8; 32];
                getrandom::getrandom(&mut key)?;
                key
            }
        };
        Ok(CursorSealer {
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
        })
    }

    pub fn seal(&self, listing: Listing<'_>, position: &Position) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        // A failing OS random source is not survivable for a server anyway.
        getrandom::getrandom(&mut nonce).expect("OS randomness");
        let mut plain = Vec::with_capacity(position.provider.len() + 1 + position.upstream.len());
        plain.extend_from_slice(position.provider.as_bytes());
        plain.push(0);
        plain.extend_from_slice(position.upstream.as_bytes());
        let aad = listing.associated_data();
        let sealed = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &plain,
                    aad: &aad,
                },
            )
            .expect("in-memory encryption cannot fail");
        let mut token = nonce.to_vec();
        token.extend_from_slice(&sealed);
        URL_SAFE_NO_PAD.encode(token)
    }

    pub fn open(&self, listing: Listing<'_>, token: &str) -> Result<Position, InvalidCursor> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(InvalidCursor);
        }
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| InvalidCursor)?;
        if bytes.len() < NONCE_LEN {
            return Err(InvalidCursor);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let aad = listing.associated_data();
        let plain = self
            .cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| InvalidCursor)?;
        let text = String::from_utf8(plain).map_err(|_| InvalidCursor)?;
        let (provider, upstream) = text.split_once('\0').ok_or(InvalidCursor)?;
        Ok(Position {
            provider: provider.to_owned(),
            upstream: upstream.to_owned(),
        })
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
        }
    }

    #[test]
    fn round_trips_and_hides_the_provider() {
        let sealer = CursorSealer::new(None).unwrap();
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
    fn refuses_tampering_other_listings_and_other_keys() {
        let sealer = CursorSealer::new(None).unwrap();
        let token = sealer.seal(LISTING, &position());
        let mut tampered = token.clone().into_bytes();
        let last = tampered.len() - 5;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(sealer.open(LISTING, &tampered), Err(InvalidCursor));
        let other = Listing {
            subject: "1",
            ..LISTING
        };
        assert_eq!(sealer.open(other, &token), Err(InvalidCursor));
        let other = Listing {
            endpoint: "posts",
            ..LISTING
        };
        assert_eq!(sealer.open(other, &token), Err(InvalidCursor));
        assert_eq!(
            CursorSealer::new(None).unwrap().open(LISTING, &token),
            Err(InvalidCursor)
        );
        for junk in ["", "!!!", "AAAA", &"A".repeat(5000)] {
            assert_eq!(sealer.open(LISTING, junk), Err(InvalidCursor));
        }
    }

    #[test]
    fn a_configured_key_survives_restarts() {
        let secret = Secret::new("k".repeat(40));
        let token = CursorSealer::new(Some(&secret))
            .unwrap()
            .seal(LISTING, &position());
        let reopened = CursorSealer::new(Some(&secret)).unwrap();
        assert_eq!(reopened.open(LISTING, &token), Ok(position()));
    }
}
