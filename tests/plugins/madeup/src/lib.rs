#![forbid(unsafe_code)]
//! `madeup`: a provider for a platform that does not exist, so the hot-reload
//! tests can prove that a platform no build of the host knows about goes live
//! on a running server from a new plugin library and a config change alone.
//!
//! It serves `profile` only, with one upstream call:
//! `GET {base_url}/users/{username}` with `Authorization: Bearer <key>`,
//! answered `{"handle": .., "name": .., "fans": ..}`. A body
//! `{"error": "not found"}` (with HTTP 200 or 404) means the user does not
//! exist; a bare 404 cannot say (a wrong `base_url` answers it too), so it
//! asks the next provider without counting against the breaker. It has no
//! settings.

use plugin_api::{attempt, json, Attempt, Call, Done, Endpoint, ErrorKind, Manifest, Output};
use plugin_api::{Profile, Provider, ProviderConfig, ProviderError, UpstreamRequest};
use serde::Deserialize;

pub struct Madeup {
    config: ProviderConfig,
}

/// What the upstream answers: a user, or an error.
#[derive(Deserialize)]
#[serde(untagged)]
enum Reply {
    User {
        handle: String,
        name: String,
        fans: json::Count,
    },
    Error {
        error: String,
    },
}

impl Provider for Madeup {
    fn manifest() -> Manifest {
        Manifest {
            name: "madeup".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            platform: "madeup".into(),
            endpoints: vec![Endpoint::Profile],
        }
    }

    fn new(config: ProviderConfig) -> Result<Self, String> {
        Ok(Madeup { config })
    }

    fn begin(&self, call: Call) -> Box<dyn Attempt> {
        let Call::Profile { username } = call else {
            return attempt::fail(ProviderError::new(ErrorKind::Unsupported, "profile only"));
        };
        attempt::start(|| {
            let request = UpstreamRequest::get(&self.config.base_url, "/users")
                .segment(&username)?
                .bearer(&self.config.api_key);
            Ok(attempt::single(request, read))
        })
    }
}

/// Reads the upstream's answer to `GET /users/{username}`.
fn read(response: plugin_api::UpstreamResponse<'_>) -> Result<Done, ProviderError> {
    // A 404 counts as "not found" only with the error body: a bare
    // 404 may be a wrong `base_url`, which the next provider should try.
    let reply = match response.status {
        404 => match serde_json::from_slice(response.body) {
            Ok(reply) => reply,
            Err(_) => return Err(ProviderError::undecided("a bare HTTP 404")),
        },
        _ => response.json::<Reply>()?,
    };
    match reply {
        Reply::Error { error } if error == "not found" => Err(ProviderError::not_found("user")),
        // The upstream's own words stay out of our logs.
        Reply::Error { .. } => Err(ProviderError::bad_response("upstream error")),
        Reply::User { handle, name, fans } => Ok(Done::last(Output::Profile(Profile {
            username: handle,
            display_name: name,
            followers: fans.0,
            verified: false,
            id: None,
            bio: None,
            following: None,
            likes: None,
            videos: None,
            avatar_url: None,
        }))),
    }
}

plugin_api::export_provider!(Madeup);

#[cfg(test)]
mod tests;
