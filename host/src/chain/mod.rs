//! The failover chain: asking providers in order until one answers.
//!
//! Any failure moves on to the next provider, except two answers that are
//! the same whoever gives them: "not found" (the user or post does not
//! exist; a search has nothing to be missing) and invalid input. A provider
//! whose breaker is open is skipped without an upstream call; when every
//! provider of the chain is open, the one whose cooldown ends first is
//! probed anyway, so the chain never refuses outright. Every attempt is
//! bounded by its provider's timeout and by the request's deadline; when
//! the deadline passes the chain stops.
//!
//! A provider with `max_in_flight` attempts running is busy: it is passed
//! over like an open one, without counting as a failure.
//!
//! Each attempt runs on the request's own task, its plugin calls inline
//! (see [`crate::resilience::runaway`] for what keeps a runaway plugin from
//! holding request threads). If the caller hangs up meanwhile, the attempt
//! goes on as a task of its own and still records its outcome on the
//! breaker: a breaker that never hears how a probe ended cannot protect
//! anyone. It also keeps what the request holds (`held`: its overload slot
//! and credits; see [`crate::resilience::abandon`]) and its provider's
//! in-flight slot until it ends; the chain asks nobody after it.

pub mod decision;

use std::sync::Arc;
use std::time::Duration;

use plugin_api::ffi::{Advance, Answer, AttemptHandle};
use plugin_api::{Call, Endpoint, ErrorKind, ProviderError};
use tokio::time::{timeout, Instant};

use self::decision::{Failure, Then};
use crate::redact::{self, Redacted};
use crate::resilience::abandon::Detached;
use crate::resilience::breaker::{Outcome, Permit};
use crate::resilience::concurrency::InFlight;
use crate::resilience::deadline::Deadline;
use crate::resilience::runaway::NotRun;
use crate::routing::{DescribedEndpoint, Provider};
use crate::upstream::{Fetched, UpstreamClient};

/// Steps allowed in one attempt; plugin-api states it, so the test kit
/// holds plugins to the same cap.
pub use plugin_api::ffi::MAX_STEPS;

/// An answer and who gave it (for the log and the cursor, never the caller).
pub struct Served {
    pub answer: Answer,
    pub provider: Arc<Provider>,
}

/// What the chain did, in order: for the request's log line and metrics.
#[derive(Debug, Default, Clone)]
pub struct Journal {
    pub attempts: Vec<AttemptRecord>,
}

#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub provider: Arc<str>,
    /// `ok`, or the [`ErrorKind`] name of the failure.
    pub outcome: &'static str,
    pub elapsed: Duration,
}

impl Journal {
    /// Providers that failed and were followed by another attempt.
    pub fn failovers(&self) -> impl Iterator<Item = &str> {
        let n = self.attempts.len();
        self.attempts[..n.saturating_sub(1)]
            .iter()
            .map(|a| &*a.provider)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainError {
    /// A provider said the user or post does not exist.
    NotFound,
    /// A provider refused the input; the message is for the caller.
    InvalidInput(String),
    /// Every provider tried failed within the deadline.
    Exhausted,
    /// No provider may be asked now (their breakers are open); one may be
    /// in `retry_after`.
    Unavailable { retry_after: Duration },
    /// No provider was asked: those that could be had `max_in_flight`
    /// attempts running.
    Busy,
    /// The request's deadline passed.
    DeadlineExceeded,
}

/// How one attempt ended, for the chain.
enum Verdict {
    Answered(Answer),
    /// Try the next provider.
    Failed,
    /// The chain ends with this.
    Stop(ChainError),
}

/// What every attempt of one request's chain is for: the call, the client
/// its upstream requests go through, and the request's deadline.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    pub call: &'a Arc<Call>,
    /// What the answer must be, as the platform's description says.
    pub described: &'a DescribedEndpoint,
    pub client: &'a UpstreamClient,
    pub deadline: Deadline,
}

/// Asks `providers` in order for `job`, noting each attempt in `journal`.
/// `held` is what the request holds while upstream work runs for it: an
/// attempt its caller abandons keeps it to its end. It is handed back with
/// the outcome.
pub async fn serve<H: Send + 'static>(
    providers: &[Arc<Provider>],
    job: Job<'_>,
    journal: &mut Journal,
    held: H,
) -> (Result<Served, ChainError>, H) {
    let mut held = held;
    let mut open = Vec::new();
    let mut busy = false;
    for provider in providers {
        match admit(provider) {
            Ok(admitted) => {
                let (verdict, back) = attempt_through(admitted, job, journal, held).await;
                held = back;
                if let Some(end) = verdict.end_of_chain(provider) {
                    return (end, held);
                }
            }
            Err(Skipped::Busy) => {
                tracing::debug!(provider = %provider.name, "skipped: busy");
                busy = true;
            }
            Err(Skipped::Open(until)) => {
                tracing::debug!(provider = %provider.name, "skipped: breaker open");
                open.push((provider, until));
            }
        }
    }
    if journal.attempts.is_empty() {
        // Every provider is open (or busy): probe the open one whose
        // cooldown ends first, unless it is busy or its breaker says no (a
        // probe already out, one forced less than a second ago, or a 429's
        // Retry-After still running).
        open.sort_by_key(|(_, until)| *until);
        let now = Instant::now();
        let forced = open.iter().find_map(|(provider, _)| {
            let slot = provider.in_flight.try_enter()?;
            let permit = provider.breaker.force_acquire(now)?;
            Some(Admitted {
                provider,
                permit,
                slot,
            })
        });
        let Some(admitted) = forced else {
            if busy {
                return (Err(ChainError::Busy), held);
            }
            // Nobody may be asked: say when someone may.
            let retry_after = wait_for_any(open.iter().map(|(provider, _)| *provider), now);
            return (Err(ChainError::Unavailable { retry_after }), held);
        };
        let provider = admitted.provider;
        let (verdict, back) = attempt_through(admitted, job, journal, held).await;
        held = back;
        if let Some(end) = verdict.end_of_chain(provider) {
            return (end, held);
        }
    }
    if job.deadline.expired() {
        return (Err(ChainError::DeadlineExceeded), held);
    }
    // Every provider failed, and their failures (a rate limit, say) left
    // none to ask now: say when one may be, as the requests after this
    // one are told.
    match wait_for_any(providers, Instant::now()) {
        Duration::ZERO => (Err(ChainError::Exhausted), held),
        retry_after => (Err(ChainError::Unavailable { retry_after }), held),
    }
}

/// A provider that may be asked now: its breaker's permit and one of its
/// in-flight slots, both held for the attempt.
struct Admitted<'p> {
    provider: &'p Arc<Provider>,
    permit: Permit,
    slot: InFlight,
}

/// Why a provider is passed over.
enum Skipped {
    /// `max_in_flight` attempts of its are running (no failure of its).
    Busy,
    /// Its breaker is open until then.
    Open(Instant),
}

fn admit(provider: &Arc<Provider>) -> Result<Admitted<'_>, Skipped> {
    let slot = provider.in_flight.try_enter().ok_or(Skipped::Busy)?;
    let permit = provider
        .breaker
        .try_acquire(Instant::now())
        .map_err(Skipped::Open)?;
    Ok(Admitted {
        provider,
        permit,
        slot,
    })
}

/// How long until one of `providers` may be asked again (zero: one may be
/// now, or there is none).
fn wait_for_any<'a>(
    providers: impl IntoIterator<Item = &'a Arc<Provider>>,
    now: Instant,
) -> Duration {
    providers
        .into_iter()
        .map(|provider| provider.breaker.next_chance(now))
        .min()
        .map_or(Duration::ZERO, |soonest| {
            soonest.saturating_duration_since(now)
        })
}

impl Verdict {
    /// What the chain answers after this attempt of `provider`'s, or `None`
    /// when it asks the next provider.
    fn end_of_chain(self, provider: &Arc<Provider>) -> Option<Result<Served, ChainError>> {
        match self {
            Verdict::Answered(answer) => Some(Ok(Served {
                answer,
                provider: provider.clone(),
            })),
            Verdict::Stop(stop) => Some(Err(stop)),
            Verdict::Failed => None,
        }
    }
}

/// One attempt of an admitted provider. It runs on the request's own
/// task; if the request is dropped (its caller hung up), the attempt goes
/// on as a task of its own, so its outcome is still recorded on the
/// breaker, and the slot and `held` are released only when it ends.
async fn attempt_through<H: Send + 'static>(
    admitted: Admitted<'_>,
    job: Job<'_>,
    journal: &mut Journal,
    held: H,
) -> (Verdict, H) {
    let Admitted {
        provider,
        permit,
        slot,
    } = admitted;
    let deadline = job.deadline;
    let attempt = {
        let (provider, call, described, client) = (
            provider.clone(),
            job.call.clone(),
            job.described.clone(),
            job.client.clone(),
        );
        async move {
            let started = Instant::now();
            let outcome = attempt(&provider, &call, &described, &client, deadline).await;
            let elapsed = started.elapsed();
            drop(slot);
            let (verdict, outcome) = judge(&provider, permit, &call, outcome, deadline);
            (verdict, outcome, elapsed, held)
        }
    };
    let (verdict, outcome, elapsed, held) = Detached::new(attempt).await;
    journal.attempts.push(AttemptRecord {
        provider: provider.name.clone(),
        outcome,
        elapsed,
    });
    (verdict, held)
}

/// Records an attempt's outcome on `provider`'s breaker, and logs the
/// breaker opening or closing.
fn record(provider: &Provider, permit: Permit, outcome: Outcome, now: Instant) {
    if let Some(turn) = provider.breaker.record(permit, outcome, now) {
        turn.log(&provider.name);
    }
}

/// Records an attempt's outcome on the breaker and applies the verdict of
/// [`decision::decide`].
fn judge(
    provider: &Provider,
    permit: Permit,
    call: &Call,
    outcome: Result<Answer, AttemptError>,
    deadline: Deadline,
) -> (Verdict, &'static str) {
    let now = Instant::now();
    let AttemptError {
        error,
        after_a_request,
    } = match outcome {
        Ok(answer) => {
            record(provider, permit, Outcome::Success, now);
            return (Verdict::Answered(answer), "ok");
        }
        Err(failed) => failed,
    };
    // "Not found" and refused input are normal answers to a caller, not
    // an operator's problem: WARN is kept for what an operator acts on.
    let level = match (error.kind(), call.endpoint()) {
        (ErrorKind::NotFound, Endpoint::Search) => tracing::Level::DEBUG,
        (ErrorKind::NotFound | ErrorKind::InvalidInput, _) => tracing::Level::INFO,
        _ => tracing::Level::WARN,
    };
    macro_rules! attempt_failed {
        ($level:expr) => {
            tracing::event!(
                $level,
                provider = %provider.name,
                endpoint = %call.endpoint(),
                kind = %error.kind(),
                "attempt failed: {}",
                Redacted(error.message())
            )
        };
    }
    match level {
        tracing::Level::DEBUG => attempt_failed!(tracing::Level::DEBUG),
        tracing::Level::INFO => attempt_failed!(tracing::Level::INFO),
        _ => attempt_failed!(tracing::Level::WARN),
    }
    let failure = Failure {
        kind: error.kind(),
        retry_after: error.retry_after_hint(),
        after_a_request,
    };
    let decision = decision::decide(failure, call.endpoint(), deadline.expired());
    record(provider, permit, decision.breaker, now);
    let verdict = match decision.then {
        Then::TryNext => Verdict::Failed,
        Then::StopNotFound => Verdict::Stop(ChainError::NotFound),
        Then::StopInvalidInput => Verdict::Stop(ChainError::InvalidInput(
            plugin_api::ffi::caller_message(&redact::text(error.message())),
        )),
        Then::StopDeadline => Verdict::Stop(ChainError::DeadlineExceeded),
    };
    (verdict, failure.kind.as_str())
}

/// `answer` once its data passed the description's check (plugin-api's own
/// checks passed before); one that does not is a bad response, as
/// plugin-api's refusals are.
fn described_answer(
    answer: Answer,
    described: &DescribedEndpoint,
    call: &Call,
) -> Result<Answer, ProviderError> {
    let refused = |reason: String| ProviderError::bad_response(reason);
    let data: serde_json::Value = serde_json::from_str(&answer.data)
        .map_err(|e| refused(format!("plugin answer is not JSON: {e}")))?;
    described
        .get()
        .check_answer(&data, call.count().map(u64::from))
        .map_err(|e| refused(format!("plugin answer does not fit the description: {e}")))?;
    Ok(answer)
}

/// Why an attempt failed, and whether it had reached the upstream.
struct AttemptError {
    error: ProviderError,
    after_a_request: bool,
}

/// One provider's attempt: its steps, each upstream request performed by
/// the host, all within the provider's timeout cut short by the deadline.
async fn attempt(
    provider: &Provider,
    call: &Arc<Call>,
    described: &DescribedEndpoint,
    client: &UpstreamClient,
    deadline: Deadline,
) -> Result<Answer, AttemptError> {
    let mut requests = 0;
    let steps = async {
        // The attempt begins and takes its first step in one plugin call.
        let (handle, begun) = (provider.handle.clone(), call.clone());
        let (mut attempt, mut next) = provider
            .runner
            .run(move || {
                let mut attempt = handle.begin(&begun);
                let next = attempt.advance(None);
                (attempt, next)
            })
            .await
            .map_err(not_run)?;
        for _ in 1..MAX_STEPS {
            let request = match next? {
                Advance::Done(answer) => return Ok(answer),
                Advance::Fetch(request) => request,
            };
            tracing::debug!(
                provider = %provider.name,
                url = %Redacted(&redact::url(request.url())),
                "upstream request"
            );
            let url = provider.origin.admit(request.method(), request.url())?;
            requests += 1;
            let fetched = client.fetch(url, &request, provider.max_body_bytes).await?;
            (attempt, next) = step(provider, attempt, fetched).await?;
        }
        match next? {
            Advance::Done(answer) => Ok(answer),
            Advance::Fetch(_) => Err(ProviderError::bad_response(format!(
                "no answer within {MAX_STEPS} steps"
            ))),
        }
    };
    let limit = deadline.bound(provider.timeout);
    let result = timeout(limit, steps)
        .await
        .unwrap_or_else(|_| {
            Err(ProviderError::new(
                ErrorKind::Transient,
                format!("no answer within {} ms", limit.as_millis()),
            ))
        })
        .and_then(|answer| described_answer(answer, described, call));
    result.map_err(|error| AttemptError {
        error,
        after_a_request: requests > 0,
    })
}

/// One plugin step with an upstream response, through the provider's
/// [`StepRunner`](crate::resilience::runaway::StepRunner): inline while
/// the plugin behaves.
async fn step(
    provider: &Provider,
    mut attempt: AttemptHandle,
    fetched: Fetched,
) -> Result<(AttemptHandle, Result<Advance, ProviderError>), ProviderError> {
    provider
        .runner
        .run(move || {
            let next = attempt.advance(Some(fetched.as_response()));
            (attempt, next)
        })
        .await
        .map_err(not_run)
}

/// A plugin call that did not run to its end.
fn not_run(error: NotRun) -> ProviderError {
    ProviderError::new(ErrorKind::Transient, error.to_string())
}
