//! Metrics: every series the service exports, named and recorded here only,
//! in Prometheus text format on the admin listener (never the public one:
//! they name providers).
//!
//! Labels never carry an API key, a username or any other caller input:
//! platform and endpoint labels are the configured or known names, and
//! anything else is `unknown`, so a caller cannot grow the series.
//!
//! A leaf: callers pass what it records as plain values, so any module
//! may record without this one knowing theirs.

use std::collections::BTreeMap;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use plugin_api::Endpoint;

const REQUESTS: &str = "socialgate_requests_total";
const REQUEST_SECONDS: &str = "socialgate_request_duration_seconds";
const ATTEMPTS: &str = "socialgate_upstream_attempts_total";
const ATTEMPT_SECONDS: &str = "socialgate_upstream_attempt_duration_seconds";
const FAILOVERS: &str = "socialgate_failovers_total";
const BREAKER_OPEN: &str = "socialgate_breaker_open";
const QUARANTINED: &str = "socialgate_provider_quarantined";
const RELOADS: &str = "socialgate_reloads_total";
const CREDITS: &str = "socialgate_credits_total";
const CACHE_REQUESTS: &str = "socialgate_cache_requests_total";
const CACHE_BYTES: &str = "socialgate_cache_bytes";
const ABANDONED: &str = "socialgate_requests_abandoned_total";
const KEY_BUSY: &str = "socialgate_requests_key_busy_total";
const STATE_ERRORS: &str = "socialgate_state_errors_total";
const KEYS_FILE_USABLE: &str = "socialgate_keys_file_usable";
const LOG_LINES_DROPPED: &str = "socialgate_log_lines_dropped_total";

/// Latency buckets, in seconds: from a cached-fast answer to a timeout.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, thiserror::Error)]
#[error("cannot install the metrics recorder: {0}")]
pub struct MetricsError(String);

/// How long a gauge not set again stays on the page. Every gauge is set
/// as the page is rendered ([`render`]), so only those of what is gone (a
/// provider a reload removed) age: they leave at the next scrape instead
/// of showing their last value for ever.
const GAUGE_IDLE: Duration = Duration::from_secs(1);

/// How often the histograms' recorded samples are folded into their
/// buckets when nothing scrapes `/metrics` ([`keep_up`]).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the process-wide recorder; call once, and run [`keep_up`]
/// with the handle.
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    PrometheusBuilder::new()
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE))
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .and_then(|b| b.install_recorder())
        .map_err(|e| MetricsError(e.to_string()))
}

/// Folds the histograms' recorded samples into their buckets every
/// [`UPKEEP_EVERY`], for as long as the runtime runs it.
///
/// Why: the recorder keeps every histogram sample (two a request) until
/// an upkeep folds it in. Rendering `/metrics` runs one, but a server
/// nobody scrapes (the admin listener off, or no Prometheus yet) kept
/// them all, growing with every request for ever.
pub async fn keep_up(handle: PrometheusHandle) {
    let mut ticks = tokio::time::interval(UPKEEP_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        handle.run_upkeep();
    }
}

/// A provider's gauges, as read when the page is rendered.
pub struct ProviderGauges<'a> {
    pub name: &'a str,
    pub breaker_open: bool,
    pub quarantined: bool,
}

/// The page `/metrics` serves: recorded series plus gauges read now
/// (`keys_usable`: the keys answering are the keys file's).
pub fn render<'a>(
    handle: &PrometheusHandle,
    cache_bytes: u64,
    keys_usable: bool,
    providers: impl IntoIterator<Item = ProviderGauges<'a>>,
) -> String {
    gauge!(CACHE_BYTES).set(cache_bytes as f64);
    counter!(LOG_LINES_DROPPED).absolute(crate::logging::dropped_lines());
    gauge!(KEYS_FILE_USABLE).set(if keys_usable { 1.0 } else { 0.0 });
    for provider in providers {
        gauge!(BREAKER_OPEN, "provider" => provider.name.to_owned())
            .set(if provider.breaker_open { 1.0 } else { 0.0 });
        gauge!(QUARANTINED, "provider" => provider.name.to_owned()).set(if provider.quarantined {
            1.0
        } else {
            0.0
        });
    }
    handle.run_upkeep();
    handle.render()
}

/// Labels for a request: configured platform and known endpoint, or `unknown`.
pub struct RouteLabels<'a> {
    pub platform: &'a str,
    pub endpoint: &'static str,
}

impl<'a> RouteLabels<'a> {
    /// A key's own account (`GET /v1/account`): of no platform, and
    /// counted apart from paths that are no route at all.
    pub const ACCOUNT: RouteLabels<'static> = RouteLabels {
        platform: "-",
        endpoint: "account",
    };

    /// The labels of `path`, its platform one of the configured `platforms`.
    pub fn of<V>(platforms: &BTreeMap<String, V>, path: &'a str) -> RouteLabels<'a> {
        let mut segments = path.strip_prefix("/v1/").unwrap_or("").splitn(2, '/');
        let platform = segments
            .next()
            .filter(|p| platforms.contains_key(*p))
            .unwrap_or("unknown");
        let endpoint = segments
            .next()
            .and_then(Endpoint::from_segment)
            .map(Endpoint::as_str)
            .unwrap_or("unknown");
        RouteLabels { platform, endpoint }
    }
}

/// One answered request: its count by status and its duration.
pub fn request(labels: &RouteLabels<'_>, status: u16, elapsed: Duration) {
    counter!(REQUESTS, "platform" => labels.platform.to_owned(), "endpoint" => labels.endpoint, "status" => status.to_string())
        .increment(1);
    histogram!(REQUEST_SECONDS, "platform" => labels.platform.to_owned(), "endpoint" => labels.endpoint)
        .record(elapsed.as_secs_f64());
}

/// One provider attempt: its count by outcome and its duration.
pub fn attempt(provider: &str, outcome: &'static str, elapsed: Duration) {
    counter!(ATTEMPTS, "provider" => provider.to_owned(), "outcome" => outcome).increment(1);
    histogram!(ATTEMPT_SECONDS, "provider" => provider.to_owned()).record(elapsed.as_secs_f64());
}

pub fn failover(labels: &RouteLabels<'_>, from_provider: &str) {
    counter!(
        FAILOVERS,
        "platform" => labels.platform.to_owned(),
        "endpoint" => labels.endpoint,
        "from_provider" => from_provider.to_owned()
    )
    .increment(1);
}

pub fn reload(ok: bool) {
    counter!(RELOADS, "result" => if ok { "ok" } else { "error" }).increment(1);
}

pub fn credits(n: u64) {
    counter!(CREDITS).increment(n);
}

/// What the cache did for a data request: `hit`, `miss`, `collapsed`
/// (waited on another's fetch), `stale` (an expired answer stood in for a
/// failure), `bypass` (off for the endpoint) or `not_stored`
/// (`only-if-cached`, and nothing fresh was stored).
pub fn cache(endpoint: Endpoint, result: &'static str) {
    counter!(CACHE_REQUESTS, "endpoint" => endpoint.as_str(), "result" => result).increment(1);
}

/// A caller hung up while upstream work it started was running.
pub fn abandoned() {
    counter!(ABANDONED).increment(1);
}

/// A request refused because its key had `max_concurrent_requests_per_key`
/// requests in flight (its `429` shares `RATE_LIMITED` with the rate limit's).
pub fn key_busy() {
    counter!(KEY_BUSY).increment(1);
}

/// A shared-state (Redis) operation that failed; `op` is one of a fixed
/// set of names (`rate_limit`, `reserve`, `settle`, `keys`, `cache_get`,
/// `cache_put`).
pub fn state_error(op: &'static str) {
    counter!(STATE_ERRORS, "op" => op).increment(1);
}
