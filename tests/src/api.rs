//! The service as a caller sees it: requests with or without `X-API-Key`,
//! and [`Answer`], a response read with its JSON, its headers and the order
//! of the keys in its objects (which `serde_json::Value` does not keep).

use std::fmt;
use std::time::Duration;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// A client for one running server.
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl Api {
    /// A client of the server at `base` (`http://127.0.0.1:PORT`) sending
    /// `key` as `X-API-Key`, if any.
    pub fn new(base: &str, key: Option<&str>) -> Api {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(15))
            // Below the server's keep-alive limit (`header_timeout_ms`, 10 s
            // by default), so a request after a long pause never goes out
            // on a connection the server is closing at that moment: an
            // HTTP/1.1 race no client can win, not a fault of the server.
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("can build an HTTP client");
        Api {
            client,
            base: base.trim_end_matches('/').to_owned(),
            key: key.map(str::to_owned),
        }
    }

    /// The key this client sends, if any.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The same server with another key (or none).
    pub fn with_key(&self, key: Option<&str>) -> Api {
        Api {
            client: self.client.clone(),
            base: self.base.clone(),
            key: key.map(str::to_owned),
        }
    }

    /// `GET path` (path and query, e.g. `/v1/shortvideo/profile?username=x`).
    pub async fn get(&self, path: &str) -> Answer {
        self.request("GET", path).await
    }

    /// Any method on `path`, with this client's key.
    pub async fn request(&self, method: &str, path: &str) -> Answer {
        self.request_with(method, path, &[]).await
    }

    /// Any method on `path`, with this client's key and `headers`.
    pub async fn request_with(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a valid method");
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(key) = &self.key {
            request = request.header("X-API-Key", key);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("request to {path} failed: {e}"));
        Answer::read(response).await
    }
}

/// One response of the service.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub text: String,
    /// The body as JSON, or `Null` when it is not JSON (or empty).
    pub json: Value,
}

impl fmt::Debug for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {} {:?} {}", self.status, self.headers, self.text)
    }
}

impl Answer {
    /// Reads a response whole: status, lower-cased headers, text, and the
    /// text as JSON (`Null` when it is not JSON).
    pub async fn read(response: reqwest::Response) -> Answer {
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let bytes = response.bytes().await.expect("can read the body");
        let text = String::from_utf8(bytes.to_vec()).expect("the body is UTF-8");
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            text,
            json,
        }
    }

    /// An answer as read off a connection: a status line, headers, a
    /// blank line and the body (for exchanges no client library would send).
    pub fn parse_raw(raw: &str) -> Answer {
        let (head, text) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {raw:?}"));
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Answer {
            status,
            headers,
            text: text.to_owned(),
            json: serde_json::from_str(text).unwrap_or(Value::Null),
        }
    }

    /// A header's value by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        header_value(&self.headers, name)
    }

    pub fn data(&self) -> &Value {
        &self.json["data"]
    }

    /// `error.code`, or `""` when absent.
    pub fn error_code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("")
    }

    /// `error.message`, or `""` when absent.
    pub fn error_message(&self) -> &str {
        self.json["error"]["message"].as_str().unwrap_or("")
    }

    /// `meta.next_cursor`: `Some` for a string, `None` for null; panics when
    /// the key is missing or of another type.
    pub fn next_cursor(&self) -> Option<String> {
        let meta = self.json["meta"].as_object().expect("an answer has meta");
        match meta.get("next_cursor") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Null) => None,
            other => panic!("meta.next_cursor must be a string or null, got {other:?} in {self:?}"),
        }
    }

    /// The keys of the object at the JSON pointer `pointer` (`""` for the
    /// top level, `/data/0` for the first item), in the order sent.
    pub fn keys_at(&self, pointer: &str) -> Vec<String> {
        let root: Node = serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("the body is not JSON ({e}): {self:?}"));
        let mut node = &root;
        for segment in pointer.split('/').skip(1) {
            node = match node {
                Node::Object(entries) => entries
                    .iter()
                    .find(|(k, _)| k == segment)
                    .map(|(_, v)| v)
                    .unwrap_or_else(|| panic!("no `{segment}` at {pointer} in {self:?}")),
                Node::Array(items) => {
                    let i: usize = segment.parse().expect("an array index");
                    items
                        .get(i)
                        .unwrap_or_else(|| panic!("no item {i} at {pointer} in {self:?}"))
                }
                Node::Scalar => panic!("{pointer} goes through a scalar in {self:?}"),
            };
        }
        match node {
            Node::Object(entries) => entries.iter().map(|(k, _)| k.clone()).collect(),
            _ => panic!("{pointer} is not an object in {self:?}"),
        }
    }

    /// Asserts a success envelope: HTTP 200, `success: true`, platform
    /// `shortvideo`, `meta.credits_used` 1, `meta.next_cursor` present
    /// exactly when `list`.
    pub fn assert_success(&self, list: bool) -> &Answer {
        assert_eq!(self.status, 200, "expected 200: {self:?}");
        assert_eq!(self.json["success"], Value::Bool(true), "{self:?}");
        assert_eq!(self.json["platform"], "shortvideo", "{self:?}");
        assert_eq!(self.json["meta"]["credits_used"], 1, "{self:?}");
        let mut top = self.keys_at("");
        top.sort();
        assert_eq!(top, ["data", "meta", "platform", "success"], "{self:?}");
        let has_cursor = self.json["meta"]
            .as_object()
            .is_some_and(|m| m.contains_key("next_cursor"));
        assert_eq!(
            has_cursor, list,
            "meta.next_cursor must be present exactly on list answers: {self:?}"
        );
        self
    }

    /// Asserts an error envelope with `status` and `code`, a non-empty
    /// message and `meta.credits_used` 0.
    pub fn assert_error(&self, status: u16, code: &str) -> &Answer {
        assert_eq!(
            (self.status, self.error_code()),
            (status, code),
            "expected {status} {code}: {self:?}"
        );
        assert_eq!(self.json["success"], Value::Bool(false), "{self:?}");
        assert!(
            !self.error_message().is_empty(),
            "an error needs a message: {self:?}"
        );
        assert_eq!(self.json["meta"]["credits_used"], 0, "{self:?}");
        self
    }

    /// Asserts a 400 `INVALID_PARAMETER` whose `error.param` is `param`
    /// and whose message names it in backticks.
    pub fn assert_invalid(&self, param: &str) -> &Answer {
        self.assert_error(400, "INVALID_PARAMETER");
        assert!(
            self.error_message().contains(&format!("`{param}`")),
            "the message must name `{param}`: {self:?}"
        );
        assert_eq!(
            self.json["error"]["param"], param,
            "error.param names the parameter: {self:?}"
        );
        self
    }

    /// Asserts neither the body nor any header contains `needle` exactly.
    pub fn assert_absent_exact(&self, needle: &str) -> &Answer {
        assert!(
            !self.text.contains(needle),
            "the body must not contain {needle:?}: {self:?}"
        );
        for (name, value) in &self.headers {
            assert!(
                !value.contains(needle),
                "header `{name}: {value}` must not contain {needle:?}"
            );
        }
        self
    }

    /// Asserts neither the body nor any header contains `needle`
    /// (case-insensitively).
    pub fn assert_absent(&self, needle: &str) -> &Answer {
        let needle_lc = needle.to_lowercase();
        assert!(
            !self.text.to_lowercase().contains(&needle_lc),
            "the body must not contain {needle:?}: {self:?}"
        );
        for (name, value) in &self.headers {
            assert!(
                !name.contains(&needle_lc) && !value.to_lowercase().contains(&needle_lc),
                "header `{name}: {value}` must not contain {needle:?}"
            );
        }
        self
    }
}

/// JSON with the order of object keys kept; only the shape matters.
enum Node {
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
    Scalar,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Node>()? {
            entries.push((key, value));
        }
        Ok(Node::Object(entries))
    }
}

/// The value of header `name` (any case) among `headers`, whose names are
/// in lower case.
pub fn header_value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    headers
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

/// Percent-encodes a query value (everything but `A-Za-z0-9-._~`).
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `path` (which already has a query) with `&cursor=TOKEN` appended.
pub fn with_cursor(path: &str, cursor: &str) -> String {
    format!("{path}&cursor={}", encode(cursor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Answer {
        Answer {
            status: 200,
            headers: vec![("x-a".into(), "B".into())],
            text: text.into(),
            json: serde_json::from_str(text).unwrap_or(Value::Null),
        }
    }

    #[test]
    fn keys_keep_their_order_at_any_depth() {
        let a = answer(r#"{"z":1,"a":{"y":[{"q":1,"b":2}],"c":null},"m":99999999999999999999}"#);
        assert_eq!(a.keys_at(""), ["z", "a", "m"]);
        assert_eq!(a.keys_at("/a"), ["y", "c"]);
        assert_eq!(a.keys_at("/a/y/0"), ["q", "b"]);
    }

    #[test]
    #[should_panic(expected = "must not contain")]
    fn absence_is_checked_in_headers_too() {
        answer("{}").assert_absent("b");
    }

    #[test]
    fn encode_leaves_only_unreserved_characters() {
        assert_eq!(encode("a+b/c=d é"), "a%2Bb%2Fc%3Dd%20%C3%A9");
    }
}
