//! Request IDs: the caller's `X-Request-Id` when it is sane, otherwise a
//! fresh UUID v4. Echoed in the answer's header and `meta.request_id`, and
//! carried by every log line of the request, so a caller's report can be
//! matched to the operator's logs.

use hyper::header::{HeaderName, HeaderValue};

pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The ID for a request carrying `given` (the header's value, if any).
pub fn accept_or_generate(given: Option<&HeaderValue>) -> String {
    given
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_valid(v))
        .map(str::to_owned)
        .unwrap_or_else(uuid_v4)
}

/// 1-128 characters of `[A-Za-z0-9._:-]`: safe in logs and headers.
pub fn is_valid(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    random_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex = format!("{:032x}", u128::from_be_bytes(b));
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Bytes from the OS random source. An ID needs uniqueness, not secrecy,
/// but the bytes are the OS's all the same.
fn random_bytes(out: &mut [u8; 16]) {
    if getrandom::getrandom(out).is_err() {
        // Unique enough for a correlation ID when the OS source fails.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        *out = nanos.to_le_bytes();
    }
}
