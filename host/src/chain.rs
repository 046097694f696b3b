//! The failover chain: asking providers in order until one answers.
//!
//! Any failure moves on to the next provider, except two answers that are
//! the same whoever gives them: "not found" (the user or post does not
//! exist) and invalid input. A continued listing (a cursor) goes only to the
//! provider that issued it, since upstream cursors do not transfer.

use std::sync::Arc;

use plugin_api::{Call, Done, ErrorKind, Next, ProviderError};
use tokio::time::timeout;

use crate::routing::Provider;
use crate::upstream::UpstreamClient;

/// Steps allowed in one attempt: a comment page of 200 takes 4, a first page
/// of posts 2. A plugin that loops is cut off.
pub const MAX_STEPS: usize = 16;

/// An answer and who gave it (for the log and the cursor, never the caller).
pub struct Served {
    pub done: Done,
    pub provider: Arc<Provider>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ChainError {
    /// A provider said the user or post does not exist.
    NotFound,
    /// A provider refused the input; the message is for the caller.
    InvalidInput(String),
    /// Every provider tried failed.
    Exhausted,
}

/// Asks `providers` in order.
pub async fn serve(
    providers: impl IntoIterator<Item = &Arc<Provider>>,
    call: &Call,
    client: &UpstreamClient,
) -> Result<Served, ChainError> {
    for provider in providers {
        match attempt(provider, call, client).await {
            Ok(done) => {
                return Ok(Served {
                    done,
                    provider: provider.clone(),
                })
            }
            Err(error) => {
                tracing::warn!(
                    provider = %provider.name,
                    endpoint = %call.endpoint(),
                    kind = %error.kind(),
                    "attempt failed: {}",
                    error.message()
                );
                match error.kind() {
                    ErrorKind::NotFound => return Err(ChainError::NotFound),
                    ErrorKind::InvalidInput => {
                        return Err(ChainError::InvalidInput(error.message().to_owned()))
                    }
                    _ => continue,
                }
            }
        }
    }
    Err(ChainError::Exhausted)
}

/// One provider's attempt: its steps, each upstream request performed by
/// the host, all within the provider's timeout.
pub async fn attempt(
    provider: &Provider,
    call: &Call,
    client: &UpstreamClient,
) -> Result<Done, ProviderError> {
    let steps = async {
        let mut attempt = provider.handle.begin(call);
        let mut last = None;
        for _ in 0..MAX_STEPS {
            let response = last.as_ref().map(crate::upstream::Fetched::as_response);
            match attempt.step(response)? {
                Next::Done(done) => return Ok(done),
                Next::Fetch(request) => {
                    tracing::debug!(provider = %provider.name, url = request.url(), "upstream request");
                    last = Some(client.fetch(&request).await?);
                }
            }
        }
        Err(ProviderError::bad_response(format!(
            "no answer within {MAX_STEPS} steps"
        )))
    };
    timeout(provider.timeout, steps).await.unwrap_or_else(|_| {
        Err(ProviderError::new(
            ErrorKind::Transient,
            format!("no answer within {} ms", provider.timeout.as_millis()),
        ))
    })
}
