#![forbid(unsafe_code)]
//! `chaos`: a provider that misbehaves on purpose, so the end-to-end tests can
//! prove that a broken plugin costs one failed attempt and never the host.
//!
//! It serves every `shortvideo` endpoint and never makes a request. Its one
//! setting, `mode`, picks the fault:
//!
//! - `panic_in_step` (default): the attempt's first step panics.
//! - `panic_in_begin`: starting an attempt panics.
//! - `panic_on_setup`: `new()` panics, so the library fails to load.
//! - `fail_setup`: `new()` returns an error, so the library fails to load.

use plugin_api::{Attempt, Call, Endpoint, Manifest, Next, Provider, ProviderConfig};
use plugin_api::{ProviderError, UpstreamResponse};
use serde::Deserialize;

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Mode {
    #[default]
    PanicInStep,
    PanicInBegin,
    PanicOnSetup,
    FailSetup,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    mode: Mode,
}

pub struct Chaos {
    mode: Mode,
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
            mode => Ok(Chaos { mode }),
        }
    }

    fn begin(&self, call: Call) -> Box<dyn Attempt> {
        if self.mode == Mode::PanicInBegin {
            panic!(
                "chaos panics in begin({}) (mode panic_in_begin)",
                call.endpoint()
            );
        }
        Box::new(PanicInStep)
    }
}

struct PanicInStep;

impl Attempt for PanicInStep {
    fn step(&mut self, _: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        panic!("chaos panics in step() (mode panic_in_step)")
    }
}

plugin_api::export_provider!(Chaos);
