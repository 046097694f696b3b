//! The operator's side of a running server: signals, the admin listener and
//! its Prometheus text, requests with headers of the test's choice (or over a
//! connection the test holds), log lines, and the usage ledger as
//! `socialgate keys usage` reports it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::api::Answer;
use crate::config::{standard_env, Config};
use crate::process::{run_cli, Server, ADMIN_LISTENING_PREFIX, PROCESS_TIMEOUT};

/// Sends `signal` (`TERM`, `HUP`, ...) to `server`'s process only.
pub fn signal(server: &Server, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(server.pid().to_string())
        .stdin(Stdio::null())
        .status()
        .expect("can run kill");
    assert!(status.success(), "kill -{signal} {} failed", server.pid());
}

/// Waits up to `timeout` for `server` to exit by itself.
pub fn wait_exit(server: &mut Server, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = server.exit_status() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the server has logged a line holding every one of
/// `needles`, for at most `within`; returns the first such line.
pub async fn log_line_within(server: &Server, needles: &[&str], within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let stderr = server.stderr();
        if let Some(line) = stderr
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
        {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {needles:?} within {within:?} in:\n{stderr}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The address of the `admin listening on http://ADDR` line, which `serve`
/// prints right after its `listening on` line.
pub fn admin_addr(server: &Server) -> SocketAddr {
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    loop {
        let line = server
            .extra_stdout()
            .into_iter()
            .find_map(|l| l.strip_prefix(ADMIN_LISTENING_PREFIX).map(str::to_owned));
        if let Some(addr) = line {
            let addr: SocketAddr = addr
                .parse()
                .unwrap_or_else(|_| panic!("the admin address does not parse: {addr:?}"));
            assert!(
                addr.ip().is_loopback() && addr.port() != 0,
                "serve must print the real bound admin address, printed {addr}"
            );
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "no `{ADMIN_LISTENING_PREFIX}` line; stdout after the first line: {:?}",
            server.extra_stdout()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("can build an HTTP client")
}

/// `method base+path` with `headers`, read as an [`Answer`].
pub async fn send(base: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a valid method");
    let mut request = client().request(method, format!("{base}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("request to {path} failed: {e}"));
    Answer::read(response).await
}

/// Sends one `GET path` with `headers` on a connection the caller opened,
/// with `Connection: close`, and reads the answer to the end.
pub async fn get_on(stream: &mut TcpStream, path: &str, headers: &[(&str, &str)]) -> Answer {
    start_get_on(stream, path).await;
    finish_get_on(stream, headers).await
}

/// Sends the first lines of a `GET path` head on a connection, so that the
/// server has seen part of a request (a connection that has seen nothing is
/// closed at once by a graceful shutdown; one mid-head is served).
pub async fn start_get_on(stream: &mut TcpStream, path: &str) {
    let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .expect("can send the request line");
}

/// Ends the head [`start_get_on`] began with `headers` and
/// `Connection: close`, and reads the answer to the end.
pub async fn finish_get_on(stream: &mut TcpStream, headers: &[(&str, &str)]) -> Answer {
    let mut rest = String::from("Connection: close\r\n");
    for (name, value) in headers {
        rest.push_str(&format!("{name}: {value}\r\n"));
    }
    rest.push_str("\r\n");
    stream
        .write_all(rest.as_bytes())
        .await
        .expect("can send the rest of the request");
    read_to_end(stream).await
}

/// Reads an answer sent with `Connection: close` to the end of the
/// connection, within 10 s.
pub async fn read_to_end(stream: &mut TcpStream) -> Answer {
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("the answer ends within 10 s")
        .expect("can read the answer");
    parse_http_answer(&raw)
}

/// Sends `GET path` on a connection kept alive and reads exactly its
/// answer (by its `Content-Length`), leaving the connection open.
pub async fn get_kept_alive(stream: &mut TcpStream, path: &str) -> Answer {
    let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .expect("can send the request");
    let read = async {
        let mut raw = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or_else(|| panic!("no content-length in {head:?}"));
                if raw.len() >= end + 4 + length {
                    return raw;
                }
            }
            let n = stream.read(&mut chunk).await.expect("can read the answer");
            assert!(n > 0, "the connection closed mid-answer");
            raw.extend_from_slice(&chunk[..n]);
        }
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the answer comes within 10 s");
    parse_http_answer(&raw)
}

/// Sends `GET path` with `headers` on a new connection to `addr`, then
/// hangs up (a TCP reset) after `after` without reading anything.
pub async fn hang_up_after(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    after: Duration,
) {
    let mut stream = TcpStream::connect(addr).await.expect("can connect");
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .expect("can send the request");
    tokio::time::sleep(after).await;
    stream.set_zero_linger().expect("can set SO_LINGER");
    drop(stream);
}

/// An HTTP/1.1 answer with a `Content-Length` body, as bytes received.
fn parse_http_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    assert!(text.contains("\r\n\r\n"), "not an HTTP answer: {text:?}");
    Answer::parse_raw(&text)
}

/// `GET http://admin/path` on the admin listener: status and body.
pub async fn admin_get(admin: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let answer = send(&format!("http://{admin}"), method, path, &[]).await;
    (answer.status, answer.text)
}

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A scraped `/metrics` page.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub text: String,
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses the Prometheus text format (comments skipped; label values
    /// unescaped).
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| parse_sample(l).unwrap_or_else(|| panic!("not a sample line: {l:?}")))
            .collect();
        Metrics {
            text: text.to_owned(),
            samples,
        }
    }

    /// Samples named `name` whose labels include all of `labels`.
    pub fn matching<'a>(&'a self, name: &'a str, labels: &'a [(&str, &str)]) -> Vec<&'a Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .collect()
    }

    /// The sum of the samples [`matching`](Metrics::matching); `None` when
    /// there is none.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found = self.matching(name, labels);
        (!found.is_empty()).then(|| found.iter().map(|s| s.value).sum())
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (name_and_labels, rest) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}')?;
            (&line[..=close], &line[close + 1..])
        }
        None => line.split_at(line.find(' ')?),
    };
    let value: f64 = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let (name, labels) = match name_and_labels.split_once('{') {
        None => (name_and_labels.trim().to_owned(), BTreeMap::new()),
        Some((name, body)) => (name.to_owned(), parse_labels(body.strip_suffix('}')?)?),
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

fn parse_labels(body: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(labels);
        }
        let name: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        chars.next()?; // '='
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(name.trim().to_owned(), value);
    }
}

/// Scrapes `GET /metrics` on the admin listener; panics unless it is 200.
pub async fn scrape(admin: SocketAddr) -> Metrics {
    let (status, text) = admin_get(admin, "GET", "/metrics").await;
    assert_eq!(status, 200, "GET /metrics on the admin listener: {text}");
    Metrics::parse(&text)
}

/// The UTC day of `t`, `YYYY-MM-DD`.
pub fn utc_day(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
    // Howard Hinnant's days-to-civil.
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// One row of `keys usage --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub key: String,
    pub day: String,
    pub requests: u64,
    pub credits: u64,
}

/// `socialgate keys usage --json [ARGS]` on `config`; panics unless it
/// succeeds with one JSON array of rows.
pub fn usage_json(config: &Config, args: &[&str]) -> Vec<UsageRow> {
    let mut all = vec!["keys", "usage", "--json"];
    all.extend_from_slice(args);
    let out = run_cli(config, &standard_env(), &all);
    assert!(
        out.success(),
        "`keys usage --json {args:?}` failed: {}\nstderr: {}",
        out.status,
        out.stderr
    );
    let rows: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "`keys usage --json` printed no JSON ({e}): {:?}",
            out.stdout
        )
    });
    rows.as_array()
        .unwrap_or_else(|| panic!("`keys usage --json` must print an array: {rows}"))
        .iter()
        .map(|r| UsageRow {
            key: r["key"].as_str().expect("a key name").to_owned(),
            day: r["day"].as_str().expect("a day").to_owned(),
            requests: r["requests"].as_u64().expect("requests"),
            credits: r["credits"].as_u64().expect("credits"),
        })
        .collect()
}

/// Credits per key name over all days of `rows`.
pub fn credits_per_key(rows: &[UsageRow]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for r in rows {
        *out.entry(r.key.clone()).or_default() += r.credits;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_lines_parse_with_labels_and_escapes() {
        let m = Metrics::parse(
            "# TYPE a counter\na_total{x=\"1\",y=\"q\\\"z\"} 3\nb 0.5\nc_bucket{le=\"+Inf\"} 7\n",
        );
        assert_eq!(m.sum("a_total", &[("y", "q\"z")]), Some(3.0));
        assert_eq!(m.sum("b", &[]), Some(0.5));
        assert_eq!(m.sum("c_bucket", &[("le", "+Inf")]), Some(7.0));
        assert_eq!(m.sum("a_total", &[("x", "2")]), None);
    }

    #[test]
    fn utc_days_are_civil_dates() {
        assert_eq!(utc_day(UNIX_EPOCH), "1970-01-01");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(utc_day(leap), "2000-02-29");
        let later = UNIX_EPOCH + Duration::from_secs(1_767_225_599); // 2025-12-31T23:59:59Z
        assert_eq!(utc_day(later), "2025-12-31");
    }

    #[test]
    fn raw_answers_parse() {
        let a = parse_http_answer(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nx-request-id: a1\r\n\r\n{\"status\":\"draining\"}",
        );
        assert_eq!(a.status, 503);
        assert_eq!(a.header("X-Request-Id"), Some("a1"));
        assert_eq!(a.json["status"], "draining");
    }
}
