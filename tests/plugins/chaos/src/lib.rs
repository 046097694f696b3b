#![forbid(unsafe_code)]
//! `chaos`: a provider that misbehaves on purpose, so the end-to-end tests can
//! prove that a broken plugin costs one failed attempt and never the host.
//!
//! It serves every `shortvideo` endpoint and makes no request except in
//! `invalid_after_fetch`. Its one setting, `mode`, picks the fault:
//!
//! - `panic_in_step` (default): the attempt's first step panics.
//! - `panic_in_begin`: starting an attempt panics.
//! - `panic_on_setup`: `new()` panics, so the library fails to load.
//! - `fail_setup`: `new()` returns an error, so the library fails to load.
//! - `invalid_input`: the first step refuses the input (`username`), before
//!   any request: the caller's own error.
//! - `invalid_after_fetch`: the first step fetches `{base_url}/anything`,
//!   the second refuses the input: an upstream failure in disguise.
//! - `unsupported`: the first step says the call is unsupported.
//! - `hang_in_step`: the first step never returns (it sleeps in a loop, so
//!   a stuck plugin costs the test machine a thread but no CPU).
//! - `fetch_target`: the first step fetches the setting `target`, a URL
//!   anywhere (as a plugin following an upstream-supplied link would), the
//!   second refuses the input.

use plugin_api::{Attempt, Call, Endpoint, ErrorKind, Manifest, Next, Provider, ProviderConfig};
use plugin_api::{ProviderError, UpstreamRequest, UpstreamResponse};
use serde::Deserialize;

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Mode {
    #[default]
    PanicInStep,
    PanicInBegin,
    PanicOnSetup,
    FailSetup,
    InvalidInput,
    InvalidAfterFetch,
    Unsupported,
    HangInStep,
    FetchTarget,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    mode: Mode,
    /// The URL `fetch_target` fetches.
    target: Option<String>,
}

pub struct Chaos {
    mode: Mode,
    base_url: String,
    target: String,
}

impl Provider for Chaos {
    fn manifest() -> Manifest {
        Manifest {
            name: "chaos".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            platform: "shortvideo".into(),
            endpoints: Endpoint::ALL.to_vec(),
        }
    }

    fn new(config: ProviderConfig) -> Result<Self, String> {
        let settings: Settings = config.settings()?;
        match settings.mode {
            Mode::PanicOnSetup => panic!("chaos panics in new() (mode panic_on_setup)"),
            Mode::FailSetup => Err("chaos refuses to set up (mode fail_setup)".into()),
            mode => Ok(Chaos {
                mode,
                target: settings.target.unwrap_or_else(|| config.base_url.clone()),
                base_url: config.base_url,
            }),
        }
    }

    fn begin(&self, call: Call) -> Box<dyn Attempt> {
        if self.mode == Mode::PanicInBegin {
            panic!(
                "chaos panics in begin({}) (mode panic_in_begin)",
                call.endpoint()
            );
        }
        match self.mode {
            Mode::InvalidInput => Box::new(Refuses { fetch: None }),
            Mode::InvalidAfterFetch => Box::new(Refuses {
                fetch: Some(UpstreamRequest::get(&self.base_url, "/anything")),
            }),
            Mode::FetchTarget => Box::new(Refuses {
                fetch: Some(UpstreamRequest::get(&self.target, "")),
            }),
            Mode::Unsupported => Box::new(Unsupported),
            Mode::HangInStep => Box::new(HangInStep),
            _ => Box::new(PanicInStep),
        }
    }
}

/// The parameter a refusal names.
const REFUSED_PARAMETER: &str = "username";

/// Refuses the input: at once, or after one upstream request.
struct Refuses {
    fetch: Option<UpstreamRequest>,
}

impl Attempt for Refuses {
    fn step(&mut self, _: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        match self.fetch.take() {
            Some(request) => Ok(Next::Fetch(request)),
            None => Err(ProviderError::invalid_input(
                REFUSED_PARAMETER,
                "is not allowed on this platform",
            )),
        }
    }
}

struct Unsupported;

impl Attempt for Unsupported {
    fn step(&mut self, _: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        Err(ProviderError::new(
            ErrorKind::Unsupported,
            "chaos supports nothing (mode unsupported)",
        ))
    }
}

struct PanicInStep;

impl Attempt for PanicInStep {
    fn step(&mut self, _: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        panic!("chaos panics in step() (mode panic_in_step)")
    }
}

struct HangInStep;

impl Attempt for HangInStep {
    fn step(&mut self, _: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

plugin_api::export_provider!(Chaos);

#[cfg(test)]
mod tests;
