//! Hot reload under load, and what it costs in memory.
//!
//! Clients keep requests flowing while the config is rewritten 20 times and
//! the fallback's plugin library is swapped 5 times (copies that differ by
//! appended bytes, so each is a distinct library): not one request may fail
//! and every answer must be well formed.
//!
//! The fallback alone serves every endpoint, so the swapped library is the
//! one answering every request. One configured library also keeps the run
//! short: each reload, even a config-only one, reads and hashes every
//! configured library.
//!
//! The same run measures the server's resident memory (`VmRSS`) across the
//! 20 config-only reloads and across the 5 swaps, with the clients paused at
//! each reading. Libraries are never unloaded, so a swap costs the new
//! library's mapping; a config-only reload must cost nothing measurable.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use socialgate_tests::config::{standard_env, FALLBACK, FALLBACK_KEY_ENV};
use socialgate_tests::reload::{
    await_watching, library_copy, log_lines, replace_file, wait_for_log, Memory, APPLIED, REJECTED,
};
use socialgate_tests::{issue_key, Answer, Api, Config, ConfigBuilder, FallbackMock, Server};
use socialgate_tests::{COMMENT_KEYS, POST_KEYS, PROFILE_KEYS};

/// Where the config keeps the fallback's library, relative to the config.
const LIBRARY: &str = "libs/libshortvideo_fallback.so";

const CONFIG_RELOADS: usize = 20;
const LIBRARY_SWAPS: usize = 5;
const CLIENTS: usize = 4;
/// How long traffic alone runs before the reloads, for comparison.
const TRAFFIC_ONLY: Duration = Duration::from_secs(2);
/// Each client stops after this many requests even if the run goes on.
const MAX_REQUESTS_PER_CLIENT: usize = 5000;
/// A client's pause between requests: steady traffic that leaves the two
/// cores of a test machine to the server's reloads.
const PACE: Duration = Duration::from_millis(10);

/// Growth allowed over all the config-only reloads together. A reload that
/// kept anything (a table, a provider instance, a library read) would cost
/// far more: each library read alone is about 7 MB.
const CONFIG_ONLY_BOUND_KIB: u64 = 2 * 1024;
/// Slack allowed per swap on top of the library file's size.
const SWAP_SLACK_KIB: u64 = 4 * 1024;

/// glibc's malloc, left to itself, raises its mmap threshold the first time
/// a large block is freed: from then on, blocks that size (each reload reads
/// every library whole, about 7 MB, to hash it) come from the arena of the
/// thread that runs the reload, and the arena keeps the memory for reuse.
/// That is a one-off of up to one library's size per arena, not growth per
/// reload, but it lands at random within a short run. Pinning the threshold
/// at glibc's own default keeps large blocks in their own mappings, so the
/// figures show what the server holds, not what the allocator caches.
const MALLOC_PINNED: (&str, &str) = ("MALLOC_MMAP_THRESHOLD_", "131072");

/// Requests the clients rotate through, and the keys of their `data`.
const REQUESTS: [(&str, &[&str], bool); 5] = [
    (
        "/v1/shortvideo/profile?username=lunabakes",
        &PROFILE_KEYS,
        false,
    ),
    ("/v1/shortvideo/posts?username=lunabakes", &POST_KEYS, true),
    (
        "/v1/shortvideo/post?id=7312345678901234567",
        &POST_KEYS,
        false,
    ),
    (
        "/v1/shortvideo/comments?id=7312345678901234567&count=3",
        &COMMENT_KEYS,
        true,
    ),
    ("/v1/shortvideo/search?query=luna", &PROFILE_KEYS, true),
];

/// What is wrong with an answer, if anything: HTTP 200, the success
/// envelope, and `data` (or each of its items) with exactly `keys`.
fn ill_formed(answer: &Answer, keys: &[&str], list: bool) -> Option<String> {
    let json = &answer.json;
    if answer.status != 200
        || json["success"] != Value::Bool(true)
        || json["platform"] != "shortvideo"
        || json["meta"]["credits_used"] != 1
    {
        return Some(format!("not a success envelope: {answer:?}"));
    }
    let mut top = answer.keys_at("");
    top.sort();
    if top != ["data", "meta", "platform", "success"] {
        return Some(format!("top-level keys {top:?}: {answer:?}"));
    }
    let pointers: Vec<String> = if list {
        match json["data"].as_array() {
            Some(items) if !items.is_empty() => {
                (0..items.len()).map(|i| format!("/data/{i}")).collect()
            }
            _ => return Some(format!("no items: {answer:?}")),
        }
    } else {
        vec!["/data".into()]
    };
    for pointer in pointers {
        let value = json.pointer(&pointer);
        if !value.is_some_and(Value::is_object) || answer.keys_at(&pointer) != keys {
            return Some(format!("{pointer} is not a well-formed item: {answer:?}"));
        }
    }
    None
}

/// The config: the fallback alone, its library from [`LIBRARY`]. Each
/// generation flips a harmless setting (the fallback's timeout) and the
/// per-endpoint order of `search`, so each rewrite is a change the server
/// must apply, and none sets the provider up anew.
fn config_text(fallback: &FallbackMock, generation: usize) -> String {
    let odd = generation % 2 == 1;
    let builder = ConfigBuilder::new()
        .platform("shortvideo", "live", &[FALLBACK])
        .provider(FALLBACK, LIBRARY, &fallback.base_url(), FALLBACK_KEY_ENV)
        .timeout_ms(FALLBACK, if odd { 2500 } else { 2000 });
    let builder = if odd {
        builder
    } else {
        builder.endpoint_order("shortvideo", "search", &[FALLBACK])
    };
    format!("# generation {generation}\n{}", builder.to_toml())
}

/// Shared by the clients and the main task.
#[derive(Default)]
struct Traffic {
    stop: AtomicBool,
    paused: AtomicBool,
    /// Requests in progress, so a pause can wait for them to end.
    in_flight: AtomicUsize,
    done: AtomicUsize,
    failures: Mutex<Vec<String>>,
}

async fn client(api: Api, traffic: Arc<Traffic>, offset: usize) {
    for i in 0..MAX_REQUESTS_PER_CLIENT {
        while traffic.paused.load(Ordering::SeqCst) && !traffic.stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if traffic.stop.load(Ordering::SeqCst) {
            return;
        }
        let (path, keys, list) = REQUESTS[(i + offset) % REQUESTS.len()];
        traffic.in_flight.fetch_add(1, Ordering::SeqCst);
        let answer = api.get(path).await;
        traffic.in_flight.fetch_sub(1, Ordering::SeqCst);
        traffic.done.fetch_add(1, Ordering::SeqCst);
        if let Some(why) = ill_formed(&answer, keys, list) {
            traffic
                .failures
                .lock()
                .unwrap()
                .push(format!("{path}: {why}"));
        }
        tokio::time::sleep(PACE).await;
    }
}

/// The server's memory with the clients paused and their requests done.
async fn quiet_memory(server: &Server, traffic: &Traffic) -> Memory {
    traffic.paused.store(true, Ordering::SeqCst);
    while traffic.in_flight.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let memory = Memory::of(server.pid());
    traffic.paused.store(false, Ordering::SeqCst);
    memory
}

fn kib(n: u64) -> String {
    format!("{n} KiB ({:.1} MiB)", n as f64 / 1024.0)
}

/// Prints what changed from `before` to `after`, in total and per `n`
/// events, and returns the growth of `VmRSS` in KiB.
fn report(what: &str, n: usize, before: Memory, after: Memory) -> i64 {
    let d = |a: u64, b: u64| b as i64 - a as i64;
    let rss = d(before.rss, after.rss);
    eprintln!(
        "{what}: VmRSS {rss:+} KiB ({:+.1} KiB each; anon {:+}, file {:+}), VmSize {:+} KiB",
        rss as f64 / n as f64,
        d(before.anon, after.anon),
        d(before.file, after.file),
        d(before.size, after.size),
    );
    rss
}

/// Makes one change and waits until the server has applied it as reload
/// number `expected`; returns how long that took.
async fn apply(server: &Server, expected: usize, change: impl FnOnce()) -> Duration {
    let start = Instant::now();
    change();
    wait_for_log(server, APPLIED, expected).await;
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_keep_flowing_through_config_rewrites_and_library_swaps() {
    let fallback = FallbackMock::start().await;
    fallback.serve_fixtures().await;
    let config = Config::from_toml(&config_text(&fallback, 0));
    let library = config.dir().join(LIBRARY);
    library_copy("shortvideo_fallback", &library, b"");
    let key = issue_key(&config, "load");
    let mut env = standard_env();
    env.push((MALLOC_PINNED.0.into(), MALLOC_PINNED.1.into()));
    let server = Server::start_with(&config, &env, &[]);
    let mut applied = await_watching(&server, &config).await;

    let traffic = Arc::new(Traffic::default());
    let api = Api::new(&server.base_url(), Some(&key));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(api.clone(), traffic.clone(), i)))
        .collect();

    let mut generation = 0;
    let mut next_config = || {
        generation += 1;
        config_text(&fallback, generation)
    };
    // Warm up: every endpoint and both configs have served, so the
    // allocator has grown to its working size.
    for _ in 0..2 {
        applied += 1;
        apply(&server, applied, || {
            replace_file(config.path(), next_config())
        })
        .await;
    }
    let warm = quiet_memory(&server, &traffic).await;
    // Traffic alone, for comparison.
    tokio::time::sleep(TRAFFIC_ONLY).await;
    let start = quiet_memory(&server, &traffic).await;

    let mut config_times = Vec::new();
    for _ in 0..CONFIG_RELOADS {
        applied += 1;
        config_times.push(
            apply(&server, applied, || {
                replace_file(config.path(), next_config())
            })
            .await,
        );
    }
    let after_config = quiet_memory(&server, &traffic).await;

    let mut swap_times = Vec::new();
    for swap in 1..=LIBRARY_SWAPS {
        applied += 1;
        let extra = format!("\0swap-{swap}");
        swap_times.push(
            apply(&server, applied, || {
                library_copy("shortvideo_fallback", &library, extra.as_bytes())
            })
            .await,
        );
    }
    let after_swaps = quiet_memory(&server, &traffic).await;

    // A few more requests on the last library, then stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    traffic.stop.store(true, Ordering::SeqCst);
    for handle in clients {
        handle.await.expect("a client task panicked");
    }

    let requests = traffic.done.load(Ordering::SeqCst);
    let failures = traffic.failures.lock().unwrap().clone();
    eprintln!(
        "{requests} requests, {} failed; {} reloads applied",
        failures.len(),
        log_lines(&server, APPLIED).len()
    );
    let mean = |times: &[Duration]| times.iter().sum::<Duration>() / times.len() as u32;
    eprintln!(
        "change to applied: config {:?} mean (max {:?}), swap {:?} mean (max {:?})",
        mean(&config_times),
        config_times.iter().max().unwrap(),
        mean(&swap_times),
        swap_times.iter().max().unwrap()
    );
    assert!(
        failures.is_empty(),
        "{} of {requests} answers failed or were ill formed; the first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(requests >= 200, "too few requests to mean much: {requests}");
    assert!(
        log_lines(&server, REJECTED).is_empty(),
        "{}",
        server.stderr()
    );
    let applied_seen = log_lines(&server, APPLIED).len();
    assert!(
        applied_seen >= CONFIG_RELOADS + LIBRARY_SWAPS,
        "{applied_seen} reloads applied"
    );
    let swapped = log_lines(&server, "libraries changed").len();
    assert!(swapped >= LIBRARY_SWAPS, "{swapped} swaps seen in the log");

    // Memory.
    let library_kib = std::fs::metadata(&library).unwrap().len() / 1024;
    eprintln!(
        "memory after warm-up: {warm:?} KiB; library file {}",
        kib(library_kib)
    );
    report(
        &format!("traffic alone for {TRAFFIC_ONLY:?}"),
        1,
        warm,
        start,
    );
    let config_rss = report(
        &format!("{CONFIG_RELOADS} config-only reloads"),
        CONFIG_RELOADS,
        start,
        after_config,
    );
    let swap_rss = report(
        &format!("{LIBRARY_SWAPS} library swaps"),
        LIBRARY_SWAPS,
        after_config,
        after_swaps,
    );
    assert!(
        config_rss < CONFIG_ONLY_BOUND_KIB as i64,
        "{CONFIG_RELOADS} config-only reloads grew VmRSS by {config_rss} KiB (bound {})",
        kib(CONFIG_ONLY_BOUND_KIB)
    );
    let per_swap_bound = library_kib + SWAP_SLACK_KIB;
    assert!(
        swap_rss < (per_swap_bound * LIBRARY_SWAPS as u64) as i64,
        "{LIBRARY_SWAPS} swaps grew VmRSS by {swap_rss} KiB (bound {} per swap)",
        kib(per_swap_bound)
    );
}
