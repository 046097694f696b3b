//! How an answer is represented to a caller that can take less: content
//! codings (gzip, br) chosen by `Accept-Encoding`, and strong `ETag`s with
//! `If-None-Match` and `If-Match`. The decisions (which coding, whether a tag matches) are
//! pure functions tested beside them; the codecs are flate2's and brotli's.
//!
//! Only JSON bodies of at least [`MIN_COMPRESSED_BYTES`] are compressed, and
//! only for a caller that asks: a small answer costs more to compress than it
//! saves on the wire. An encoded representation's tag is the identity's with
//! the coding appended (`"<hash>-gzip"`), so tags stay strong per
//! representation, and a conditional request matches on the hash: the data
//! is the same whichever coding carried it.
//!
//! [`represent`] is the last step of every answer: CORS headers
//! ([`super::cors`]), a content coding, no body for `HEAD`, `304` for an
//! answer marked [`NotModified`].

use std::io::Write;

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Body as _;
use hyper::header::{
    HeaderMap, HeaderValue, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG,
    IF_MATCH, IF_NONE_MATCH, VARY,
};
use hyper::{Method, Request, Response, StatusCode};

use super::cors::{self, CorsConfig};
use super::response::Body;

/// Smaller bodies are sent as they are.
pub const MIN_COMPRESSED_BYTES: usize = 1024;

/// A content coding this service produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Brotli,
    Gzip,
}

impl Coding {
    /// Every coding the service speaks.
    pub const ALL: [Coding; 2] = [Coding::Brotli, Coding::Gzip];

    /// The `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// `data` in this coding, at a level fast enough for every answer.
    pub fn encode(self, data: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(data.len() / 4 + 64);
        match self {
            Coding::Gzip => {
                let level = flate2::Compression::new(4);
                let mut encoder = flate2::write::GzEncoder::new(&mut out, level);
                // Writing to a Vec cannot fail.
                let _ = encoder.write_all(data);
                let _ = encoder.finish();
            }
            Coding::Brotli => {
                let params = brotli::enc::BrotliEncoderParams {
                    quality: 4,
                    lgwin: 20,
                    ..Default::default()
                };
                let _ = brotli::BrotliCompress(&mut &data[..], &mut out, &params);
            }
        }
        Bytes::from(out)
    }
}

/// The coding to answer in, from the request's `Accept-Encoding` values:
/// the acceptable one with the higher weight, `br` on a tie; `None` for
/// identity, also when the request weighs `identity` above both (RFC
/// 9110, 12.5.3: weights are preferences). `q=0` refuses a coding; `*`
/// stands for any coding not named (identity not named is taken as the
/// least preferred: compressing is the point of asking).
pub fn negotiate<'a>(accept: impl Iterator<Item = &'a HeaderValue>) -> Option<Coding> {
    let (mut br, mut gzip, mut any) = (None::<u16>, None::<u16>, None::<u16>);
    let mut identity = None::<u16>;
    for value in accept {
        let Ok(value) = value.to_str() else { continue };
        for item in value.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim();
            // `q=`, in either case (RFC 9110, 12.4.2; ABNF strings are
            // case-insensitive).
            let q = parts
                .filter_map(|p| {
                    let p = p.trim();
                    p.get(..2)
                        .filter(|name| name.eq_ignore_ascii_case("q="))
                        .map(|_| &p[2..])
                })
                .next()
                .map_or(Some(1000), parse_q);
            let Some(q) = q else { continue };
            let slot = if name.eq_ignore_ascii_case("br") {
                &mut br
            } else if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
                &mut gzip
            } else if name == "*" {
                &mut any
            } else if name.eq_ignore_ascii_case("identity") {
                &mut identity
            } else {
                continue;
            };
            *slot = Some(slot.map_or(q, |s| s.max(q)));
        }
    }
    let br = br.or(any).unwrap_or(0);
    let gzip = gzip.or(any).unwrap_or(0);
    let (coding, weight) = if br >= gzip {
        (Coding::Brotli, br)
    } else {
        (Coding::Gzip, gzip)
    };
    (weight > 0 && identity.is_none_or(|identity| identity <= weight)).then_some(coding)
}

/// A weight `0`..`1` with up to three decimals, in thousandths.
fn parse_q(q: &str) -> Option<u16> {
    let (int, frac) = q.split_once('.').unwrap_or((q, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac: u16 = format!("{frac:0<3}").parse().ok()?;
    match int {
        "0" => Some(frac),
        "1" if frac == 0 => Some(1000),
        _ => None,
    }
}

/// A strong entity tag over `parts` (a fast 128-bit hash).
pub fn etag(parts: &[&[u8]]) -> HeaderValue {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for part in parts {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    etag_of(hasher.digest128())
}

/// A strong entity tag of a 128-bit `hash`: `"`, 32 hex digits (most
/// significant first), `"`.
pub fn etag_of(hash: u128) -> HeaderValue {
    let tag = format!("\"{hash:032x}\"");
    HeaderValue::try_from(tag).expect("hex digits are a valid header value")
}

/// Whether the request's `If-None-Match` matches `etag` (weak comparison,
/// as RFC 9110 asks of `If-None-Match`; the coding suffix is ignored).
pub fn not_modified(request: &HeaderMap, etag: &HeaderValue) -> bool {
    let Some(ours) = opaque(etag.as_bytes()) else {
        return false;
    };
    request.get_all(IF_NONE_MATCH).iter().any(|value| {
        value.as_bytes().split(|b| *b == b',').any(|tag| {
            let tag = tag.trim_ascii();
            tag == b"*" || opaque(tag) == Some(ours)
        })
    })
}

/// Whether the request's `If-Match` holds for an answer tagged `etag`
/// (RFC 9110, 13.1.1): it holds when absent, when `*` (there is a current
/// answer), or when it lists `etag` by strong comparison, so a weak tag
/// (`W/`) never matches; as for `If-None-Match`, the coding suffix is
/// ignored. An answer without a tag matches no listed one.
pub fn if_match_holds(request: &HeaderMap, etag: Option<&HeaderValue>) -> bool {
    let mut fields = request.get_all(IF_MATCH).iter().peekable();
    if fields.peek().is_none() {
        return true;
    }
    let ours = etag.and_then(|etag| opaque(etag.as_bytes()));
    fields.any(|value| {
        value.as_bytes().split(|b| *b == b',').any(|tag| {
            let tag = tag.trim_ascii();
            tag == b"*" || (!tag.starts_with(b"W/") && ours.is_some() && opaque(tag) == ours)
        })
    })
}

/// An entity tag's opaque part, without `W/` and the suffix a coding adds
/// ([`etag_for`]); `None` for what is not an entity tag (no quotes).
fn opaque(tag: &[u8]) -> Option<&[u8]> {
    let tag = tag.strip_prefix(b"W/").unwrap_or(tag);
    let inner = tag.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let uncoded = Coding::ALL.into_iter().find_map(|coding| {
        inner
            .strip_suffix(coding.token().as_bytes())?
            .strip_suffix(b"-")
    });
    Some(uncoded.unwrap_or(inner))
}

/// `etag` for the representation in `coding`.
pub fn etag_for(etag: &HeaderValue, coding: Coding) -> HeaderValue {
    let bytes = etag.as_bytes();
    let inner = bytes
        .strip_prefix(b"\"")
        .and_then(|t| t.strip_suffix(b"\""))
        .unwrap_or(bytes);
    let mut tag = Vec::with_capacity(inner.len() + 8);
    tag.push(b'"');
    tag.extend_from_slice(inner);
    tag.push(b'-');
    tag.extend_from_slice(coding.token().as_bytes());
    tag.push(b'"');
    HeaderValue::from_bytes(&tag).unwrap_or_else(|_| etag.clone())
}

/// For an answer worth compressing: says it varies with `Accept-Encoding`,
/// and marks `headers` for the coding the `request` headers ask for
/// (`Content-Encoding`, the coding's `ETag`), which comes back for the body
/// to be encoded in.
fn mark_negotiated(request: &HeaderMap, headers: &mut HeaderMap) -> Option<Coding> {
    headers.append(VARY, HeaderValue::from_static("accept-encoding"));
    let coding = negotiate(request.get_all(ACCEPT_ENCODING).iter())?;
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    if let Some(tag) = headers.get(ETAG) {
        let tag = etag_for(tag, coding);
        headers.insert(ETAG, tag);
    }
    Some(coding)
}

/// Marks a `200` answer whose validator the request's `If-None-Match`
/// matched: [`represent`] sends it as `304 Not Modified`, with the headers
/// the `200` would have had (its coding's `ETag`, `Vary`).
#[derive(Clone, Copy)]
pub struct NotModified;

/// The answer as its caller takes it: CORS headers (`public`: any origin
/// may read it), a content coding when asked for and worth it, no body for
/// `HEAD` (its `Content-Length` stays what the `GET` would have), and a
/// `304` for one marked [`NotModified`].
pub fn represent<B>(
    cors: &CorsConfig,
    request: &Request<B>,
    public: bool,
    response: Response<Body>,
) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    cors::decorate(cors, public, request.headers(), &mut parts.headers);
    let head = *request.method() == Method::HEAD;
    let length = body.size_hint().exact().unwrap_or(0);
    let compressible = length >= MIN_COMPRESSED_BYTES as u64
        && !parts.headers.contains_key(CONTENT_ENCODING)
        && parts
            .headers
            .get(CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if parts.extensions.remove::<NotModified>().is_some() {
        if compressible {
            mark_negotiated(request.headers(), &mut parts.headers);
        }
        // No body, and nothing that would describe one.
        parts.status = StatusCode::NOT_MODIFIED;
        for describes_the_body in [CONTENT_TYPE, CONTENT_LENGTH, CONTENT_ENCODING] {
            parts.headers.remove(describes_the_body);
        }
        return Response::from_parts(parts, Full::default());
    }
    if !compressible && !head {
        return Response::from_parts(parts, body);
    }
    // A `Full` body is one ready frame: collecting it does not wait.
    let Some(Ok(collected)) = body.collect().now_or_never() else {
        return Response::from_parts(parts, Full::default());
    };
    let mut bytes = collected.to_bytes();
    if compressible {
        if let Some(coding) = mark_negotiated(request.headers(), &mut parts.headers) {
            bytes = coding.encode(&bytes);
        }
    }
    if head {
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        return Response::from_parts(parts, Full::default());
    }
    Response::from_parts(parts, Full::new(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn negotiated(values: &[&str]) -> Option<Coding> {
        let values: Vec<HeaderValue> = values
            .iter()
            .map(|v| HeaderValue::from_str(v).unwrap())
            .collect();
        negotiate(values.iter())
    }

    #[test]
    fn negotiation_picks_the_heavier_acceptable_coding_br_on_a_tie() {
        use Coding::*;
        let table: [(&[&str], Option<Coding>); 18] = [
            (&["identity"], None),
            (&["br"], Some(Brotli)),
            (&["gzip, deflate, br"], Some(Brotli)),
            (&["gzip", "br"], Some(Brotli)),
            (&["br;q=0.5, gzip"], Some(Gzip)),
            (&["br;q=0, gzip;q=0.1"], Some(Gzip)),
            (&["gzip;q=0"], None),
            (&["*"], Some(Brotli)),
            (&["*;q=0.5, br;q=0"], Some(Gzip)),
            (&["GZIP"], Some(Gzip)),
            (&["x-gzip"], Some(Gzip)),
            (&["br;q=2, gzip;q=nonsense"], None),
            (&["gzip;Q=0"], None),
            (&["gzip; Q=0, br;Q=0.5"], Some(Brotli)),
            // Identity weighed above every coding: as it is.
            (&["gzip;q=0.5", "Identity;q=0.8, br;q=0.7"], None),
            // Weighed the same, or below: compressed.
            (&["identity, gzip"], Some(Gzip)),
            (&["identity;q=0.1, *"], Some(Brotli)),
            (&["identity;q=0, gzip;q=0.2"], Some(Gzip)),
        ];
        for (accept, expected) in table {
            assert_eq!(negotiated(accept), expected, "{accept:?}");
        }
    }

    #[test]
    fn tags_match_by_hash_whatever_the_coding_or_weakness() {
        let tag = etag(&[b"shortvideo", b"{}"]);
        assert_ne!(tag, etag(&[b"shortvideo{", b"}"]), "parts are delimited");
        // The 128-bit xxh3 of the length-prefixed parts, in lower-case hex:
        // the tags earlier builds gave, so clients' stored tags still match.
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        for part in [&b"shortvideo"[..], b"{}"] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        assert_eq!(
            tag.to_str().unwrap(),
            format!("\"{:032x}\"", hasher.digest128())
        );
        let gzip = etag_for(&tag, Coding::Gzip);
        let hash = tag.to_str().unwrap().trim_matches('"').to_owned();
        assert_eq!(gzip.to_str().unwrap(), format!("\"{hash}-gzip\""));
        let request = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(IF_NONE_MATCH, HeaderValue::from_str(value).unwrap());
            h
        };
        for matching in [
            format!("\"{hash}-br\""),
            format!("W/\"{hash}-gzip\""),
            format!("\"other\", \"{hash}\""),
            "*".to_owned(),
        ] {
            assert!(not_modified(&request(&matching), &tag), "{matching}");
        }
        for other in [
            "\"\"".to_owned(),
            "\"".to_owned(),
            hash[..8].to_owned(),
            // Unquoted, or a suffix no coding adds.
            hash.clone(),
            format!("\"{hash}-garbage\""),
            format!("\"{hash}-\""),
            format!("\"{hash}-gzip-br\""),
        ] {
            assert!(!not_modified(&request(&other), &tag), "{other}");
        }
        assert!(!not_modified(&HeaderMap::new(), &tag));
    }

    #[test]
    fn if_match_holds_for_the_tag_by_strong_comparison_or_star() {
        let tag = etag(&[b"data"]);
        let hash = tag.to_str().unwrap().trim_matches('"').to_owned();
        let request = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for value in values {
                h.append(IF_MATCH, HeaderValue::from_str(value).unwrap());
            }
            h
        };
        assert!(if_match_holds(&HeaderMap::new(), None), "absent, no tag");
        let ours = format!("\"{hash}\"");
        let gzip = format!("\"{hash}-gzip\"");
        for holds in [&[gzip.as_str()][..], &["\"a\"", &ours]] {
            assert!(if_match_holds(&request(holds), Some(&tag)), "{holds:?}");
        }
        for fails in [&[hash.as_str()][..], &[""], &["\"\""]] {
            assert!(!if_match_holds(&request(fails), Some(&tag)), "{fails:?}");
        }
        // Without a tag, only `*` holds.
        assert!(if_match_holds(&request(&["*"]), None));
        assert!(!if_match_holds(&request(&[&ours]), None));
    }

    #[test]
    fn weights_parse_as_rfc_9110_writes_them() {
        for (q, expected) in [
            ("1", Some(1000)),
            ("1.000", Some(1000)),
            ("0.5", Some(500)),
            ("0.123", Some(123)),
            ("0", Some(0)),
            ("1.5", None),
            ("0.1234", None),
            ("2", None),
            ("x", None),
        ] {
            assert_eq!(parse_q(q), expected, "{q}");
        }
    }
}
