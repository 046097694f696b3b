#![forbid(unsafe_code)]
//! `leaky`: a provider that looks right and is not, so the tests can prove
//! that the conformance suite (`plugin_api::testing::conformance`) catches
//! a plugin that passes its own happy-path test.
//!
//! It serves `profile` from `GET {base_url}/users/{username}` with
//! `Authorization: Bearer <key>`, like `madeup`, with one mistake a hurried
//! author makes: when the upstream refuses, its error message quotes the
//! request, key included. Its tests show the suite failing with the rule's
//! name, `no-key-in-errors`.

use plugin_api::{attempt, json, Attempt, Call, Done, Endpoint, ErrorKind, Manifest, Output};
use plugin_api::{Profile, Provider, ProviderConfig, ProviderError, UpstreamRequest};
use serde::Deserialize;

pub struct Leaky {
    config: ProviderConfig,
}

#[derive(Deserialize)]
struct User {
    handle: String,
    fans: json::Count,
}

impl Provider for Leaky {
    fn manifest() -> Manifest {
        Manifest {
            name: "leaky".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            platform: "leaky".into(),
            endpoints: vec![Endpoint::Profile],
        }
    }

    fn new(config: ProviderConfig) -> Result<Self, String> {
        Ok(Leaky { config })
    }

    fn begin(&self, call: Call) -> Box<dyn Attempt> {
        let Call::Profile { username } = call else {
            return attempt::fail(ProviderError::new(ErrorKind::Unsupported, "profile only"));
        };
        let key = self.config.api_key.clone();
        attempt::start(|| {
            let request = UpstreamRequest::get(&self.config.base_url, "/users")
                .segment(&username)?
                .bearer(&key);
            Ok(attempt::single(request, move |response| {
                if matches!(response.status, 401 | 403) {
                    // The mistake: the key goes into a message the host logs.
                    return Err(ProviderError::new(
                        ErrorKind::KeyRejected,
                        format!("upstream refused Bearer {key}"),
                    ));
                }
                let user: User = response.json()?;
                Ok(Done::last(Output::Profile(Profile {
                    username: user.handle,
                    display_name: String::new(),
                    followers: user.fans.0,
                    verified: false,
                    id: None,
                    bio: None,
                    following: None,
                    likes: None,
                    videos: None,
                    avatar_url: None,
                })))
            }))
        })
    }
}

plugin_api::export_provider!(Leaky);

#[cfg(test)]
mod tests {
    use plugin_api::testing::conformance::{Case, Rule};
    use plugin_api::testing::{sample, Kit, Reply, Upstream};
    use plugin_api::Endpoint;

    use super::Leaky;

    #[test]
    fn its_own_happy_path_passes_but_the_suite_names_the_broken_rule() {
        let kit = Kit::new::<Leaky>(serde_json::json!({})).unwrap();
        let user = Upstream::replies([Reply::ok(r#"{"handle": "zed", "fans": 3}"#)]);
        let run = kit.run(&sample(Endpoint::Profile), &user);
        assert!(run.outcome.is_ok(), "{:?}", run.outcome);

        let report = kit
            .conformance()
            .case(Case::new(sample(Endpoint::Profile), user))
            .run();
        assert!(report.violates(Rule::NoKeyInErrors), "{report}");
        let message = std::panic::catch_unwind(|| report.assert_passes())
            .expect_err("the suite must fail")
            .downcast::<String>()
            .expect("a formatted message");
        assert!(
            message.contains("rule `no-key-in-errors` broken: profile (the key echoed, HTTP 401)"),
            "{message}"
        );
        // The report itself never shows the key.
        assert!(!message.contains(plugin_api::testing::KEY), "{message}");
    }
}
