//! The failover chain: asking providers in order until one answers.
//!
//! Any failure moves on to the next provider, except two answers that are
//! the same whoever gives them: "not found" (the user or post does not
//! exist; a search has nothing to be missing) and invalid input. A provider whose breaker is open is skipped
//! without an upstream call; when every provider of the chain is open, the
//! one whose cooldown ends first is tried anyway, so the chain never refuses
//! outright. Every attempt is bounded by its provider's timeout and by the
//! request's deadline; when the deadline passes the chain stops.

use std::sync::Arc;
use std::time::Duration;

use plugin_api::{Call, Done, ErrorKind, Next, ProviderError};
use tokio::time::{timeout, Instant};

use crate::resilience::breaker::{Outcome, Permit};
use crate::resilience::deadline::Deadline;
use crate::routing::Provider;
use crate::upstream::{Fetched, UpstreamClient};

/// Steps allowed in one attempt: a comment page of 200 takes 4, a first page
/// of posts 2. A plugin that loops is cut off.
pub const MAX_STEPS: usize = 16;

/// An answer and who gave it (for the log and the cursor, never the caller).
pub struct Served {
    pub done: Done,
    pub provider: Arc<Provider>,
}

/// What the chain did, in order: for the request's log line and metrics.
#[derive(Debug, Default)]
pub struct Journal {
    pub attempts: Vec<AttemptRecord>,
}

#[derive(Debug)]
pub struct AttemptRecord {
    pub provider: String,
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
            .map(|a| a.provider.as_str())
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum ChainError {
    /// A provider said the user or post does not exist.
    NotFound,
    /// A provider refused the input; the message is for the caller.
    InvalidInput(String),
    /// Every provider tried failed within the deadline.
    Exhausted,
    /// The request's deadline passed.
    DeadlineExceeded,
}

/// Asks `providers` in order, within `deadline`, noting each attempt in
/// `journal`.
pub async fn serve(
    providers: &[Arc<Provider>],
    call: &Call,
    client: &UpstreamClient,
    deadline: Deadline,
    journal: &mut Journal,
) -> Result<Served, ChainError> {
    let mut soonest_open: Option<(&Arc<Provider>, Instant)> = None;
    for provider in providers {
        match provider.breaker.try_acquire(Instant::now()) {
            Ok(permit) => {
                match attempt_through(provider, permit, call, client, deadline, journal).await {
                    Ok(done) => return Ok(served(done, provider)),
                    Err(Some(stop)) => return Err(stop),
                    Err(None) => {}
                }
            }
            Err(until) => {
                tracing::debug!(provider = %provider.name, "skipped: breaker open");
                if soonest_open.is_none_or(|(_, soonest)| until < soonest) {
                    soonest_open = Some((provider, until));
                }
            }
        }
    }
    if journal.attempts.is_empty() {
        if let Some((provider, _)) = soonest_open {
            let permit = provider.breaker.force_acquire();
            match attempt_through(provider, permit, call, client, deadline, journal).await {
                Ok(done) => return Ok(served(done, provider)),
                Err(Some(stop)) => return Err(stop),
                Err(None) => {}
            }
        }
    }
    if deadline.expired() {
        return Err(ChainError::DeadlineExceeded);
    }
    Err(ChainError::Exhausted)
}

fn served(done: Done, provider: &Arc<Provider>) -> Served {
    Served {
        done,
        provider: provider.clone(),
    }
}

/// One attempt under a breaker permit, its outcome recorded. `Err(None)`:
/// this provider failed, try the next; `Err(Some(_))`: the chain ends.
async fn attempt_through(
    provider: &Provider,
    permit: Permit<'_>,
    call: &Call,
    client: &UpstreamClient,
    deadline: Deadline,
    journal: &mut Journal,
) -> Result<Done, Option<ChainError>> {
    let started = Instant::now();
    let result = attempt(provider, call, client, deadline).await;
    let now = Instant::now();
    journal.attempts.push(AttemptRecord {
        provider: provider.name.clone(),
        outcome: match &result {
            Ok(_) => "ok",
            Err(e) => e.kind().as_str(),
        },
        elapsed: now - started,
    });
    let error = match result {
        Ok(done) => {
            provider.breaker.record(permit, Outcome::Success, now);
            return Ok(done);
        }
        Err(error) => error,
    };
    tracing::warn!(
        provider = %provider.name,
        endpoint = %call.endpoint(),
        kind = %error.kind(),
        "attempt failed: {}",
        error.message()
    );
    let stop = match error.kind() {
        // Both prove the upstream works: they close the breaker too. "Not
        // found" is only an answer where there is a resource to find; from
        // a search it is an upstream gone off its contract.
        ErrorKind::NotFound if call.endpoint().names_a_resource() => Some(ChainError::NotFound),
        ErrorKind::InvalidInput => Some(ChainError::InvalidInput(error.message().to_owned())),
        _ if deadline.expired() => {
            // Our deadline cut the attempt short, not the provider's own
            // timeout: no blame. An unreported probe reopens at once.
            drop(permit);
            return Err(Some(ChainError::DeadlineExceeded));
        }
        ErrorKind::RateLimited => {
            provider
                .breaker
                .record(permit, Outcome::RateLimited(error.retry_after_hint()), now);
            return Err(None);
        }
        _ => {
            provider.breaker.record(permit, Outcome::Failure, now);
            return Err(None);
        }
    };
    provider.breaker.record(permit, Outcome::Success, now);
    Err(stop)
}

/// One provider's attempt: its steps, each upstream request performed by
/// the host, all within the provider's timeout cut short by the deadline.
pub async fn attempt(
    provider: &Provider,
    call: &Call,
    client: &UpstreamClient,
    deadline: Deadline,
) -> Result<Done, ProviderError> {
    let steps = async {
        let mut attempt = provider.handle.begin(call);
        let mut last: Option<Fetched> = None;
        for _ in 0..MAX_STEPS {
            let response = last.as_ref().map(Fetched::as_response);
            match attempt.step(response)? {
                Next::Done(done) => return Ok(done),
                Next::Fetch(request) => {
                    tracing::debug!(provider = %provider.name, url = request.url(), "upstream request");
                    last = Some(client.fetch(&request, provider.max_body_bytes).await?);
                }
            }
        }
        Err(ProviderError::bad_response(format!(
            "no answer within {MAX_STEPS} steps"
        )))
    };
    let limit = deadline.bound(provider.timeout);
    timeout(limit, steps).await.unwrap_or_else(|_| {
        Err(ProviderError::new(
            ErrorKind::Transient,
            format!("no answer within {} ms", limit.as_millis()),
        ))
    })
}
