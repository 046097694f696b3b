//! The provider author's test kit (cargo feature `testing`): drives a
//! provider through the same boundary and the same checks the host applies,
//! against scripted upstream responses, and says what the host would make
//! of the outcome. [`conformance`] builds a suite of the host's rules on it.
//!
//! A provider's own tests call the Rust trait directly at their peril: the
//! host never does. It talks to the plugin through the `abi_stable`
//! boundary (calls and answers as JSON, decoded strictly), checks every
//! answer ([`AttemptHandle::step`]: the endpoint matches, lists are bounded,
//! IDs have their shape, cursors fit), cuts an attempt off after
//! [`MAX_STEPS`], and may run each step on another thread. The [`Kit`] does
//! all of that too, so a plugin that passes here does not fail in the host:
//!
//! ```
//! # use plugin_api::{attempt, Attempt, Call, Done, Endpoint, Manifest, Output, Provider,
//! #                  ProviderConfig, UpstreamRequest};
//! # struct Mine;
//! # impl Provider for Mine {
//! #     fn manifest() -> Manifest {
//! #         Manifest { name: "mine".into(), version: "1.0.0".into(), platform: "mine".into(),
//! #                    endpoints: vec![Endpoint::Posts] }
//! #     }
//! #     fn new(_: ProviderConfig) -> Result<Self, String> { Ok(Mine) }
//! #     fn begin(&self, _: Call) -> Box<dyn Attempt> {
//! #         attempt::single(UpstreamRequest::get(plugin_api::testing::BASE_URL, "/posts"), |r| {
//! #             r.json::<serde_json::Value>()?;
//! #             Ok(Done::last(Output::Posts(vec![])))
//! #         })
//! #     }
//! # }
//! use plugin_api::testing::{Kit, Reply, Upstream};
//!
//! let kit = Kit::new::<Mine>(serde_json::json!({})).unwrap();
//! let run = kit.run(&plugin_api::testing::sample(Endpoint::Posts), &Upstream::replies([Reply::ok("[]")]));
//! assert_eq!(run.urls(), ["http://upstream.test/api/posts"]);
//! assert_eq!(run.done().output, Output::Posts(vec![]));
//! ```
//!
//! Fixtures are plain files: [`Reply::file`] reads one (relative to the
//! crate's folder, where `cargo test` runs).

pub mod conformance;

use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use abi_stable::std_types::RStr;

use crate::ffi::secret::Redactor;
use crate::ffi::{caller_message, AttemptHandle, HostServices, Library, ProviderHandle};
use crate::{
    Call, Done, Endpoint, ErrorKind, Manifest, Next, Provider, ProviderConfig, ProviderError,
    UpstreamRequest, UpstreamResponse,
};

pub use crate::ffi::MAX_STEPS;

/// The upstream key the kit gives a provider: no error message or log line
/// may contain it.
pub const KEY: &str = "sk-kit-secret-7f3a9c1e";

/// The base URL the kit gives a provider.
pub const BASE_URL: &str = "http://upstream.test/api/";

/// One scripted upstream response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    /// HTTP 200 with `body`.
    pub fn ok(body: impl Into<Vec<u8>>) -> Reply {
        Reply::status(200, body)
    }

    /// `status` with `body`.
    pub fn status(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// HTTP 200 with a fixture file's bytes. A relative path is relative to
    /// the current folder, the crate's own under `cargo test`. Panics
    /// naming the file when it cannot be read: a test without its fixture
    /// proves nothing.
    pub fn file(path: impl AsRef<Path>) -> Reply {
        let path = path.as_ref();
        match std::fs::read(path) {
            Ok(body) => Reply::ok(body),
            Err(e) => panic!("fixture {} cannot be read: {e}", path.display()),
        }
    }

    /// The same reply with another status.
    pub fn with_status(mut self, status: u16) -> Reply {
        self.status = status;
        self
    }

    /// The same reply with one more header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

type Script = dyn Fn(&UpstreamRequest, usize) -> Option<Reply> + Send + Sync;

/// A scripted upstream: what it answers to the n-th request of a run.
/// Each run starts the script afresh; a request the script has no reply
/// for ends the run (see [`Run::unscripted`]).
#[derive(Clone)]
pub struct Upstream(Arc<Script>);

impl Upstream {
    /// The n-th request of a run gets the n-th reply.
    pub fn replies(replies: impl IntoIterator<Item = Reply>) -> Upstream {
        let replies: Vec<Reply> = replies.into_iter().collect();
        Upstream(Arc::new(move |_, n| replies.get(n).cloned()))
    }

    /// Every request gets the same reply.
    pub fn always(reply: Reply) -> Upstream {
        Upstream(Arc::new(move |_, _| Some(reply.clone())))
    }

    /// A request whose URL path (before `?`) ends with a route's path gets
    /// that route's reply; the first match wins.
    pub fn by_path<'a>(routes: impl IntoIterator<Item = (&'a str, Reply)>) -> Upstream {
        let routes: Vec<(String, Reply)> = routes
            .into_iter()
            .map(|(path, reply)| (path.to_owned(), reply))
            .collect();
        Upstream(Arc::new(move |request, _| {
            let path = request.url().split(['?', '#']).next().unwrap_or_default();
            routes
                .iter()
                .find(|(route, _)| path.ends_with(route.as_str()))
                .map(|(_, reply)| reply.clone())
        }))
    }

    /// Replies computed from each request.
    pub fn with(answer: impl Fn(&UpstreamRequest) -> Reply + Send + Sync + 'static) -> Upstream {
        Upstream(Arc::new(move |request, _| Some(answer(request))))
    }

    /// No reply at all: for calls that must not make a request.
    pub fn none() -> Upstream {
        Upstream(Arc::new(|_, _| None))
    }

    fn reply(&self, request: &UpstreamRequest, n: usize) -> Option<Reply> {
        (self.0)(request, n)
    }
}

/// How one call went, through the boundary.
#[derive(Debug)]
pub struct Run {
    /// The requests the provider made, in order (headers included: they
    /// may hold the key, so never print them).
    pub requests: Vec<UpstreamRequest>,
    /// The answer, or the error the host would see: the plugin's own, or
    /// one the boundary's checks raised.
    pub outcome: Result<Done, ProviderError>,
    /// How many times `step` was called.
    pub steps: usize,
    /// The attempt was still fetching at the host's [`MAX_STEPS`]th step.
    pub capped: bool,
    /// The longest one of the host's calls took (`begin` with the first
    /// `step`, or a later `step`); past [`STEP_BUDGET`](crate::ffi::STEP_BUDGET)
    /// the host quarantines the provider. Since 1.4.
    pub slowest_call: Duration,
    /// The script had no reply for the last request.
    pub unscripted: bool,
    /// Takes the provider's key out of what callers would read, as the
    /// host does.
    redactor: Redactor,
}

/// What the host does with a [`Run`]'s outcome (its failover decision,
/// without deadlines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSees {
    /// The caller gets the answer.
    Answer,
    /// The caller gets 404 `RESOURCE_NOT_FOUND`; no other provider is asked.
    NotFound,
    /// The caller gets 400 `INVALID_PARAMETER` with this message: the
    /// upstream key taken out as the host does ([`Redactor`]), cut to
    /// [`MAX_CALLER_MESSAGE`](crate::ffi::MAX_CALLER_MESSAGE) characters.
    InvalidInput(String),
    /// The next provider is asked; a failure counts against this
    /// provider's breaker or not.
    NextProvider {
        /// Whether it counts towards opening the breaker.
        counts_against_breaker: bool,
    },
}

impl Run {
    /// The answer; panics with the error.
    #[track_caller]
    pub fn done(self) -> Done {
        match self.outcome {
            Ok(done) => done,
            Err(e) => panic!("expected an answer, got {e}"),
        }
    }

    /// The error; panics with the answer.
    #[track_caller]
    pub fn error(self) -> ProviderError {
        match self.outcome {
            Ok(done) => panic!("expected an error, got {done:?}"),
            Err(e) => e,
        }
    }

    /// The error's kind, if it failed.
    pub fn kind(&self) -> Option<ErrorKind> {
        self.outcome.as_ref().err().map(ProviderError::kind)
    }

    /// The URLs requested, in order.
    pub fn urls(&self) -> Vec<&str> {
        self.requests.iter().map(UpstreamRequest::url).collect()
    }

    /// What the host makes of this outcome for a call to `endpoint`. The
    /// rules: "not found" is final only where there is a resource to find
    /// (not `search`); "invalid input" and "unsupported" count as such only
    /// before the first request (after it they are upstream failures);
    /// "undecided" never counts against the breaker.
    pub fn host_sees(&self, endpoint: Endpoint) -> HostSees {
        let Err(error) = &self.outcome else {
            return HostSees::Answer;
        };
        let before_a_request = self.requests.is_empty();
        match error.kind() {
            ErrorKind::NotFound if endpoint.names_a_resource() => HostSees::NotFound,
            ErrorKind::InvalidInput if before_a_request => {
                HostSees::InvalidInput(caller_message(&self.redactor.text(error.message())))
            }
            ErrorKind::Unsupported if before_a_request => HostSees::NextProvider {
                counts_against_breaker: false,
            },
            ErrorKind::Undecided => HostSees::NextProvider {
                counts_against_breaker: false,
            },
            _ => HostSees::NextProvider {
                counts_against_breaker: true,
            },
        }
    }
}

/// A provider set up behind the boundary, ready to be driven.
pub struct Kit {
    /// Tags the log lines its provider sends ([`Kit::logs`]).
    id: u64,
    library: Library,
    provider: ProviderHandle,
    api_key: String,
    /// Where the provider's requests may go: its `base_url`'s origin.
    origin: Option<Origin>,
}

impl Kit {
    /// The provider `P` of this crate, set up with `settings`, [`BASE_URL`]
    /// and [`KEY`]. The error is its set-up's reason.
    pub fn new<P: Provider>(settings: serde_json::Value) -> Result<Kit, String> {
        Kit::with_config::<P>(ProviderConfig {
            base_url: BASE_URL.into(),
            api_key: KEY.into(),
            settings,
        })
    }

    /// The provider `P` set up with `config`.
    pub fn with_config<P: Provider>(config: ProviderConfig) -> Result<Kit, String> {
        let library = Library::from_module(
            crate::ffi::root_module::<P>(),
            env!("CARGO_PKG_VERSION").into(),
        )
        .map_err(|e| e.to_string())?;
        Kit::set_up(library, config)
    }

    /// A built plugin library at `path`, loaded as the host loads it, and
    /// set up with `config`. Each path loads once per process.
    pub fn load(path: &Path, config: ProviderConfig) -> Result<Kit, String> {
        let library = Library::load(path).map_err(|e| e.to_string())?;
        Kit::set_up(library, config)
    }

    fn set_up(library: Library, config: ProviderConfig) -> Result<Kit, String> {
        static KITS: AtomicU64 = AtomicU64::new(1);
        let id = KITS.fetch_add(1, Ordering::Relaxed);
        let provider = logging_for(id, || {
            library.instantiate(&config, HostServices { log: record_log })
        })?;
        Ok(Kit {
            id,
            library,
            provider,
            api_key: config.api_key,
            origin: Origin::of(&config.base_url),
        })
    }

    /// The provider's manifest, as the host read it.
    pub fn manifest(&self) -> &Manifest {
        self.library.manifest()
    }

    /// The upstream key the provider was given.
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// Starts an attempt by hand, to step it as a test likes (out of order,
    /// say). [`run`](Self::run) is the host's way.
    pub fn begin(&self, call: &Call) -> AttemptHandle {
        logging_for(self.id, || self.provider.begin(call))
    }

    /// The log lines this kit's provider sent while the kit ran it (set
    /// up, [`run`](Self::run), [`begin`](Self::begin)), and those sent from
    /// threads no kit was running (a plugin's own): other kits' providers,
    /// logging on other threads at the same time, are not in them. (Steps
    /// taken by hand on an [`AttemptHandle`] log untagged.)
    pub fn logs(&self) -> Vec<String> {
        lock_sink()
            .iter()
            // Lines of no known kit too: a thread the plugin started itself
            // logs with no tag, and a key there must not go unseen.
            .filter(|(kit, _)| *kit == self.id || *kit == 0)
            .map(|(_, line)| line.clone())
            .collect()
    }

    /// Drives `call` to its end as the host does, answering each request
    /// from `upstream`: at most [`MAX_STEPS`] steps, each on a fresh thread
    /// (the host may move an attempt between threads between steps).
    pub fn run(&self, call: &Call, upstream: &Upstream) -> Run {
        // The host calls `begin` and the first `step` as one call, timed
        // as one: so does this.
        let mut started = Instant::now();
        let mut attempt = logging_for(self.id, || self.provider.begin(call));
        let mut run = Run {
            requests: Vec::new(),
            outcome: Err(ProviderError::bad_response("no step was taken")),
            steps: 0,
            capped: false,
            unscripted: false,
            slowest_call: Duration::ZERO,
            redactor: Redactor::of(&self.api_key),
        };
        let mut last: Option<Reply> = None;
        for _ in 0..MAX_STEPS {
            run.steps += 1;
            let reply = last.take();
            if run.steps > 1 {
                started = Instant::now();
            }
            let next = std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        let response = reply
                            .as_ref()
                            .map(|r| UpstreamResponse::new(r.status, &r.headers, &r.body));
                        logging_for(self.id, || attempt.step(response))
                    })
                    .join()
            })
            .unwrap_or_else(|_| {
                Err(ProviderError::new(
                    ErrorKind::Panicked,
                    "the boundary let a panic through",
                ))
            });
            run.slowest_call = run.slowest_call.max(started.elapsed());
            match next {
                Ok(Next::Done(done)) => {
                    run.outcome = Ok(done);
                    return run;
                }
                Err(error) => {
                    run.outcome = Err(error);
                    return run;
                }
                Ok(Next::Fetch(request)) => {
                    if let Some(refusal) = self.host_refusal(&request) {
                        run.requests.push(request);
                        run.outcome = Err(refusal);
                        return run;
                    }
                    let n = run.requests.len();
                    let reply = upstream.reply(&request, n);
                    let url = request.url().to_owned();
                    run.requests.push(request);
                    match reply {
                        Some(reply) => last = Some(reply),
                        None => {
                            run.unscripted = true;
                            // What the host would see of an upstream that
                            // never answers.
                            run.outcome = Err(ProviderError::new(
                                ErrorKind::Transient,
                                format!(
                                    "the test's upstream has no reply for request {} ({url})",
                                    n + 1
                                ),
                            ));
                            return run;
                        }
                    }
                }
            }
        }
        run.capped = true;
        run.outcome = Err(ProviderError::bad_response(format!(
            "no answer within {MAX_STEPS} steps"
        )));
        run
    }

    /// What the host would refuse of `request` before sending it, as it
    /// says so: a method but `GET`, a URL outside the provider's
    /// `base_url` origin, or a header a plugin may not set
    /// ([`header_refusal`](crate::upstream::header_refusal)).
    fn host_refusal(&self, request: &UpstreamRequest) -> Option<ProviderError> {
        if request.method() != "GET" {
            return Some(ProviderError::bad_response(
                "plugin asked for a request that is not a GET; refused",
            ));
        }
        let inside = self
            .origin
            .as_ref()
            .is_some_and(|origin| Origin::of(request.url()).as_ref() == Some(origin));
        if !inside {
            return Some(ProviderError::bad_response(
                "plugin asked for a URL outside its provider's base_url origin; refused",
            ));
        }
        request
            .headers()
            .iter()
            .find_map(|(name, value)| crate::upstream::header_refusal(name, value))
            .map(ProviderError::bad_response)
    }

    /// The conformance suite for this provider; see [`conformance`].
    pub fn conformance(&self) -> conformance::Suite<'_> {
        conformance::Suite::new(self)
    }
}

/// Where a URL leads, compared as the host compares a request's URL with
/// its provider's `base_url`: the scheme and the host in any case, the
/// port written or the scheme's default; a URL with a user or password is
/// none (the host refuses it).
#[derive(Debug, PartialEq, Eq)]
struct Origin {
    https: bool,
    host: String,
    port: u16,
}

impl Origin {
    fn of(url: &str) -> Option<Origin> {
        // What the host's URL parser refuses (a space, a control byte,
        // text beyond ASCII, written unencoded) leads nowhere.
        if !url.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        let (scheme, rest) = url.split_once("://")?;
        let https = if scheme.eq_ignore_ascii_case("https") {
            true
        } else if scheme.eq_ignore_ascii_case("http") {
            false
        } else {
            return None;
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return None;
        }
        // An IPv6 host is in brackets, and may hold colons itself.
        let host_end = match authority.strip_prefix('[') {
            Some(bracketed) => bracketed.find(']')? + 2,
            None => authority.find(':').unwrap_or(authority.len()),
        };
        let (host, port) = authority.split_at(host_end);
        let port = match port.strip_prefix(':') {
            None if port.is_empty() => {
                if https {
                    443
                } else {
                    80
                }
            }
            Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                digits.parse().ok()?
            }
            _ => return None,
        };
        (!host.is_empty()).then(|| Origin {
            https,
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// A typical call to `endpoint`: username `kit_user`, post
/// `7312345678901234567`, query `kit`, the endpoint's default count.
pub fn sample(endpoint: Endpoint) -> Call {
    let subject = match endpoint {
        Endpoint::Profile | Endpoint::Posts => ("username", "kit_user"),
        Endpoint::Post | Endpoint::Comments => ("id", "7312345678901234567"),
        Endpoint::Search => ("query", "kit"),
    };
    Call::from_params(endpoint, [subject]).expect("the sample parameters are valid")
}

/// Every log line a plugin sent through the kit's host, this process (all
/// kits'; [`Kit::logs`] has one kit's).
pub fn logs() -> Vec<String> {
    lock_sink().iter().map(|(_, line)| line.clone()).collect()
}

/// Each line with the kit whose provider sent it (0: none known).
fn lock_sink() -> std::sync::MutexGuard<'static, Vec<(u64, String)>> {
    static LINES: OnceLock<Mutex<Vec<(u64, String)>>> = OnceLock::new();
    LINES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The kit whose provider this thread is running, for its log lines:
    /// a plugin logs on the thread that called it.
    static LOGGING_KIT: Cell<u64> = const { Cell::new(0) };
}

/// Runs `work` (a call into kit `id`'s provider) with its log lines tagged.
fn logging_for<T>(id: u64, work: impl FnOnce() -> T) -> T {
    let before = LOGGING_KIT.replace(id);
    let result = work();
    LOGGING_KIT.set(before);
    result
}

extern "C" fn record_log(_level: u8, target: RStr<'_>, message: RStr<'_>) {
    let line = format!("{}: {}", target.as_str(), message.as_str());
    // A panic must not unwind into the plugin's frame.
    let _ = std::panic::catch_unwind(|| {
        let kit = LOGGING_KIT.get();
        lock_sink().push((kit, line))
    });
}

#[cfg(test)]
mod tests;
