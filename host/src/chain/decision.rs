//! The failover verdict: what a failed attempt means for the chain and for
//! the provider's breaker. A pure function of what happened, with a table
//! test beside it; [`super::serve`] only applies it.
//!
//! The rules:
//!
//! - "Not found" where there is a resource to find (a user, a post) is an
//!   answer, the same whoever gives it: the chain stops, and it proves the
//!   upstream works (a success for the breaker). From a search it is an
//!   upstream gone off its contract: a failure like any other.
//! - "Invalid input" is the plugin's to find before it asks anything: then
//!   it is the caller's 400 and says nothing of the provider's health.
//!   After a request it is an upstream failure in disguise.
//! - "Unsupported" before any request is about the call, not the provider:
//!   the next provider is asked, and the breaker learns nothing.
//! - "Undecided" (the upstream answered, but cannot say; a bare 404, say)
//!   asks the next provider, before or after a request, and the breaker
//!   learns nothing: the plugin vouches that the upstream is not at fault.
//! - A 429 opens the breaker at once (for its `Retry-After`); every other
//!   failure counts towards opening it, including one cut short by the
//!   request's deadline: a provider that cannot answer within the time a
//!   request has is of no use to it.
//! - Whatever would move on to the next provider stops instead once the
//!   request's deadline has passed.

use std::time::Duration;

use plugin_api::{Endpoint, ErrorKind};

use crate::resilience::breaker::Outcome;

/// What the chain does after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Ask the next provider.
    TryNext,
    /// The user or post does not exist.
    StopNotFound,
    /// The caller's input is invalid; the plugin's message is for them.
    StopInvalidInput,
    /// The request's deadline passed.
    StopDeadline,
}

/// The verdict on one failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// What the provider's breaker records.
    pub breaker: Outcome,
    pub then: Then,
}

/// A failed attempt, as the verdict needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub kind: ErrorKind,
    /// The upstream's `Retry-After`, for a rate limit.
    pub retry_after: Option<Duration>,
    /// Whether the attempt had made an upstream request.
    pub after_a_request: bool,
}

/// The verdict on `failure` of an attempt for `endpoint`.
pub fn decide(failure: Failure, endpoint: Endpoint, deadline_expired: bool) -> Decision {
    let Failure {
        kind,
        retry_after,
        after_a_request,
    } = failure;
    let (breaker, then) = match kind {
        ErrorKind::NotFound if endpoint.names_a_resource() => {
            return Decision {
                breaker: Outcome::Success,
                then: Then::StopNotFound,
            }
        }
        ErrorKind::InvalidInput if !after_a_request => {
            return Decision {
                breaker: Outcome::Neutral,
                then: Then::StopInvalidInput,
            }
        }
        ErrorKind::Unsupported if !after_a_request => (Outcome::Neutral, Then::TryNext),
        ErrorKind::Undecided => (Outcome::Neutral, Then::TryNext),
        ErrorKind::RateLimited => (Outcome::RateLimited(retry_after), Then::TryNext),
        _ => (Outcome::Failure, Then::TryNext),
    };
    let then = if deadline_expired {
        Then::StopDeadline
    } else {
        then
    };
    Decision { breaker, then }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorKind::*;
    use Then::*;

    const WAIT: Option<Duration> = Some(Duration::from_secs(60));

    #[test]
    fn the_verdict_table() {
        // (kind, after a request, endpoint, deadline expired) => (breaker, then)
        #[rustfmt::skip]
        let table = [
            (NotFound,     true,  Endpoint::Profile, false, Outcome::Success,  StopNotFound),
            (NotFound,     true,  Endpoint::Post,    true,  Outcome::Success,  StopNotFound),
            (NotFound,     false, Endpoint::Comments,false, Outcome::Success,  StopNotFound),
            (NotFound,     true,  Endpoint::Search,  false, Outcome::Failure,  TryNext),
            (NotFound,     true,  Endpoint::Search,  true,  Outcome::Failure,  StopDeadline),
            (InvalidInput, false, Endpoint::Profile, false, Outcome::Neutral,  StopInvalidInput),
            (InvalidInput, false, Endpoint::Profile, true,  Outcome::Neutral,  StopInvalidInput),
            (InvalidInput, true,  Endpoint::Profile, false, Outcome::Failure,  TryNext),
            (Unsupported,  false, Endpoint::Posts,   false, Outcome::Neutral,  TryNext),
            (Unsupported,  false, Endpoint::Posts,   true,  Outcome::Neutral,  StopDeadline),
            (Unsupported,  true,  Endpoint::Posts,   false, Outcome::Failure,  TryNext),
            (RateLimited,  true,  Endpoint::Profile, false, Outcome::RateLimited(WAIT), TryNext),
            (RateLimited,  true,  Endpoint::Profile, true,  Outcome::RateLimited(WAIT), StopDeadline),
            (Transient,    true,  Endpoint::Profile, false, Outcome::Failure,  TryNext),
            (Transient,    false, Endpoint::Profile, true,  Outcome::Failure,  StopDeadline),
            (KeyRejected,  true,  Endpoint::Comments,false, Outcome::Failure,  TryNext),
            (BadResponse,  true,  Endpoint::Search,  false, Outcome::Failure,  TryNext),
            (Panicked,     false, Endpoint::Post,    false, Outcome::Failure,  TryNext),
            (Undecided,    true,  Endpoint::Profile, false, Outcome::Neutral,  TryNext),
            (Undecided,    false, Endpoint::Search,  false, Outcome::Neutral,  TryNext),
            (Undecided,    true,  Endpoint::Post,    true,  Outcome::Neutral,  StopDeadline),
        ];
        for (kind, after_a_request, endpoint, expired, breaker, then) in table {
            let failure = Failure {
                kind,
                retry_after: WAIT,
                after_a_request,
            };
            assert_eq!(
                decide(failure, endpoint, expired),
                Decision { breaker, then },
                "{kind:?} after a request: {after_a_request}, {endpoint:?}, expired: {expired}"
            );
        }
    }
}
